"""Ops that make tensors from attributes or plan-time values: Constant, ConstantOfShape, Range."""

from __future__ import annotations

import numpy as np

from graphopt.runtime.onnx_ops.registry import host_ints, op


@op("ConstantOfShape", host=(0,))
def _cos(ctx, ins):
    shape = host_ints(ctx.host(0))
    v = ctx.attr("value", None)
    val = np.zeros(1, dtype=np.float32) if v is None else np.asarray(v).reshape(-1)
    dtype = val.dtype
    if ctx.compute_dtype is not None and dtype == np.float32:
        dtype = np.dtype(ctx.compute_dtype)
    return [ctx.xp.full(shape, val[0], dtype=dtype)]


@op("Range", host=(0, 1, 2))
def _range(ctx, ins):
    s, l, d = (ctx.host(i) for i in range(3))
    return [ctx.xp.arange(s.item(), l.item(), d.item()).astype(s.dtype)]


@op("Constant")
def _constant(ctx, ins):
    node = ctx.node
    for name in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if node.has_attr(name):
            v = node.attr(name)
            if name.startswith("value_float"):
                return [np.asarray(v, dtype=np.float32)]
            if name.startswith("value_int"):
                return [np.asarray(v, dtype=np.int64)]
            return [np.asarray(v)]
    raise NotImplementedError("Constant with a sparse or string value")
