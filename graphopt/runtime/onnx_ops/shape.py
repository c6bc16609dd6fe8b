"""Ops that change shapes or move data without computing: Shape, Size, Reshape, Flatten, Transpose,
Concat, Unsqueeze, Squeeze, Expand, Tile, Split, Pad, DepthToSpace, SpaceToDepth."""

from __future__ import annotations

import numpy as np

from graphopt.lowering.layout import empty as layout_empty, is_layout
from graphopt.runtime.onnx_ops.registry import host_ints, on_host, op
from graphopt.runtime.onnx_ops.windows import pad_constant


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
    shape = host_ints(ctx.host(1))
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
    xp = np if all(on_host(ctx.xp, p) for p in parts) else ctx.xp  # host values stay on the host
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
        return None if a is None else host_ints(a)
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


@op("Expand", host=(1,))
def _expand(ctx, ins):
    x = ins[0]
    shape = tuple(np.broadcast_shapes(tuple(x.shape), tuple(host_ints(ctx.host(1)))))
    return [ctx.xp.ascontiguousarray(ctx.xp.broadcast_to(x, shape))]


@op("Tile", host=(1,))
def _tile(ctx, ins):
    return [ctx.xp.tile(ins[0], host_ints(ctx.host(1)))]


@op("Split", host=(1,))
def _split(ctx, ins):
    x = ins[0]
    axis = ctx.attr("axis", 0) % x.ndim
    n_out = len(ctx.node.outputs)
    split = host_ints(ctx.host(1)) if ctx.opset >= 13 and ctx.host(1) is not None else ctx.attr("split", None)
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
        pads = host_ints(ctx.host(1))
        cv = ctx.host(2)
        value = 0 if cv is None or cv.size == 0 else cv.item()
        axes = None if ctx.host(3) is None else host_ints(ctx.host(3))
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
