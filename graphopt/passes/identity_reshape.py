"""``eliminate_identity_reshape``: remove a ``Reshape`` whose target is provably its input's own shape.

Dynamic exports write ``Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1], [128], [64]))`` where
x already is ``[batch, 12, 128, 64]`` (the SDPA export after the attention): no copy at run time, but
the Reshape and the Shape behind it are consumers that keep rewrites from seeing x's real readers.
The target is read term by term: ``Shape(x)[i]`` (through ``Gather`` and ``Unsqueeze``, or a whole
``Shape(x)``), a constant equal to x's static dim i (0 means "copy dim i" unless ``allowzero``), and
at most one -1 where every other dim matched (the element count then fixes it to dim i). onnx's
shape inference cannot decide this (the batch dim is symbolic), so it is written here.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Graph

from graphopt.passes._util import Trace, bypass_each

NAME = "eliminate_identity_reshape"


def _shape_of(g: Graph, tensor: str, x: str) -> bool:
    node = g.producer(tensor)
    return (node is not None and node.op_type == "Shape" and node.domain == "" and node.inputs[0] == x
            and not node.has_attr("start") and not node.has_attr("end"))


def _terms(g: Graph, tensor: str, x: str) -> list | None:
    """The 1-D int64 ``tensor`` as terms ``("dim", i)`` (dim i of x) or ``("const", c)``; None when
    some part of it is neither."""
    value = g.constant_value(tensor)
    if value is not None:
        return [("const", int(v)) for v in np.asarray(value).reshape(-1)] if value.dtype.kind in "iu" else None
    node = g.producer(tensor)
    if node is None or node.domain != "":
        return None
    if _shape_of(g, tensor, x):
        shape = g.value_info(x).shape
        return None if shape is None else [("dim", i) for i in range(len(shape))]
    if node.op_type == "Unsqueeze":
        axes = g.constant_value(node.inputs[1]) if len(node.inputs) > 1 else node.attr("axes")
        if axes is None or [int(a) for a in np.asarray(axes).reshape(-1)] not in ([0], [-1]):
            return None
        inner = _terms(g, node.inputs[0], x)
        return inner if inner is not None and len(inner) == 1 else None
    if node.op_type == "Gather" and int(node.attr("axis", 0)) == 0 and _shape_of(g, node.inputs[0], x):
        idx = g.constant_value(node.inputs[1])
        if idx is None or idx.dtype.kind not in "iu" or np.ndim(idx) > 1:
            return None
        rank = len(g.value_info(x).shape or ())
        return [("dim", int(i) % rank) for i in np.asarray(idx).reshape(-1)] if rank else None
    if node.op_type == "Concat" and int(node.attr("axis", 0)) == 0:
        out = []
        for part in node.inputs:
            terms = _terms(g, part, x)
            if terms is None:
                return None
            out += terms
        return out
    return None


def _identity_reason(g: Graph, node) -> str | None:
    """Why this Reshape is not provably the identity (None: it is)."""
    if len(node.inputs) != 2:
        return "a Reshape without its shape input"
    x, target = node.inputs[0], node.inputs[1]
    shape = g.value_info(x).shape
    if shape is None:
        return f"the shape of {x!r} is unknown"
    terms = _terms(g, target, x)
    if terms is None:
        return "its target is not made of x's own dims and constants"
    if len(terms) != len(shape):
        return f"its target has {len(terms)} dims, {x!r} has {len(shape)}"
    allowzero = int(node.attr("allowzero", 0))
    free = 0
    for i, (kind, v) in enumerate(terms):
        if kind == "dim" and v == i or kind == "const" and v == 0 and not allowzero:
            continue
        if kind == "const" and v == -1:
            free += 1
            continue
        if kind == "const" and isinstance(shape[i], int) and not isinstance(shape[i], bool) and shape[i] == v:
            continue
        return f"dim {i} of its target is not dim {i} of {x!r}"
    return "more than one -1 in its target" if free > 1 else None


def eliminate_identity_reshape(graph: Graph, *, trace: Trace = None) -> int:
    """Remove every Reshape that provably keeps its input's shape; returns the number removed."""
    return bypass_each(graph, "Reshape", NAME, _identity_reason, trace)
