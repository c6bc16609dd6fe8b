"""Normalisations: BatchNormalization (inference), LayerNormalization, InstanceNormalization, LRN;
all accumulate half precision in float32."""

from __future__ import annotations

import numpy as np

from graphopt.runtime.onnx_ops.layout_order import in_input_order
from graphopt.runtime.onnx_ops.registry import for_accumulation, op
from graphopt.runtime.onnx_ops.windows import pad_constant


@op("BatchNormalization")
def _bn(ctx, ins):
    x, scale, bias, mean, var = ins[:5]
    if ctx.attr("training_mode", 0):
        raise NotImplementedError("BatchNormalization training_mode=1 is not supported; this is an inference runtime")
    eps = ctx.attr("epsilon", 1e-5)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xa = for_accumulation(ctx, x)
    inv = (1.0 / ctx.xp.sqrt(for_accumulation(ctx, var) + eps)) * for_accumulation(ctx, scale)
    dtype = x.dtype

    def normalize(ctx, ins):
        xa, mean, inv, bias = ins
        return [((xa - mean) * inv + bias).astype(dtype, copy=False)]

    # in x's memory order: a channels-last x stays channels-last (graphopt.runtime.onnx_ops.layout_order)
    return in_input_order(normalize)(ctx, [xa, for_accumulation(ctx, mean).reshape(shape), inv.reshape(shape),
                                           for_accumulation(ctx, bias).reshape(shape)])


@op("LRN")
def _lrn(ctx, ins):
    xp = ctx.xp
    x = ins[0]
    xa = for_accumulation(ctx, x)
    size = ctx.attr("size")
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    sq = xa * xa
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    pw = [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2)
    sqp = pad_constant(xp, sq, pw)
    C = x.shape[1]
    s = sqp[:, 0:C]
    for i in range(1, size):
        s = s + sqp[:, i : i + C]
    return [(xa / (bias + (alpha / size) * s) ** beta).astype(x.dtype, copy=False)]


@op("LayerNormalization")
def _layernorm(ctx, ins):
    xp = ctx.xp
    x, scale = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    axis = ctx.attr("axis", -1) % x.ndim
    eps = ctx.attr("epsilon", 1e-5)
    axes = tuple(range(axis, x.ndim))
    xa = for_accumulation(ctx, x)
    mu = xa.mean(axis=axes, keepdims=True)
    d = xa - mu
    var = (d * d).mean(axis=axes, keepdims=True)
    inv = 1.0 / xp.sqrt(var + eps)
    y = d * inv * for_accumulation(ctx, scale)
    if b is not None:
        y = y + for_accumulation(ctx, b)
    return [y.astype(x.dtype), mu.astype(np.float32), inv.astype(np.float32)]


@op("InstanceNormalization")
def _instnorm(ctx, ins):
    x, scale, bias = ins
    xp = ctx.xp
    eps = ctx.attr("epsilon", 1e-5)
    axes = tuple(range(2, x.ndim))
    xa = for_accumulation(ctx, x)
    mu = xa.mean(axis=axes, keepdims=True)
    d = xa - mu
    var = (d * d).mean(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (d / xp.sqrt(var + eps) * for_accumulation(ctx, scale).reshape(shape)
         + for_accumulation(ctx, bias).reshape(shape))
    return [y.astype(x.dtype)]
