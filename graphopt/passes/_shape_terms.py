"""Reading a shape computation term by term (private to the cleanup passes).

Dynamic exports compute a Reshape's target from the shape of a tensor at run time:
``Concat(Unsqueeze(Gather(Shape(x), 0)), [-1], Slice(Shape(x), [-2], [-1]), ...)``. onnx's shape
inference cannot say what such a target holds when x has symbolic dims, so it is read here: each
element becomes ``("dim", i)`` (dim i of x) or ``("const", c)``. ``eliminate_identity_reshape`` and
``fold_transposes`` prove their rewrites with it.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Graph

Term = tuple[str, int]


def _ints(g: Graph, tensor: str) -> list[int] | None:
    """A 0-D or 1-D integer constant's values (None for anything else: Gather of a 2-D one takes rows)."""
    if not tensor:
        return None
    value = g.constant_value(tensor)
    if value is None or value.dtype.kind not in "iu" or np.ndim(value) > 1:
        return None
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _rank(g: Graph, x: str) -> int | None:
    shape = g.value_info(x).shape
    return None if shape is None else len(shape)


def _shape_dims(g: Graph, node, x: str) -> list[Term] | None:
    """``Shape(x)`` with its optional start / end (opset 15): the dims it holds."""
    if node.inputs[0] != x:
        return None
    rank = _rank(g, x)
    if rank is None:
        return None
    start, end = int(node.attr("start", 0)), int(node.attr("end", rank))
    return [("dim", i) for i in range(rank)][start:end]  # ONNX clamps as Python slicing does


def shape_terms(g: Graph, tensor: str, x: str) -> list[Term] | None:
    """The 1-D int64 ``tensor`` as terms of x's dims and constants; None when some part of it is neither.

    Understood: constants, ``Shape(x)`` (start / end too), ``Gather`` (axis 0, constant indices),
    ``Slice`` (axis 0, step 1, constant starts / ends), ``Unsqueeze`` of one element and ``Concat``
    (axis 0) of any of these."""
    if g.constant_value(tensor) is not None:  # a 1-D (or 0-D) integer constant; a 2-D one is no list of dims
        ints = _ints(g, tensor)
        return None if ints is None else [("const", v) for v in ints]
    node = g.producer(tensor)
    if node is None or node.domain != "":
        return None
    if node.op_type == "Shape":
        return _shape_dims(g, node, x)
    if node.op_type == "Unsqueeze":
        axes = _ints(g, node.inputs[1]) if len(node.inputs) > 1 else node.attr("axes")
        if axes is None or [int(a) for a in axes] not in ([0], [-1]):
            return None
        inner = shape_terms(g, node.inputs[0], x)
        return inner if inner is not None and len(inner) == 1 else None
    if node.op_type == "Gather" and int(node.attr("axis", 0)) == 0:
        data = shape_terms(g, node.inputs[0], x)
        idx = _ints(g, node.inputs[1])
        if data is None or idx is None or any(not -len(data) <= i < len(data) for i in idx):
            return None
        return [data[i] for i in idx]
    if node.op_type == "Slice" and len(node.inputs) >= 3:
        data = shape_terms(g, node.inputs[0], x)
        starts, ends = _ints(g, node.inputs[1]), _ints(g, node.inputs[2])
        axes = _ints(g, node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else [0]
        steps = _ints(g, node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else [1]
        if data is None or starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
            return None
        if axes not in ([0], [-1]) or steps != [1]:
            return None
        return data[starts[0]:ends[0]]  # step 1: ONNX's clamping of negative and huge bounds is Python's
    if node.op_type == "Concat" and int(node.attr("axis", 0)) == 0:
        out: list[Term] = []
        for part in node.inputs:
            terms = shape_terms(g, part, x)
            if terms is None:
                return None
            out += terms
        return out
    return None


def is_dim(term: Term, i: int, shape) -> bool:
    """The term is dim i of a tensor of ``shape``: by reference, or a constant equal to its static size."""
    kind, v = term
    if kind == "dim":
        return v == i
    return isinstance(shape[i], int) and not isinstance(shape[i], bool) and shape[i] == v > 0
