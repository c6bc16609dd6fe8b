"""Reductions and what reduces along an axis: Reduce* (with ONNX's empty-reduction identities),
ArgMax / ArgMin, Softmax / LogSoftmax, CumSum; half precision accumulates in float32."""

from __future__ import annotations

import numpy as np

from graphopt.runtime.onnx_ops.registry import HOST_INPUTS, OPS, for_accumulation, op


def _softmax_family(ctx, x, fn):
    """Softmax / LogSoftmax: ``fn(xp, xa, axis)`` over ``axis``; before opset 13 the input is coerced
    to 2-D at ``axis`` (default 1) and the op runs over the flattened trailing dims."""
    xa = for_accumulation(ctx, x)
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


@op("LogSoftmax")
def _logsoftmax(ctx, ins):
    return _softmax_family(ctx, ins[0], _logsoftmax_of)


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


def _logsumexp(xp, x, axes, keep):
    m = x.max(axis=axes, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    y = xp.log(xp.exp(x - m).sum(axis=axes, keepdims=True)) + m
    return y if keep else y.reshape([d for i, d in enumerate(y.shape) if i not in axes])


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
        xa = for_accumulation(ctx, x) if accumulate else x
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
    "ReduceL1": lambda xp, x, a, k: xp.abs(x).sum(axis=a, keepdims=k),
    "ReduceLogSum": lambda xp, x, a, k: xp.log(x.sum(axis=a, keepdims=k)),
    "ReduceLogSumExp": lambda xp, x, a, k: _logsumexp(xp, x, a, k),
}.items():
    OPS[_name] = _reduction(_f)
    HOST_INPUTS[_name] = (1,)


def _arg_index(find: str):
    """ArgMax / ArgMin: ``find`` is the array module's ``"argmax"`` or ``"argmin"``."""

    def run(ctx, ins):
        x = ins[0]
        axis = ctx.attr("axis", 0)
        xp = ctx.xp
        if ctx.attr("select_last_index", 0):
            y = x.shape[axis] - 1 - getattr(xp, find)(xp.flip(x, axis=axis), axis=axis)
        else:
            y = getattr(xp, find)(x, axis=axis)
        if ctx.attr("keepdims", 1):
            y = xp.expand_dims(y, axis)
        return [y.astype(np.int64)]

    return run


OPS["ArgMax"] = _arg_index("argmax")
OPS["ArgMin"] = _arg_index("argmin")


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
