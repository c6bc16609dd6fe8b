"""Standard ONNX ops written once against an array module ``xp`` (NumPy for the host backend, CuPy on CUDA).

Each implementation is ``fn(ctx, inputs) -> list[outputs]``. ``ctx`` carries ``xp``, the node's
attributes, its opset, and ``host(i)``: the i-th input as a NumPy array known at *plan time* (shapes,
axes, pads...). Inputs listed in ``HOST_INPUTS`` are always such plan-time values, so no op reads a
device value on the host during a run (no synchronisation on CUDA). Conv and pooling use im2col
slices + ``xp.matmul``; they are hand-written because neither NumPy nor CuPy has them.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import onnx

from graphopt.lowering.layout import empty as layout_empty, is_layout
from graphopt.ops.cbr import conv_output

OpFn = Callable[["OpContext", list], list]
OPS: dict[str, OpFn] = {}
# input positions that must be known at plan time (host values), per op
HOST_INPUTS: dict[str, tuple[int, ...]] = {}
# ops whose implementation calls cuBLAS through CuPy (refused during CUDA graph capture)
CUBLAS_OPS = {"Conv", "MatMul", "Gemm", "ConvTranspose"}
# ops computed on the host at plan time when all their inputs are plan-time values (shape arithmetic)
FOLDABLE_MAX_ELEMENTS = 1 << 16


_MISSING = object()


class OpContext:
    """What an op implementation sees: ``xp``, attributes, opset, plan-time host inputs, accumulation dtype."""

    def __init__(self, xp, node, opset: int, host_values: dict[int, np.ndarray], compute_dtype=None, matmul=None,
                 pool=None):
        self.xp = xp
        # the backend's pooling kernel (graphopt.kernels.pool.pool2d on a GPU, any layout), or None
        self.pool = pool
        self.node = node
        self.opset = opset
        self._host = host_values
        self.compute_dtype = compute_dtype  # np.float16 when the session runs fp16, else None
        # the backend's GEMM (capture-safe cuBLAS on CUDA); xp.matmul semantics, fp32 accumulation for fp16
        self.matmul = matmul or numpy_matmul
        self._attrs: dict[str, Any] = {}  # attributes decoded once (a step's context lives as long as its plan)
        self.memo: dict[Any, Any] = {}  # what an op derives once per step (Resize: its taps on the device)

    def attr(self, name: str, default: Any = None) -> Any:
        value = self._attrs.get(name, _MISSING)
        if value is _MISSING:
            value = self._attrs[name] = self.node.attr(name, _MISSING)
        if value is _MISSING:
            return default
        return list(value) if isinstance(value, list) else value  # a list the op may change stays ours

    def host(self, i: int):
        """Input ``i`` as a NumPy array known at plan time, or None when the input is omitted."""
        return self._host.get(i)


def numpy_matmul(a, b):
    """np.matmul, accumulating half-precision products in float32 as cuBLAS does on the GPU."""
    if a.dtype == np.float16:
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    return np.matmul(a, b)


def op(name: str, host: tuple[int, ...] = ()):
    def deco(fn: OpFn) -> OpFn:
        OPS[name] = fn
        if host:
            HOST_INPUTS[name] = host
        return fn

    return deco


def _acc(ctx, x):
    """fp32 accumulation copy of a half-precision tensor (reductions, softmax, normalisation)."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


# ---------------------------------------------------------------- elementwise
_UNARY = {
    "Relu": lambda xp, x: xp.maximum(x, x.dtype.type(0)),
    "Sigmoid": lambda xp, x: (1 / (1 + xp.exp(-x))).astype(x.dtype),
    "Tanh": lambda xp, x: xp.tanh(x),
    "Sqrt": lambda xp, x: xp.sqrt(x),
    "Exp": lambda xp, x: xp.exp(x),
    "Log": lambda xp, x: xp.log(x),
    "Abs": lambda xp, x: xp.abs(x),
    "Neg": lambda xp, x: -x,
    "Reciprocal": lambda xp, x: (1 / x).astype(x.dtype),
    "Floor": lambda xp, x: xp.floor(x),
    "Ceil": lambda xp, x: xp.ceil(x),
    "IsNaN": lambda xp, x: xp.isnan(x),
    "Not": lambda xp, x: xp.logical_not(x),
    "Identity": lambda xp, x: x,
    "Sin": lambda xp, x: xp.sin(x),
    "Cos": lambda xp, x: xp.cos(x),
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
        return [ctx.xp.trunc(a / b).astype(a.dtype)]  # ONNX integer Div truncates toward zero
    return [(a / b).astype(a.dtype)]


@op("Pow")
def _pow(ctx, ins):
    a, b = ins
    return [ctx.xp.power(a, b.astype(a.dtype)).astype(a.dtype)]


@op("Erf")
def _erf(ctx, ins):
    x = ins[0]
    if ctx.xp is np:
        # NumPy has no erf and SciPy is not a dependency; math.erf is exact (host backend is for testing)
        return [np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)]
    import cupyx.scipy.special as sp

    return [sp.erf(x)]


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
    return [ctx.xp.clip(x, lo, hi).astype(x.dtype)]


@op("LeakyRelu")
def _leaky(ctx, ins):
    x = ins[0]
    a = ctx.attr("alpha", 0.01)
    return [ctx.xp.where(x >= 0, x, x * x.dtype.type(a))]


@op("HardSigmoid")
def _hsig(ctx, ins):
    x = ins[0]
    a, b = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return [ctx.xp.clip(x * x.dtype.type(a) + x.dtype.type(b), 0, 1).astype(x.dtype)]


@op("HardSwish")
def _hswish(ctx, ins):
    x = ins[0]
    return [(x * ctx.xp.clip(x / x.dtype.type(6) + x.dtype.type(0.5), 0, 1)).astype(x.dtype)]


@op("Gelu")
def _gelu(ctx, ins):
    x = ins[0]
    xp = ctx.xp
    if ctx.attr("approximate", "none") == "tanh":
        c = math.sqrt(2 / math.pi)
        return [(0.5 * x * (1 + xp.tanh(c * (x + 0.044715 * x**3)))).astype(x.dtype)]
    return [(0.5 * x * (1 + _erf(ctx, [x / x.dtype.type(math.sqrt(2))])[0])).astype(x.dtype)]


@op("Where")
def _where(ctx, ins):
    c, a, b = ins
    return [ctx.xp.where(c, a, b).astype(a.dtype)]


def _variadic(f):
    def run(ctx, ins):
        out = ins[0]
        for x in ins[1:]:
            out = f(ctx.xp, out, x)
        return [out.astype(ins[0].dtype) if len(ins) > 1 else out]

    return run


OPS["Sum"] = _variadic(lambda xp, a, b: a + b)
OPS["Max"] = _variadic(lambda xp, a, b: xp.maximum(a, b))
OPS["Min"] = _variadic(lambda xp, a, b: xp.minimum(a, b))
OPS["Mean"] = lambda ctx, ins: [(_variadic(lambda xp, a, b: a + b)(ctx, ins)[0] / len(ins)).astype(ins[0].dtype)]


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


# ---------------------------------------------------------------- matmul family
@op("MatMul")
def _matmul(ctx, ins):
    return [ctx.matmul(ins[0], ins[1])]


@op("Gemm")
def _gemm(ctx, ins):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    if ctx.attr("transA", 0):
        a = a.T
    if ctx.attr("transB", 0):
        b = b.T
    y = ctx.matmul(a, b)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if alpha != 1.0:
        y = y * y.dtype.type(alpha)
    if c is not None:
        y = y + (c * c.dtype.type(beta) if beta != 1.0 else c)
    return [y.astype(a.dtype)]


# ---------------------------------------------------------------- conv / pool (im2col)
def _conv_geometry(ctx, in_spatial, kernel):
    nd = len(kernel)
    strides = list(ctx.attr("strides", [1] * nd))
    dil = list(ctx.attr("dilations", [1] * nd))
    pads, outs = conv_output(in_spatial, kernel, strides, dil, ctx.attr("auto_pad", "NOTSET"),
                             ctx.attr("pads", None), bool(ctx.attr("ceil_mode", 0)))
    return strides, dil, pads, outs


def pad_constant(xp, x, pad_width, fill=0):
    """``xp.pad(x, pad_width, mode="constant", constant_values=fill)`` without host-to-device copies.

    Written by hand because ``cupy.pad`` builds its constant on the host and copies it over, which
    a CUDA-graph capture refuses: on the H200 every captured model with a padded Conv fell back to
    eager with "H2D transfers are disallowed" (the models without one captured), which this is
    meant to fix (not yet re-run there). The output is ``xp.full`` (a fill kernel) and the input
    is copied into its interior: device work only."""
    if not any(a or b for a, b in pad_width):
        return x
    shape = tuple(int(d) + int(a) + int(b) for d, (a, b) in zip(x.shape, pad_width))
    out = xp.full(shape, fill, dtype=x.dtype)
    out[tuple(slice(int(a), int(a) + int(d)) for d, (a, _) in zip(x.shape, pad_width))] = x
    return out


def _windows(xp, x, kernel, strides, dil, pads, outs, fill):
    """Padded input -> list of KH*KW strided slices, each (N, C, OH, OW) (2-D only; 1-D is lifted)."""
    nd = len(kernel)
    pad_width = [(0, 0), (0, 0)]
    for i in range(nd):
        # extra right padding so ceil_mode windows stay in bounds
        need = (outs[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1
        right = max(pads[i + nd], need - x.shape[2 + i] - pads[i])
        pad_width.append((pads[i], right))
    if any(p != (0, 0) for p in pad_width):
        x = pad_constant(xp, x, pad_width, fill)
    slices = []
    for kh in range(kernel[0]):
        for kw in range(kernel[1]):
            h0, w0 = kh * dil[0], kw * dil[1]
            slices.append(x[:, :, h0 : h0 + strides[0] * (outs[0] - 1) + 1 : strides[0], w0 : w0 + strides[1] * (outs[1] - 1) + 1 : strides[1]])
    return slices


def _lift1d(ctx, x, kernel):
    """1-D conv/pool as 2-D with H=1; returns (x4d, kernel2d, attr overrides)."""
    return x[:, :, None, :], [1] + list(kernel)


class _Attrs2D:
    """Wraps a node's attributes, turning 1-D geometry attributes into their 2-D (H=1) form."""

    def __init__(self, ctx):
        self.ctx = ctx

    def attr(self, name, default=None):
        v = self.ctx.attr(name, None)
        if v is None:
            return default
        if name in ("strides", "dilations"):
            return [1] + list(v)
        if name == "pads":
            return [0, v[0], 0, v[1]]
        if name == "kernel_shape":
            return [1] + list(v)
        return v


@op("Conv")
def _conv(ctx, ins):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    one_d = x.ndim == 3
    actx = ctx
    if one_d:
        x, w, actx = x[:, :, None, :], w[:, :, None, :], _Attrs2D(ctx)
    if x.ndim != 4:
        raise NotImplementedError("Conv supports 1-D and 2-D convolutions")
    y = conv2d(ctx, actx, x, w)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1).astype(y.dtype)
    if one_d:
        y = y[:, :, 0, :]
    return [y.astype(x.dtype)]


def conv2d(ctx, actx, x, w):
    """NCHW 2-D convolution without bias: depthwise as KH*KW multiply-adds, else im2col + one GEMM.

    Hand-written because neither NumPy nor CuPy has a convolution; every GEMM goes through
    ``ctx.matmul`` (capture-safe cuBLAS on CUDA). Groups become a batch of G GEMMs.
    """
    xp = ctx.xp
    N, C, H, W = x.shape
    M, Cg, KH, KW = w.shape
    G = actx.attr("group", 1)
    strides, dil, pads, outs = _conv_geometry(actx, [H, W], [KH, KW])
    OH, OW = outs
    if Cg == 1 and G == C and M == C:  # depthwise: no GEMM at all
        sl = _windows(xp, x, [KH, KW], strides, dil, pads, outs, 0)
        wa = _acc(ctx, w)
        y = None
        for k, s in enumerate(sl):
            term = _acc(ctx, s) * wa[:, 0, k // KW, k % KW].reshape(1, C, 1, 1)
            y = term if y is None else y + term
        return y.astype(x.dtype)
    K = Cg * KH * KW
    if KH == KW == 1 and strides == [1, 1] and not any(pads) and G == 1:
        cols = x.reshape(N, C, H * W)  # 1x1 stride-1 convolution: the input is already the column matrix
    else:
        sl = _windows(xp, x, [KH, KW], strides, dil, pads, outs, 0)
        # (N, C, KH*KW, OH, OW): c major, (kh, kw) minor. Filled slice by slice rather than with
        # xp.stack: CuPy's stack of many arrays may upload a pointer table from the host, which a
        # CUDA-graph capture refuses.
        stacked = xp.empty((N, C, KH * KW, OH, OW), dtype=x.dtype)
        for k, s in enumerate(sl):
            stacked[:, :, k] = s
        cols = stacked.reshape(N, G, K, OH * OW)
        if G == 1:
            cols = cols.reshape(N, K, OH * OW)
    if G == 1:
        y = ctx.matmul(w.reshape(M, K), cols)  # (M, K) x (N, K, P): one strided batched GEMM
        return y.reshape(N, M, OH, OW)
    cols = xp.ascontiguousarray(cols.transpose(1, 2, 0, 3)).reshape(G, K, N * OH * OW)
    y = ctx.matmul(xp.ascontiguousarray(w.reshape(G, M // G, K)), cols)  # (G, M/G, N*P)
    y = y.reshape(G, M // G, N, OH * OW).transpose(2, 0, 1, 3)
    return xp.ascontiguousarray(y).reshape(N, M, OH, OW)


def _windows_nd(xp, x, kernel, strides, dil, pads, outs, fill):
    """Padded input -> the prod(kernel) strided window slices, each (N, C, *outs); any spatial rank."""
    import itertools

    nd = len(kernel)
    pad_width = [(0, 0), (0, 0)]
    for i in range(nd):
        need = (outs[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1  # ceil_mode windows stay in bounds
        pad_width.append((pads[i], max(pads[i + nd], need - x.shape[2 + i] - pads[i])))
    if any(p != (0, 0) for p in pad_width):
        x = pad_constant(xp, x, pad_width, fill)
    slices = []
    for ks in itertools.product(*[range(k) for k in kernel]):
        idx = (slice(None), slice(None)) + tuple(
            slice(k * dil[i], k * dil[i] + strides[i] * (outs[i] - 1) + 1, strides[i]) for i, k in enumerate(ks))
        slices.append(x[idx])
    return slices


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
    strides, dil, pads, outs = _conv_geometry(ctx, list(x.shape[2:]), kernel)
    kind = "max" if op == "MaxPool" else ("avg_pad" if ctx.attr("count_include_pad", 0) else "avg")
    return kind, kernel, strides, dil, pads, outs


def _pool(ctx, x, kind):
    xp = ctx.xp
    kernel = list(ctx.attr("kernel_shape"))
    nd = len(kernel)
    strides, dil, pads, outs = _conv_geometry(ctx, list(x.shape[2:]), kernel)
    args = pool_kernel_args(ctx, x, "MaxPool" if kind == "max" else "AveragePool")
    if args is not None:
        return ctx.pool.pool2d(xp, x, *args)
    if kind == "max":
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        sl = _windows_nd(xp, x, kernel, strides, dil, pads, outs, fill)
        y = sl[0]
        for s in sl[1:]:
            y = xp.maximum(y, s)
        return y
    xa = _acc(ctx, x)
    sl = _windows_nd(xp, xa, kernel, strides, dil, pads, outs, 0)
    y = sl[0]
    for s in sl[1:]:
        y = y + s
    # the divisor per output: cells inside the input, plus explicit pads with count_include_pad,
    # never the ceil-mode overhang
    ones = xp.ones((1, 1) + tuple(x.shape[2:]), dtype=xa.dtype)
    pw = [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)]
    ones = pad_constant(xp, ones, pw, 1 if ctx.attr("count_include_pad", 0) else 0)
    cnt = _windows_nd(xp, ones, kernel, strides, dil, [0] * (2 * nd), outs, 0)
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


@op("GlobalAveragePool")
def _gap(ctx, ins):
    x = ins[0]
    args = pool_kernel_args(ctx, x, "GlobalAveragePool")
    if args is not None:
        return [ctx.pool.pool2d(ctx.xp, x, *args)]
    axes = tuple(range(2, x.ndim))
    return [_acc(ctx, x).mean(axis=axes, keepdims=True).astype(x.dtype)]


@op("GlobalMaxPool")
def _gmp(ctx, ins):
    x = ins[0]
    args = pool_kernel_args(ctx, x, "GlobalMaxPool")
    if args is not None:
        return [ctx.pool.pool2d(ctx.xp, x, *args)]
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]


@op("BatchNormalization")
def _bn(ctx, ins):
    x, scale, bias, mean, var = ins[:5]
    if ctx.attr("training_mode", 0):
        raise NotImplementedError("BatchNormalization training_mode=1 is not supported; this is an inference runtime")
    eps = ctx.attr("epsilon", 1e-5)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xa = _acc(ctx, x)
    inv = (1.0 / ctx.xp.sqrt(_acc(ctx, var) + eps)) * _acc(ctx, scale)
    y = (xa - _acc(ctx, mean).reshape(shape)) * inv.reshape(shape) + _acc(ctx, bias).reshape(shape)
    return [y.astype(x.dtype)]


@op("LRN")
def _lrn(ctx, ins):
    xp = ctx.xp
    x = ins[0]
    xa = _acc(ctx, x)
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
    return [(xa / (bias + (alpha / size) * s) ** beta).astype(x.dtype)]


# ---------------------------------------------------------------- normalisation / softmax / reductions
def _softmax_family(ctx, x, fn):
    """Softmax / LogSoftmax: ``fn(xp, xa, axis)`` over ``axis``; before opset 13 the input is coerced
    to 2-D at ``axis`` (default 1) and the op runs over the flattened trailing dims."""
    xa = _acc(ctx, x)
    if ctx.opset < 13:
        axis = ctx.attr("axis", 1) % x.ndim
        rows = xa.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
        return [fn(ctx.xp, rows, 1).reshape(x.shape).astype(x.dtype)]
    return [fn(ctx.xp, xa, ctx.attr("axis", -1)).astype(x.dtype)]


def _softmax_of(xp, xa, axis):
    e = xp.exp(xa - xa.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _logsoftmax_of(xp, xa, axis):
    d = xa - xa.max(axis=axis, keepdims=True)
    return d - xp.log(xp.exp(d).sum(axis=axis, keepdims=True))


@op("Softmax")
def _softmax(ctx, ins):
    return _softmax_family(ctx, ins[0], _softmax_of)


@op("LayerNormalization")
def _layernorm(ctx, ins):
    xp = ctx.xp
    x, scale = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    axis = ctx.attr("axis", -1) % x.ndim
    eps = ctx.attr("epsilon", 1e-5)
    axes = tuple(range(axis, x.ndim))
    xa = _acc(ctx, x)
    mu = xa.mean(axis=axes, keepdims=True)
    d = xa - mu
    var = (d * d).mean(axis=axes, keepdims=True)
    inv = 1.0 / xp.sqrt(var + eps)
    y = d * inv * _acc(ctx, scale)
    if b is not None:
        y = y + _acc(ctx, b)
    return [y.astype(x.dtype), mu.astype(np.float32), inv.astype(np.float32)]


def _reduce_axes(ctx, x):
    if ctx.opset >= 18 or (ctx.node.op_type == "ReduceSum" and ctx.opset >= 13):
        axes = ctx.host(1)
        axes = None if axes is None or axes.size == 0 else [int(a) for a in axes.reshape(-1)]
    else:
        axes = ctx.attr("axes", None)
    if axes is None:
        if ctx.attr("noop_with_empty_axes", 0):
            return "noop"
        return tuple(range(x.ndim))
    return tuple(a % x.ndim for a in axes)


def _empty_identity(op: str, dtype):
    dtype = np.dtype(dtype)
    big = np.inf if dtype.kind == "f" else (True if dtype.kind == "b" else np.iinfo(dtype).max)
    small = -np.inf if dtype.kind == "f" else (False if dtype.kind == "b" else np.iinfo(dtype).min)
    return {"ReduceMax": small, "ReduceMin": big, "ReduceProd": 1, "ReduceMean": np.nan,
            "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf}.get(op, 0)


def _reduction(f, accumulate=True):
    def run(ctx, ins):
        x = ins[0]
        axes = _reduce_axes(ctx, x)
        if axes == "noop":
            return [x]
        keep = bool(ctx.attr("keepdims", 1))
        if any(x.shape[a] == 0 for a in axes):  # an empty reduction gives the op's identity
            shape = [1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes]
            return [ctx.xp.full(shape, _empty_identity(ctx.node.op_type, x.dtype), dtype=x.dtype)]
        xa = _acc(ctx, x) if accumulate else x
        return [f(ctx.xp, xa, axes, keep).astype(x.dtype)]

    return run


for _name, _f in {
    "ReduceMean": lambda xp, x, a, k: x.mean(axis=a, keepdims=k),
    "ReduceSum": lambda xp, x, a, k: x.sum(axis=a, keepdims=k),
    "ReduceMax": lambda xp, x, a, k: x.max(axis=a, keepdims=k),
    "ReduceMin": lambda xp, x, a, k: x.min(axis=a, keepdims=k),
    "ReduceProd": lambda xp, x, a, k: x.prod(axis=a, keepdims=k),
    "ReduceSumSquare": lambda xp, x, a, k: (x * x).sum(axis=a, keepdims=k),
    "ReduceL2": lambda xp, x, a, k: xp.sqrt((x * x).sum(axis=a, keepdims=k)),
}.items():
    OPS[_name] = _reduction(_f)
    HOST_INPUTS[_name] = (1,)


@op("ArgMax")
def _argmax(ctx, ins):
    x = ins[0]
    axis = ctx.attr("axis", 0)
    if ctx.attr("select_last_index", 0):
        y = x.shape[axis] - 1 - ctx.xp.argmax(ctx.xp.flip(x, axis=axis), axis=axis)
    else:
        y = ctx.xp.argmax(x, axis=axis)
    if ctx.attr("keepdims", 1):
        y = ctx.xp.expand_dims(y, axis)
    return [y.astype(np.int64)]


# ---------------------------------------------------------------- shape ops
def _ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


@op("Shape")
def _shape(ctx, ins):
    s = ins[0].shape
    start = ctx.attr("start", 0)
    end = ctx.attr("end", None)
    return [np.array(s[start:end] if end is not None else s[start:], dtype=np.int64)]


@op("Size")
def _size(ctx, ins):
    return [np.array(int(np.prod(ins[0].shape, dtype=np.int64)), dtype=np.int64)]


@op("Reshape", host=(1,))
def _reshape(ctx, ins):
    x = ins[0]
    shape = _ints(ctx.host(1))
    allowzero = ctx.attr("allowzero", 0)
    if not allowzero:
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


@op("Flatten")
def _flatten(ctx, ins):
    x = ins[0]
    axis = ctx.attr("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [x.reshape(lead, -1) if x.size else x.reshape(lead, int(np.prod(x.shape[axis:], dtype=np.int64)))]


@op("Transpose")
def _transpose(ctx, ins):
    x = ins[0]
    perm = ctx.attr("perm", None)
    return [ctx.xp.ascontiguousarray(x.transpose(perm if perm is not None else list(range(x.ndim))[::-1]))]


@op("Concat")
def _concat(ctx, ins):
    axis = ctx.attr("axis")
    parts = [x for x in ins if x is not None]
    xp = np if all(isinstance(p, np.ndarray) for p in parts) else ctx.xp  # host values stay on the host
    parts = [xp.asarray(p) for p in parts]
    first = parts[0]
    if first.ndim >= 3 and is_layout(first, "NHWC") and not is_layout(first, "NCHW"):
        # an NHWC region stays NHWC through its Concat (DenseNet, Inception): the output is stored
        # channels-last, as the tuner's layout choice assumes (graphopt.tune.layout_choice)
        ax = axis % first.ndim
        shape = list(first.shape)
        shape[ax] = sum(int(p.shape[ax]) for p in parts)
        out = layout_empty(shape, first.dtype, "NHWC", xp)
        return [xp.concatenate(parts, axis=ax, out=out)]
    return [xp.concatenate(parts, axis=axis)]


def _axes_input(ctx, x_ndim_after, attr_name="axes", idx=1):
    if ctx.opset >= 13:
        a = ctx.host(idx)
        return None if a is None else _ints(a)
    return ctx.attr(attr_name, None)


@op("Unsqueeze", host=(1,))
def _unsqueeze(ctx, ins):
    x = ins[0]
    axes = _axes_input(ctx, None)
    nd = x.ndim + len(axes)
    shape = list(x.shape)
    for a in sorted(a % nd for a in axes):
        shape.insert(a, 1)
    return [x.reshape(shape)]


@op("Squeeze", host=(1,))
def _squeeze(ctx, ins):
    x = ins[0]
    axes = _axes_input(ctx, None)
    if axes is None:
        return [x.reshape([d for d in x.shape if d != 1])]
    drop = {a % x.ndim for a in axes}
    return [x.reshape([d for i, d in enumerate(x.shape) if i not in drop])]


@op("Slice", host=(1, 2, 3, 4))
def _slice(ctx, ins):
    x = ins[0]
    if ctx.opset < 10:
        starts, ends = ctx.attr("starts"), ctx.attr("ends")
        axes, steps = ctx.attr("axes", None), None
    else:
        starts, ends = _ints(ctx.host(1)), _ints(ctx.host(2))
        axes = None if ctx.host(3) is None else _ints(ctx.host(3))
        steps = None if ctx.host(4) is None else _ints(ctx.host(4))
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    idx = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        dim = x.shape[a % x.ndim]
        # clamp like ONNX: huge sentinels (INT64_MAX/MIN) become the dimension's bounds
        s = max(-dim - 1, min(dim, s))
        e = max(-dim - 1, min(dim, e))
        if st > 0:
            s = max(0, s + dim) if s < 0 else s
            e = max(0, e + dim) if e < 0 else e
            idx[a % x.ndim] = slice(s, e, st)
        else:
            s = s + dim if s < 0 else min(s, dim - 1)
            e = e + dim if e < 0 else e
            idx[a % x.ndim] = slice(s, e if e >= 0 else None, st)
    return [x[tuple(idx)]]


def _gather_operands(ctx, ins):
    """(xp, x, non-negative int64 indices, axis) for Gather and GatherElements: host arrays stay on the
    host (shape arithmetic), anything else runs on the backend's array module."""
    x, ind = ins
    axis = ctx.attr("axis", 0) % x.ndim
    xp = np if isinstance(x, np.ndarray) and isinstance(ind, np.ndarray) else ctx.xp
    ind = xp.asarray(ind).astype(np.int64)
    return xp, xp.asarray(x), xp.where(ind < 0, ind + x.shape[axis], ind), axis


@op("Gather")
def _gather(ctx, ins):
    xp, x, ind, axis = _gather_operands(ctx, ins)
    return [xp.take(x, ind, axis=axis)]


@op("GatherElements")
def _gather_elements(ctx, ins):
    xp, x, ind, axis = _gather_operands(ctx, ins)
    return [xp.take_along_axis(x, ind, axis=axis)]


@op("GatherND")
def _gathernd(ctx, ins):
    x, ind = ins
    b = ctx.attr("batch_dims", 0)
    xp = ctx.xp
    ind = ind.astype(np.int64)
    k = ind.shape[-1]
    nb = int(np.prod(x.shape[:b], dtype=np.int64))
    xb = x.reshape((nb,) + tuple(x.shape[b:]))
    flat = ind.reshape(nb, -1, k)
    # negative indices wrap per axis; python ints only, so nothing is copied host -> device during a run
    cols = [xp.where(flat[..., i] < 0, flat[..., i] + x.shape[b + i], flat[..., i]) for i in range(k)]
    batch = xp.arange(nb).reshape(nb, 1)
    out = xb[(batch,) + tuple(cols)]
    return [out.reshape(tuple(ind.shape[:-1]) + tuple(x.shape[b + k:]))]


@op("Expand", host=(1,))
def _expand(ctx, ins):
    x = ins[0]
    shape = tuple(np.broadcast_shapes(tuple(x.shape), tuple(_ints(ctx.host(1)))))
    return [ctx.xp.ascontiguousarray(ctx.xp.broadcast_to(x, shape))]


@op("Tile", host=(1,))
def _tile(ctx, ins):
    return [ctx.xp.tile(ins[0], _ints(ctx.host(1)))]


@op("ConstantOfShape", host=(0,))
def _cos(ctx, ins):
    shape = _ints(ctx.host(0))
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


@op("Split", host=(1,))
def _split(ctx, ins):
    x = ins[0]
    axis = ctx.attr("axis", 0) % x.ndim
    n_out = len(ctx.node.outputs)
    split = _ints(ctx.host(1)) if ctx.opset >= 13 and ctx.host(1) is not None else ctx.attr("split", None)
    if split is None:
        dim = x.shape[axis]
        n = ctx.attr("num_outputs", n_out)
        size = -(-dim // n)
        split = [min(size, dim - i * size) for i in range(n)]
    bounds = np.cumsum([0] + list(split))
    idx = [slice(None)] * x.ndim
    outs = []
    for i in range(len(split)):
        idx[axis] = slice(int(bounds[i]), int(bounds[i + 1]))
        outs.append(x[tuple(idx)])
    return outs


@op("Pad", host=(1, 2, 3))
def _pad(ctx, ins):
    x = ins[0]
    if ctx.opset < 11:
        pads, value = ctx.attr("pads"), ctx.attr("value", 0.0)
        axes = None
    else:
        pads = _ints(ctx.host(1))
        cv = ctx.host(2)
        value = 0 if cv is None or cv.size == 0 else cv.item()
        axes = None if ctx.host(3) is None else _ints(ctx.host(3))
    mode = ctx.attr("mode", "constant")
    nd = x.ndim
    axes = list(range(nd)) if axes is None else [a % nd for a in axes]
    width = [(0, 0)] * nd
    k = len(axes)
    for j, a in enumerate(axes):
        width[a] = (pads[j], pads[j + k])
    if any(p < 0 for w in width for p in w):
        raise NotImplementedError("Pad with negative pads")
    np_mode = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
    if np_mode == "constant":
        return [pad_constant(ctx.xp, x, width, value)]
    return [ctx.xp.pad(x, width, mode=np_mode)]


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


# ---------------------------------------------------------------- more elementwise / reductions
_UNARY_MORE = {
    "Sign": lambda xp, x: xp.sign(x),
    "Round": lambda xp, x: xp.round(x),  # round half to even, as ONNX
    "Tan": lambda xp, x: xp.tan(x),
    "Asin": lambda xp, x: xp.arcsin(x),
    "Acos": lambda xp, x: xp.arccos(x),
    "Atan": lambda xp, x: xp.arctan(x),
    "Sinh": lambda xp, x: xp.sinh(x),
    "Cosh": lambda xp, x: xp.cosh(x),
    "Softsign": lambda xp, x: (x / (1 + xp.abs(x))).astype(x.dtype),
    "Softplus": lambda xp, x: xp.logaddexp(x, x.dtype.type(0)).astype(x.dtype),
    "IsInf": None,
}
for _name, _f in _UNARY_MORE.items():
    if _f is not None:
        OPS[_name] = (lambda f: lambda ctx, ins: [f(ctx.xp, ins[0])])(_f)


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


@op("Elu")
def _elu(ctx, ins):
    x = ins[0]
    a = x.dtype.type(ctx.attr("alpha", 1.0))
    return [ctx.xp.where(x >= 0, x, a * (ctx.xp.exp(x) - 1)).astype(x.dtype)]


@op("Selu")
def _selu(ctx, ins):
    x = ins[0]
    a = x.dtype.type(ctx.attr("alpha", 1.67326319217681884765625))
    g = x.dtype.type(ctx.attr("gamma", 1.05070102214813232421875))
    return [(g * ctx.xp.where(x > 0, x, a * (ctx.xp.exp(x) - 1))).astype(x.dtype)]


@op("PRelu")
def _prelu(ctx, ins):
    x, slope = ins
    return [ctx.xp.where(x >= 0, x, x * slope).astype(x.dtype)]


@op("Mod")
def _mod(ctx, ins):
    a, b = ins
    xp = ctx.xp
    if ctx.attr("fmod", 0):
        return [xp.fmod(a, b).astype(a.dtype)]
    return [xp.mod(a, b).astype(a.dtype)]  # sign of the divisor, as Python and ONNX integer Mod


@op("ArgMin")
def _argmin(ctx, ins):
    x = ins[0]
    axis = ctx.attr("axis", 0)
    xp = ctx.xp
    if ctx.attr("select_last_index", 0):
        flipped = xp.flip(x, axis=axis)
        y = x.shape[axis] - 1 - xp.argmin(flipped, axis=axis)
    else:
        y = xp.argmin(x, axis=axis)
    if ctx.attr("keepdims", 1):
        y = xp.expand_dims(y, axis)
    return [y.astype(np.int64)]


for _name, _f in {
    "ReduceL1": lambda xp, x, a, k: xp.abs(x).sum(axis=a, keepdims=k),
    "ReduceLogSum": lambda xp, x, a, k: xp.log(x.sum(axis=a, keepdims=k)),
    "ReduceLogSumExp": lambda xp, x, a, k: _logsumexp(xp, x, a, k),
}.items():
    OPS[_name] = _reduction(_f)
    HOST_INPUTS[_name] = (1,)


def _logsumexp(xp, x, axes, keep):
    m = x.max(axis=axes, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    y = xp.log(xp.exp(x - m).sum(axis=axes, keepdims=True)) + m
    return y if keep else y.reshape([d for i, d in enumerate(y.shape) if i not in axes])


@op("LogSoftmax")
def _logsoftmax(ctx, ins):
    return _softmax_family(ctx, ins[0], _logsoftmax_of)


@op("InstanceNormalization")
def _instnorm(ctx, ins):
    x, scale, bias = ins
    xp = ctx.xp
    eps = ctx.attr("epsilon", 1e-5)
    axes = tuple(range(2, x.ndim))
    xa = _acc(ctx, x)
    mu = xa.mean(axis=axes, keepdims=True)
    d = xa - mu
    var = (d * d).mean(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = d / xp.sqrt(var + eps) * _acc(ctx, scale).reshape(shape) + _acc(ctx, bias).reshape(shape)
    return [y.astype(x.dtype)]


@op("Trilu", host=(1,))
def _trilu(ctx, ins):
    x = ins[0]
    k = 0 if ctx.host(1) is None else int(np.asarray(ctx.host(1)).reshape(-1)[0])
    xp = ctx.xp
    return [xp.triu(x, k) if ctx.attr("upper", 1) else xp.tril(x, k)]


@op("CumSum", host=(1,))
def _cumsum(ctx, ins):
    x = ins[0]
    xp = ctx.xp
    axis = int(np.asarray(ctx.host(1)).reshape(-1)[0]) % x.ndim
    if ctx.attr("reverse", 0):
        x = xp.flip(x, axis=axis)
    y = xp.cumsum(x, axis=axis)
    if ctx.attr("exclusive", 0):
        y = y - x
    if ctx.attr("reverse", 0):
        y = xp.flip(y, axis=axis)
    return [xp.ascontiguousarray(y).astype(ins[0].dtype)]


@op("DepthToSpace")
def _d2s(ctx, ins):
    x = ins[0]
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    if ctx.attr("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [ctx.xp.ascontiguousarray(y).reshape(n, c // (b * b), h * b, w * b)]


@op("SpaceToDepth")
def _s2d(ctx, ins):
    x = ins[0]
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.transpose(0, 1, 3, 5, 2, 4) if ctx.attr("mode", "DCR") == "CRD" else y.transpose(0, 3, 5, 1, 2, 4)
    return [ctx.xp.ascontiguousarray(y).reshape(n, c * b * b, h // b, w // b)]


@op("OneHot", host=(1,))
def _onehot(ctx, ins):
    ind, _, values = ins
    xp = ctx.xp
    depth = int(np.asarray(ctx.host(1)).reshape(-1)[0])
    axis = ctx.attr("axis", -1)
    ind = ind.astype(np.int64)
    ind = xp.where(ind < 0, ind + depth, ind)
    rng = xp.arange(depth, dtype=np.int64)
    out_nd = ind.ndim + 1
    ax = axis % out_nd
    shape = [1] * out_nd
    shape[ax] = depth
    hot = xp.expand_dims(ind, ax) == rng.reshape(shape)
    return [xp.where(hot, values[1], values[0]).astype(values.dtype)]


def supported_ops() -> list[str]:
    """Standard op types the runtime implements (If is handled by the planner), sorted."""
    return sorted(set(OPS) | {"If"})


# Resize and Upsample live in their own module (separable interpolation planned on the host); importing
# it registers them in OPS.
from graphopt.runtime import ops_resize  # noqa: E402,F401
