"""Elementwise ONNX ops: unary math, binary arithmetic and comparisons, variadic Sum/Max/Min/Mean,
Div, Pow, Mod, Erf, Where, Cast, IsInf and (inference) Dropout."""

from __future__ import annotations

import math

import numpy as np
import onnx

from graphopt.runtime.onnx_ops.registry import OPS, op

_UNARY = {
    "Relu": lambda xp, x: xp.maximum(x, x.dtype.type(0)),
    "Sigmoid": lambda xp, x: (1 / (1 + xp.exp(-x))).astype(x.dtype, copy=False),
    "Tanh": lambda xp, x: xp.tanh(x),
    "Sqrt": lambda xp, x: xp.sqrt(x),
    "Exp": lambda xp, x: xp.exp(x),
    "Log": lambda xp, x: xp.log(x),
    "Abs": lambda xp, x: xp.abs(x),
    "Neg": lambda xp, x: -x,
    "Reciprocal": lambda xp, x: (1 / x).astype(x.dtype, copy=False),
    "Floor": lambda xp, x: xp.floor(x),
    "Ceil": lambda xp, x: xp.ceil(x),
    "IsNaN": lambda xp, x: xp.isnan(x),
    "Not": lambda xp, x: xp.logical_not(x),
    "Identity": lambda xp, x: x,
    "Sin": lambda xp, x: xp.sin(x),
    "Cos": lambda xp, x: xp.cos(x),
    "Sign": lambda xp, x: xp.sign(x),
    "Round": lambda xp, x: xp.round(x),  # round half to even, as ONNX
    "Tan": lambda xp, x: xp.tan(x),
    "Asin": lambda xp, x: xp.arcsin(x),
    "Acos": lambda xp, x: xp.arccos(x),
    "Atan": lambda xp, x: xp.arctan(x),
    "Sinh": lambda xp, x: xp.sinh(x),
    "Cosh": lambda xp, x: xp.cosh(x),
    "Softsign": lambda xp, x: (x / (1 + xp.abs(x))).astype(x.dtype, copy=False),
    "Softplus": lambda xp, x: xp.logaddexp(x, x.dtype.type(0)).astype(x.dtype, copy=False),
}
for _name, _f in _UNARY.items():
    OPS[_name] = (lambda f: lambda ctx, ins: [f(ctx.xp, ins[0])])(_f)

_BINARY = {
    "Add": lambda xp, a, b: a + b,
    "Sub": lambda xp, a, b: a - b,
    "Mul": lambda xp, a, b: a * b,
    "Equal": lambda xp, a, b: a == b,
    "Less": lambda xp, a, b: a < b,
    "Greater": lambda xp, a, b: a > b,
    "LessOrEqual": lambda xp, a, b: a <= b,
    "GreaterOrEqual": lambda xp, a, b: a >= b,
    "And": lambda xp, a, b: xp.logical_and(a, b),
    "Or": lambda xp, a, b: xp.logical_or(a, b),
    "Xor": lambda xp, a, b: xp.logical_xor(a, b),
}


def _binary(f):
    def run(ctx, ins):
        a, b = ins
        out = f(ctx.xp, a, b)
        # ONNX requires equal input types; keep the first operand's dtype (NumPy would promote scalars)
        if out.dtype != np.bool_ and out.dtype != a.dtype:
            out = out.astype(a.dtype)
        return [out]

    return run


for _name, _f in _BINARY.items():
    OPS[_name] = _binary(_f)


@op("Div")
def _div(ctx, ins):
    a, b = ins
    if a.dtype.kind in "iu":
        return [ctx.xp.trunc(a / b).astype(a.dtype, copy=False)]  # ONNX integer Div truncates toward zero
    return [(a / b).astype(a.dtype, copy=False)]


@op("Pow")
def _pow(ctx, ins):
    a, b = ins
    return [ctx.xp.power(a, b.astype(a.dtype)).astype(a.dtype, copy=False)]


@op("Erf")
def erf(ctx, ins):
    x = ins[0]
    if ctx.xp is np:
        # NumPy has no erf and SciPy is not a dependency; math.erf is exact (host backend is for testing)
        return [np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype, copy=False)]
    import cupyx.scipy.special as sp

    return [sp.erf(x)]


@op("Where")
def _where(ctx, ins):
    c, a, b = ins
    return [ctx.xp.where(c, a, b).astype(a.dtype, copy=False)]


def _variadic(f):
    def run(ctx, ins):
        out = ins[0]
        for x in ins[1:]:
            out = f(ctx.xp, out, x)
        return [out.astype(ins[0].dtype, copy=False) if len(ins) > 1 else out]

    return run


OPS["Sum"] = _variadic(lambda xp, a, b: a + b)
OPS["Max"] = _variadic(lambda xp, a, b: xp.maximum(a, b))
OPS["Min"] = _variadic(lambda xp, a, b: xp.minimum(a, b))
OPS["Mean"] = lambda ctx, ins: [(_variadic(lambda xp, a, b: a + b)(ctx, ins)[0] / len(ins)).astype(ins[0].dtype, copy=False)]


@op("Cast")
def _cast(ctx, ins):
    to = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ctx.attr("to")))
    if ctx.compute_dtype is not None and to == np.float32:
        to = np.dtype(ctx.compute_dtype)  # fp16 execution: float tensors stay fp16 inside the graph
    return [ins[0].astype(to)]


@op("Dropout", host=(1, 2))
def _dropout(ctx, ins):
    x = ins[0]
    training = ctx.host(2)
    if (training is not None and bool(np.asarray(training).reshape(-1)[0])) or ctx.attr("is_test", 1) == 0 and ctx.opset < 7:
        raise NotImplementedError("Dropout in training mode (a random mask) is not supported; this is an inference runtime")
    return [x, ctx.xp.ones(x.shape, dtype=bool)]


@op("IsInf")
def _isinf(ctx, ins):
    x = ins[0]
    xp = ctx.xp
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    if pos and neg:
        return [xp.isinf(x)]
    if pos:
        return [xp.isposinf(x)]
    if neg:
        return [xp.isneginf(x)]
    return [xp.zeros(x.shape, dtype=bool)]


@op("Mod")
def _mod(ctx, ins):
    a, b = ins
    xp = ctx.xp
    if ctx.attr("fmod", 0):
        return [xp.fmod(a, b).astype(a.dtype, copy=False)]
    if a.dtype.kind == "f":
        return [_float_mod(xp, a, b).astype(a.dtype, copy=False)]
    return [xp.mod(a, b).astype(a.dtype, copy=False)]  # sign of the divisor, as Python and ONNX integer Mod


def _float_mod(xp, a, b):
    """Float Mod with the divisor's sign, edge cases as NumPy's ``mod`` (ONNX's reference): with CuPy's
    ``mod`` the runtime failed ONNX's three fmod=0 edge-case tests on the H100 (signed zeros, infinite
    and zero divisors, NaN; which elements differed was not recorded), so it is built from ``fmod`` as
    NumPy builds it: a nonzero remainder of the other sign moves by one divisor, a zero one takes the
    divisor's sign."""
    r = xp.fmod(a, b)
    moved = (r != 0) & ((r < 0) != (b < 0))
    return xp.where(r == 0, xp.copysign(xp.zeros_like(r), b), xp.where(moved, r + b, r))
