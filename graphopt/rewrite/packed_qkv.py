"""Constraints and builders of the packed-QKV attention rules (``rules/attention.toml``).

A self-attention whose Q, K and V come from one projection (GPT-2's ``c_attn`` and its Split), or from
three projections of the same input (BERT's query / key / value), becomes a ``graphopt.Attention``
with ``qkv_packed=1`` reading one ``[B, S, 3, H, D]`` tensor: the Split's three copies go, or the three
GEMMs become one with concatenated weights.

* ``packed_split(q, k, v)``: q, k, v are outputs 0, 1, 2 of one Split of the last axis of a tensor
  into three equal parts, each read only by the head split that feeds the attention;
* ``head_splits(rq, rk, rv)``: the three Reshapes make ``[B, S, H, D]`` of ``[B, S, H * D]``, one
  ``H`` and ``D`` for all three;
* ``last_axis_split(split, sh)``, ``split_part_size(split, sh)``: the shape of one output of a Split
  of the last axis, from its input's (``shape_of_split``: GPT-2 reads the Split outputs' shapes for the
  head split's target), ``weight_columns(w)`` the ``[N]`` of a ``[K, N]`` weight (``shape_of_projection``: BERT reads
  its projections' shapes), and ``int64s(v, ...)``, a literal int64 vector;
* ``head_split(r)``, ``leading_axes(r)``, ``head_dims(r)`` (builders of int64 ``[0, 1]`` and
  ``[H, D]``): the shape of a head split's output computed from its input's, so a Shape reading it
  (dynamic exports compute the heads merge's target from it) does not keep it alive;
* ``plain_projections(gq, gk, gv)``: three graphopt.GemmAct with the same attributes, no activation,
  constant 2-D weights of one shape and constant 1-D biases (all three or none);
* ``split_source(q)`` (builder, tensor): the input of the Split that made q;
* ``packed_heads_shape(rq)`` (builder, tensor): the Reshape target ``[0, 0, 3, H, D]``;
* ``concat_weights(wq, wk, wv, proj)`` / ``concat_biases(bq?, bk?, bv?)`` (builders, tensors): the
  three constant weights joined along their output axis (the last, or the first where the GemmAct
  takes them transposed), the biases joined (or absent).
"""

from __future__ import annotations

import numpy as np

from graphopt.rewrite.dim_sources import dim_source, same_dim
from graphopt.rewrite.registry import BuildFailed, NewConstant, register_builder, register_constraint


def _split_sizes(g, split) -> list[int] | None:
    """The sizes a Split node cuts into: its ``split`` attribute (opset < 13) or constant input,
    else equal parts (one per output)."""
    if split.has_attr("split"):
        return [int(s) for s in split.attr("split")]
    if len(split.inputs) > 1 and split.inputs[1]:
        value = g.constant_value(split.inputs[1])
        return None if value is None else [int(s) for s in np.asarray(value).reshape(-1)]
    return []  # equal parts


def _last_axis_parts(g, split) -> list[int] | str:
    """The sizes a Split of the last axis of a tensor with a known rank cuts into, or the reason."""
    shape = g.shape(split.inputs[0])
    if shape is None:
        return f"the input of Split {split.name!r} has an unknown shape"
    axis = int(split.attr("axis", 0))
    if axis not in (-1, len(shape) - 1):
        return f"Split {split.name!r} cuts axis {axis}, not the last one"
    sizes = _split_sizes(g, split)
    if sizes is None:
        return f"the sizes of Split {split.name!r} are not constant"
    if not sizes:
        n = shape[-1]
        if not isinstance(n, int) or n % len(split.outputs):
            return f"Split {split.name!r} cuts a last dim {n} into equal parts of unknown size"
        sizes = [n // len(split.outputs)] * len(split.outputs)
    return sizes


@register_constraint("last_axis_split", "nn")
def last_axis_split(g, split, sh):
    """split cuts the last axis into parts of known sizes and sh reads one of its outputs."""
    parts = _last_axis_parts(g, split)
    if isinstance(parts, str):
        return parts
    if sh.inputs[0] not in split.outputs:
        return f"{sh.name!r} does not read an output of {split.name!r}"
    return None


@register_builder("split_part_size", "nn", "tensor")
def split_part_size(g, split, sh):
    """The int64 [size] of the Split output that the Shape node sh reads."""
    parts = _last_axis_parts(g, split)
    if isinstance(parts, str):
        raise BuildFailed(parts)
    size = parts[list(split.outputs).index(sh.inputs[0])]
    return NewConstant(np.array([size], dtype=np.int64), f"{split.name}_part")


@register_builder("weight_columns", "t", "tensor")
def weight_columns(g, w):
    """The int64 [N] of a constant [K, N] weight (a matmul-mode GemmAct's output's last dim)."""
    value = g.constant_value(w)
    if value is None or np.asarray(value).ndim != 2:
        raise BuildFailed(f"{w!r} is not a constant 2-D weight")
    return NewConstant(np.array([np.asarray(value).shape[1]], dtype=np.int64), "columns")


@register_builder("int64s", "v*", "tensor")
def int64s(g, *values):
    """A 1-D int64 constant of the literal values (Slice bounds, Gather indices)."""
    return NewConstant(np.array([int(v) for v in values], dtype=np.int64), "ints")


@register_constraint("packed_split", "ttt")
def packed_split(g, q, k, v):
    """q, k, v are outputs 0, 1, 2 of one Split of the last axis of a [B, S, 3 * H * D] tensor into three
    equal parts, each with one consumer and none a graph output."""
    split = g.producer(q) if q else None
    if split is None or split.op_type != "Split" or split.domain not in ("", "ai.onnx"):
        return f"{q!r} is not the output of a Split"
    if list(split.outputs) != [q, k, v]:
        return f"Split {split.name!r} has outputs {list(split.outputs)}, not Q, K, V in this order"
    shape = g.shape(split.inputs[0])
    if shape is None or len(shape) != 3:
        return f"the input of Split {split.name!r} is not a known [B, S, 3 * H * D] tensor (shape {shape})"
    parts = _last_axis_parts(g, split)
    if isinstance(parts, str):
        return parts
    if len(set(parts)) != 1:
        return f"Split {split.name!r} cuts into unequal parts {parts}"
    for t in (q, k, v):
        if g.is_graph_output(t) or len(g.consumers(t)) != 1:
            return f"{t!r} has other consumers or is a graph output"
    return None


def _heads(g, r):
    """The [B, S, H, D] dims of the Reshape r's output (H and D ints) when it splits the last axis of
    a [B, S, H * D] tensor into heads, else the reason. H and D come from the inferred shape, or from
    the target's constant entries 2 and 3 (``dim_source``: a dynamic export's Concat target), or D
    with the input's last dim."""
    out, src = g.shape(r.outputs[0]), g.shape(r.inputs[0])
    if out is None or len(out) != 4:
        return f"Reshape {r.name!r} does not make a rank-4 [B, S, H, D] tensor (shape {out})"
    if src is None or len(src) != 3 or not isinstance(src[2], int):
        return f"Reshape {r.name!r} does not read a [B, S, H * D] tensor with a known last dim (shape {src})"
    h, d = out[2], out[3]
    if not (isinstance(h, int) and isinstance(d, int)):
        tail = [dim_source(g, r.inputs[1], k) for k in (2, 3)] if len(r.inputs) > 1 else [None, None]
        if all(isinstance(v, int) and v > 0 for v in tail):
            h, d = tail
        elif isinstance(d, int) and d > 0 and src[2] % d == 0:
            h = src[2] // d
    if not (isinstance(h, int) and isinstance(d, int) and h > 0 and d > 0 and h * d == src[2]):
        return f"Reshape {r.name!r} does not split the last axis of [B, S, H * D] into heads ({src} -> {out})"
    for i, (a, b) in enumerate(zip(src[:2], out[:2])):
        if isinstance(a, int) and isinstance(b, int):
            if a != b:
                return f"Reshape {r.name!r} changes the leading dims ({src} -> {out})"
            continue
        # symbolic: the target's entry i must provably be the input's dim i (a copy, or read from it)
        entry = dim_source(g, r.inputs[1], i) if len(r.inputs) > 1 else None
        if entry == 0 and not int(r.attr("allowzero", 0)):
            continue
        if isinstance(entry, tuple) and entry[1] == i and same_dim(g, entry[0], r.inputs[0], i):
            continue
        return f"Reshape {r.name!r}: dim {i} of its target is not provably its input's (from {src} to {out})"
    return (out[0], out[1], h, d)


@register_constraint("head_splits", "nnn")
def head_splits(g, rq, rk, rv):
    """rq, rk, rv each make [B, S, H, D] of [B, S, H * D], with one H and D, read only by the attention."""
    dims = []
    for r in (rq, rk, rv):
        got = _heads(g, r)
        if isinstance(got, str):
            return got
        if g.is_graph_output(r.outputs[0]) or len(g.consumers(r.outputs[0])) != 1:
            return f"the output of Reshape {r.name!r} has other consumers or is a graph output"
        dims.append(tuple(got[2:]))
    if len(set(dims)) != 1:
        return f"the head splits disagree on [H, D]: {dims}"
    return None


@register_constraint("head_split", "n")
def head_split(g, r):
    """The Reshape r makes [B, S, H, D] of [B, S, H * D] with known H and D."""
    got = _heads(g, r)
    return got if isinstance(got, str) else None


@register_builder("leading_axes", "n", "tensor")
def leading_axes(g, r):
    """The int64 indices [0, 1] (B and S of a head split's shape)."""
    return NewConstant(np.array([0, 1], dtype=np.int64), f"{r.name}_lead")


@register_builder("head_dims", "n", "tensor")
def head_dims(g, r):
    """The int64 [H, D] of a head split's output."""
    got = _heads(g, r)
    if isinstance(got, str):
        raise BuildFailed(got)
    return NewConstant(np.array(got[2:], dtype=np.int64), f"{r.name}_heads")


@register_constraint("plain_projections", "nnn")
def plain_projections(g, gq, gk, gv):
    """Three GemmAct with the same attributes and no activation; constant 2-D weights of one shape;
    constant 1-D biases on all three or none; each read only by its head split."""
    attrs = [n.attrs_dict() for n in (gq, gk, gv)]
    if attrs[0] != attrs[1] or attrs[0] != attrs[2]:
        return f"the projections {gq.name!r}, {gk.name!r}, {gv.name!r} differ in their attributes"
    act = attrs[0].get("activation", "none")
    if (act.decode() if isinstance(act, bytes) else act) != "none":
        return f"the projections have an activation ({act})"
    shapes = set()
    for n in (gq, gk, gv):
        w = g.constant_value(n.inputs[1])
        if w is None or w.ndim != 2:
            return f"the weight of {n.name!r} is not a constant 2-D tensor"
        shapes.add(w.shape)
        if len(g.consumers(n.outputs[0])) != 1 or g.is_graph_output(n.outputs[0]):
            return f"the output of {n.name!r} has other consumers or is a graph output"
    if len(shapes) != 1:
        return f"the projections' weights differ in shape: {sorted(shapes)}"
    biases = [n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None for n in (gq, gk, gv)]
    if any(biases) and not all(biases):
        return "only some of the projections have a bias"
    for b in biases:
        if b is not None and (g.constant_value(b) is None or np.asarray(g.constant_value(b)).ndim != 1):
            return f"the bias {b!r} is not a constant 1-D tensor"
    return None


@register_builder("split_source", "t", "tensor")
def split_source(g, q):
    """The input of the Split whose first output is q."""
    split = g.producer(q)
    if split is None or split.op_type != "Split":
        raise BuildFailed(f"{q!r} is not the output of a Split")
    return split.inputs[0]


@register_builder("packed_heads_shape", "n", "tensor")
def packed_heads_shape(g, rq):
    """The Reshape target [0, 0, 3, H, D] (0: the input's dim) of the packed Q, K, V."""
    got = _heads(g, rq)
    if isinstance(got, str):
        raise BuildFailed(got)
    return NewConstant(np.array([0, 0, 3, got[2], got[3]], dtype=np.int64), f"{rq.name}_packed_shape")


@register_builder("concat_weights", "tttn", "tensor")
def concat_weights(g, wq, wk, wv, proj):
    """The constant weights joined along their output axis: the last for [K, N] weights, the first
    where the GemmAct ``proj`` takes them transposed (mode gemm, transB=1: [N, K])."""
    mode = proj.attr("mode", "matmul")
    transposed = (mode.decode() if isinstance(mode, bytes) else mode) == "gemm" and int(proj.attr("transB", 0))
    return _concat(g, (wq, wk, wv), 0 if transposed else -1)


@register_builder("concat_biases", "t?t?t?", "tensor")
def concat_biases(g, bq, bk, bv):
    """The constant 1-D biases joined, or absent when all three are."""
    return _concat(g, (bq, bk, bv), 0)


def _concat(g, tensors, axis: int):
    if not any(tensors):
        return None
    values = []
    for t in tensors:
        v = g.constant_value(t) if t else None
        if v is None:
            raise BuildFailed(f"{t!r} is not a constant")
        values.append(np.asarray(v))
    if len({v.dtype for v in values}) != 1:
        raise BuildFailed(f"the constants {list(tensors)} differ in dtype")
    return NewConstant(np.ascontiguousarray(np.concatenate(values, axis=axis)), f"{tensors[0]}_qkv")
