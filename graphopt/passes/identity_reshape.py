"""``eliminate_identity_reshape``: remove a ``Reshape`` whose target is provably its input's own shape.

Dynamic exports write ``Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1], [128], [64]))`` where
x already is ``[batch, 12, 128, 64]`` (the SDPA export after the attention): no copy at run time, but
the Reshape and the Shape behind it are consumers that keep rewrites from seeing x's real readers.
The target is read term by term (``_shape_terms``): dim i of x, a constant equal to x's static dim i
(0 means "copy dim i" unless ``allowzero``), and at most one -1 where every other dim matched (the
element count then fixes it to dim i). onnx's shape inference cannot decide this (the batch dim is
symbolic), so it is written here.
"""

from __future__ import annotations

from graphopt.ir import Graph

from graphopt.passes._shape_terms import shape_terms
from graphopt.passes._util import Trace, bypass_each

NAME = "eliminate_identity_reshape"


def _identity_reason(g: Graph, node) -> str | None:
    """Why this Reshape is not provably the identity (None: it is)."""
    if len(node.inputs) != 2:
        return "a Reshape without its shape input"
    x, target = node.inputs[0], node.inputs[1]
    shape = g.value_info(x).shape
    if shape is None:
        return f"the shape of {x!r} is unknown"
    terms = shape_terms(g, target, x)
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
