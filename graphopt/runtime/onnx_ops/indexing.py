"""Indexing ops: Slice, Gather, GatherElements, GatherND, OneHot, Trilu."""

from __future__ import annotations

import numpy as np

from graphopt.runtime.onnx_ops.registry import host_ints, on_host, op


@op("Slice", host=(1, 2, 3, 4))
def _slice(ctx, ins):
    x = ins[0]
    if ctx.opset < 10:
        starts, ends = ctx.attr("starts"), ctx.attr("ends")
        axes, steps = ctx.attr("axes", None), None
    else:
        starts, ends = host_ints(ctx.host(1)), host_ints(ctx.host(2))
        axes = None if ctx.host(3) is None else host_ints(ctx.host(3))
        steps = None if ctx.host(4) is None else host_ints(ctx.host(4))
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
    xp = np if on_host(ctx.xp, x) and on_host(ctx.xp, ind) else ctx.xp
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
    """One ``take`` of X's rows by their linear index: CuPy's indexing by several arrays launched about ten
    kernels, 313 us of host time on an H100 for GPT-2's dynamo export (bench/results/host_per_op_h100_0b17732.json)."""
    x, ind = ins
    b = ctx.attr("batch_dims", 0)
    xp = ctx.xp
    ind = xp.asarray(ind, dtype=np.int64)
    k = ind.shape[-1]
    nb = int(np.prod(x.shape[:b], dtype=np.int64))
    dims = tuple(int(d) for d in x.shape[b:b + k])
    tail = tuple(x.shape[b + k:])
    per_batch = int(np.prod(dims, dtype=np.int64))
    flat = ind.reshape(nb, -1, k)
    lin = None  # ONNX: 1 <= k <= rank - batch_dims
    for i, d in enumerate(dims):  # negative indices wrap per axis; python ints only, nothing copied host -> device
        col = flat[..., i]
        col = xp.where(col < 0, col + d, col)
        lin = col if lin is None else lin * d + col
    if nb > 1:
        lin = lin + xp.arange(0, nb * per_batch, per_batch, dtype=np.int64).reshape(nb, 1)
    rows = xp.ascontiguousarray(x).reshape((nb * per_batch,) + tail)
    out = xp.take(rows, lin.reshape(-1), axis=0)
    return [out.reshape(tuple(ind.shape[:-1]) + tail)]


@op("Trilu", host=(1,))
def _trilu(ctx, ins):
    x = ins[0]
    k = 0 if ctx.host(1) is None else int(np.asarray(ctx.host(1)).reshape(-1)[0])
    xp = ctx.xp
    return [xp.triu(x, k) if ctx.attr("upper", 1) else xp.tril(x, k)]


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
