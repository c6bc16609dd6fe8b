"""Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool. The backend's pooling kernel
(``ctx.pool``) runs what it supports (``pool_kernel_args``); anything else reduces window slices."""

from __future__ import annotations

import numpy as np

from graphopt.runtime.onnx_ops.registry import OPS, for_accumulation, op
from graphopt.runtime.onnx_ops.windows import conv_geometry, pad_constant, window_slices

POOL_OPS = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")


def pool_kernel_args(ctx, x, op: str):
    """(kind, kernel, strides, dilations, pads, output sizes) of pooling node ``op`` (one of
    ``POOL_OPS``) on ``x`` for the backend's pooling kernel, or None when that kernel does not take it
    (the window-slice path)."""
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        sp = [int(d) for d in x.shape[2:]]
        if ctx.pool is None or not ctx.pool.supports(x, sp):
            return None
        return ("avg" if op == "GlobalAveragePool" else "max", sp, [1] * len(sp), [1] * len(sp), [0] * 2 * len(sp),
                [1] * len(sp))
    kernel = list(ctx.attr("kernel_shape"))
    if ctx.pool is None or not ctx.pool.supports(x, kernel):
        return None
    if op == "MaxPool" and (ctx.attr("storage_order", 0) or len(ctx.node.outputs) > 1 and ctx.node.outputs[1]):
        return None
    strides, dil, pads, outs = conv_geometry(ctx, list(x.shape[2:]), kernel)
    kind = "max" if op == "MaxPool" else ("avg_pad" if ctx.attr("count_include_pad", 0) else "avg")
    return kind, kernel, strides, dil, pads, outs


def _pool(ctx, x, kind):
    xp = ctx.xp
    kernel = list(ctx.attr("kernel_shape"))
    nd = len(kernel)
    strides, dil, pads, outs = conv_geometry(ctx, list(x.shape[2:]), kernel)
    args = pool_kernel_args(ctx, x, "MaxPool" if kind == "max" else "AveragePool")
    if args is not None:
        return ctx.pool.pool2d(xp, x, *args)
    if kind == "max":
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        sl = window_slices(xp, x, kernel, strides, dil, pads, outs, fill)
        y = sl[0]
        for s in sl[1:]:
            y = xp.maximum(y, s)
        return y
    xa = for_accumulation(ctx, x)
    sl = window_slices(xp, xa, kernel, strides, dil, pads, outs, 0)
    y = sl[0]
    for s in sl[1:]:
        y = y + s
    # the divisor per output: cells inside the input, plus explicit pads with count_include_pad,
    # never the ceil-mode overhang
    ones = xp.ones((1, 1) + tuple(x.shape[2:]), dtype=xa.dtype)
    pw = [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)]
    ones = pad_constant(xp, ones, pw, 1 if ctx.attr("count_include_pad", 0) else 0)
    cnt = window_slices(xp, ones, kernel, strides, dil, [0] * (2 * nd), outs, 0)
    c = cnt[0]
    for s in cnt[1:]:
        c = c + s
    return (y / c).astype(x.dtype)


@op("MaxPool")
def _maxpool(ctx, ins):
    if ctx.attr("storage_order", 0) or len(ctx.node.outputs) > 1 and ctx.node.outputs[1]:
        raise NotImplementedError("MaxPool's Indices output (and storage_order) is not supported")
    return [_pool(ctx, ins[0], "max")]


@op("AveragePool")
def _avgpool(ctx, ins):
    return [_pool(ctx, ins[0], "avg")]


def _global_pool(op_type, reduce):
    """A global pooling op: the backend's pooling kernel when it takes ``x``, else ``reduce(ctx, x, axes)``
    over every spatial axis."""

    def run(ctx, ins):
        x = ins[0]
        args = pool_kernel_args(ctx, x, op_type)
        if args is not None:
            return [ctx.pool.pool2d(ctx.xp, x, *args)]
        return [reduce(ctx, x, tuple(range(2, x.ndim)))]

    return run


OPS["GlobalAveragePool"] = _global_pool(
    "GlobalAveragePool", lambda ctx, x, axes: for_accumulation(ctx, x).mean(axis=axes, keepdims=True).astype(x.dtype))
OPS["GlobalMaxPool"] = _global_pool("GlobalMaxPool", lambda ctx, x, axes: x.max(axis=axes, keepdims=True))
