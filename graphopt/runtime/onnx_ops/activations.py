"""Activation ops with attributes or a second input: Clip, LeakyRelu, HardSigmoid, HardSwish, Gelu,
Elu, Selu, PRelu (the attribute-free ones, Relu, Sigmoid, Tanh, Softplus..., are in ``elementwise``)."""

from __future__ import annotations

import math

from graphopt.runtime.onnx_ops.elementwise import erf
from graphopt.runtime.onnx_ops.registry import op


@op("Clip", host=(1, 2))
def _clip(ctx, ins):
    x = ins[0]
    if ctx.opset < 11:
        lo, hi = ctx.attr("min", None), ctx.attr("max", None)
    else:
        lo = ctx.host(1)
        hi = ctx.host(2)
        lo = None if lo is None else lo.item()
        hi = None if hi is None else hi.item()
    if lo is None and hi is None:
        return [x]
    return [ctx.xp.clip(x, lo, hi).astype(x.dtype, copy=False)]


@op("LeakyRelu")
def _leaky(ctx, ins):
    x = ins[0]
    a = ctx.attr("alpha", 0.01)
    return [ctx.xp.where(x >= 0, x, x * x.dtype.type(a))]


@op("HardSigmoid")
def _hsig(ctx, ins):
    x = ins[0]
    a, b = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return [ctx.xp.clip(x * x.dtype.type(a) + x.dtype.type(b), 0, 1).astype(x.dtype, copy=False)]


@op("HardSwish")
def _hswish(ctx, ins):
    x = ins[0]
    return [(x * ctx.xp.clip(x / x.dtype.type(6) + x.dtype.type(0.5), 0, 1)).astype(x.dtype, copy=False)]


@op("Gelu")
def _gelu(ctx, ins):
    x = ins[0]
    xp = ctx.xp
    if ctx.attr("approximate", "none") == "tanh":
        c = math.sqrt(2 / math.pi)
        return [(0.5 * x * (1 + xp.tanh(c * (x + 0.044715 * x**3)))).astype(x.dtype, copy=False)]
    return [(0.5 * x * (1 + erf(ctx, [x / x.dtype.type(math.sqrt(2))])[0])).astype(x.dtype, copy=False)]


@op("Elu")
def _elu(ctx, ins):
    x = ins[0]
    a = x.dtype.type(ctx.attr("alpha", 1.0))
    return [ctx.xp.where(x >= 0, x, a * (ctx.xp.exp(x) - 1)).astype(x.dtype, copy=False)]


@op("Selu")
def _selu(ctx, ins):
    x = ins[0]
    a = x.dtype.type(ctx.attr("alpha", 1.67326319217681884765625))
    g = x.dtype.type(ctx.attr("gamma", 1.05070102214813232421875))
    return [(g * ctx.xp.where(x > 0, x, a * (ctx.xp.exp(x) - 1))).astype(x.dtype, copy=False)]


@op("PRelu")
def _prelu(ctx, ins):
    x, slope = ins
    return [ctx.xp.where(x >= 0, x, x * slope).astype(x.dtype, copy=False)]
