"""Where an entry of a shape tensor comes from, and whether two tensors provably share a leading dim.

Dynamic exports compute a Reshape's target at run time (``Concat(Unsqueeze(Gather(Shape(q), 0)), ...)``),
so ONNX's symbolic inference gives the output fresh dim names (``unk__37``) that say nothing about the
input's. A rule that must know "the Reshape keeps dims 0 and 1" (the head splits) proves it here by
following the target's arithmetic back to the ``Shape`` it reads, then from that tensor to the
Reshape's input through ops that keep their leading dims. Why by hand: onnx's inference and the
shape-value folding (``passes.shape_values``) need concrete dims; this is symbolic and small.
"""

from __future__ import annotations

import numpy as np

MAX_DEPTH = 12


def known_size(d) -> bool:
    """A dim known by value, or by a name that means one size wherever it appears (a fresh ``unk__`` name from
    onnx's inference does not: two inference runs may give it to different dims)."""
    return isinstance(d, int) and not isinstance(d, bool) and d >= 0 or isinstance(d, str) and not d.startswith("unk__")


def same_size(a, b) -> bool:
    """Two dims provably equal: equal ints, or one name that :func:`known_size` trusts."""
    return known_size(a) and a == b


def entry_size(g, entry):
    """The size a shape entry (:func:`dim_source`) stands for: a positive constant, or the dim it reads where
    :func:`known_size` trusts it; else None (0 and -1 mean something else in a Reshape's target)."""
    if isinstance(entry, tuple):
        shape = g.shape(entry[0])
        d = shape[entry[1]] if shape is not None and 0 <= entry[1] < len(shape) else None
        return d if known_size(d) else None
    return entry if isinstance(entry, int) and not isinstance(entry, bool) and entry > 0 else None


def dim_source(g, tensor: str, k: int, depth: int = 0):
    """Entry ``k`` of the 1-D int64 ``tensor`` (of a scalar: k = 0): an int when constant, ``(t, i)`` when it
    is dim ``i`` of tensor ``t``, else None (unknown)."""
    if depth > MAX_DEPTH or not tensor:
        return None
    value = g.constant_value(tensor)
    if value is not None:
        flat = np.asarray(value).reshape(-1)
        return int(flat[k]) if 0 <= k < flat.size else None
    node = g.producer(tensor)
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    op = node.op_type
    if op == "Shape":  # opset 15's start/end slice the dims (non-negative bounds only: the rank may be unknown)
        start, end = int(node.attr("start", 0)), node.attr("end")
        if start < 0 or end is not None and (int(end) < 0 or start + k >= int(end)):
            return None
        return (node.inputs[0], start + k)
    if op in ("Cast", "Identity"):
        return dim_source(g, node.inputs[0], k, depth + 1)
    if op == "Unsqueeze" and k == 0:  # a scalar made 1-D
        shape = g.shape(node.inputs[0])
        return dim_source(g, node.inputs[0], 0, depth + 1) if shape == () else None
    if op == "Squeeze" and k == 0:  # a 1-element 1-D tensor made a scalar (a Range's bound)
        shape = g.shape(node.inputs[0])
        return dim_source(g, node.inputs[0], 0, depth + 1) if shape is not None and tuple(shape) == (1,) else None
    if op == "Gather" and int(node.attr("axis", 0)) == 0:
        idx = g.constant_value(node.inputs[1])
        if idx is None:
            return None
        idx = np.asarray(idx).reshape(-1)
        if not 0 <= k < idx.size or idx[k] < 0:
            return None
        return dim_source(g, node.inputs[0], int(idx[k]), depth + 1)
    if op == "Concat":
        offset = 0
        for part in node.inputs:
            shape = g.shape(part)
            if shape is None or len(shape) != 1 or not isinstance(shape[0], int):
                return None
            if k < offset + shape[0]:
                return dim_source(g, part, k - offset, depth + 1)
            offset += shape[0]
        return None
    if op == "Where" and len(node.inputs) == 3:
        return _expand_idiom_entry(g, node, k, depth)
    if op == "Slice" and len(node.inputs) >= 3:
        starts, axes = g.constant_value(node.inputs[1]), (g.constant_value(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else [0])
        steps = g.constant_value(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else [1]
        if starts is None or axes is None or steps is None:
            return None
        start = int(np.asarray(starts).reshape(-1)[0])
        if list(np.asarray(axes).reshape(-1)) not in ([0], [-1]) or list(np.asarray(steps).reshape(-1)) != [1] or start < 0:
            return None
        return dim_source(g, node.inputs[0], start + k, depth + 1)
    return None


def vector_length(g, tensor: str) -> int | None:
    """The length of a 1-D tensor (a constant's or the inferred one), else None."""
    value = g.constant_value(tensor)
    if value is not None:
        return int(np.size(value)) if np.ndim(value) == 1 else None
    shape = g.shape(tensor)
    return shape[0] if shape is not None and len(shape) == 1 and isinstance(shape[0], int) else None


def _expand_idiom_entry(g, node, k: int, depth: int):
    """Entry ``k`` of ``Where(Equal(T, E), A, T)``, what torch writes for ``expand``'s target (-1: keep the dim):
    T's entry where it is a dim (never negative, so never equal to a negative E), else A's or T's as the
    constants compare. All four 1-D of one length (no broadcasting moves an entry), else None."""
    cond = g.producer(node.inputs[0])
    target = node.inputs[2]
    if cond is None or cond.op_type != "Equal" or cond.domain not in ("", "ai.onnx") or target not in cond.inputs:
        return None
    other = cond.inputs[1] if cond.inputs[0] == target else cond.inputs[0]
    n = vector_length(g, target)
    if n is None or any(vector_length(g, t) != n for t in (other, node.inputs[1])):
        return None
    entry, against = dim_source(g, target, k, depth + 1), dim_source(g, other, k, depth + 1)
    if entry is None or not isinstance(against, int):
        return None
    if isinstance(entry, tuple):
        return entry if against < 0 else None
    return dim_source(g, node.inputs[1], k, depth + 1) if entry == against else entry


def _keeps_leading(g, node, dim: int) -> str | None:
    """The input of ``node`` whose dim ``dim`` its output keeps, or None: ops that change only the last
    axis (a Split of it, a matmul-mode projection, a norm over it) or nothing (elementwise of one data
    input, Cast)."""
    rank = len(g.shape(node.outputs[0]) or ()) or None
    if node.domain in ("", "ai.onnx"):
        if node.op_type in ("Cast", "Identity", "Relu", "Gelu", "Tanh", "Sigmoid", "Erf", "Neg"):
            return node.inputs[0]
        if node.op_type == "Split" and rank is not None and int(node.attr("axis", 0)) in (-1, rank - 1) and dim < rank - 1:
            return node.inputs[0]
        return None
    if node.domain == "graphopt" and rank is not None and dim < rank - 1:
        mode = node.attr("mode", "matmul")
        if node.op_type == "GemmAct" and (mode.decode() if isinstance(mode, bytes) else mode) == "matmul":
            return node.inputs[0]
        if node.op_type in ("LayerNorm", "RMSNorm"):
            return node.inputs[0]
    return None


def same_dim(g, a: str, b: str, dim: int) -> bool:
    """Whether dim ``dim`` of tensors a and b is provably the same: equal ints, one tensor, or one made
    from the other by ops that keep that dim."""
    sa, sb = g.shape(a), g.shape(b)
    if sa is not None and sb is not None and dim < min(len(sa), len(sb)):
        da, db = sa[dim], sb[dim]
        if isinstance(da, int) and isinstance(db, int):
            return da == db
        if same_size(da, db):
            return True
    return _reaches(g, a, b, dim) or _reaches(g, b, a, dim)


def _reaches(g, a: str, b: str, dim: int) -> bool:
    """b is a, or a is made from b through ops that keep dim ``dim``."""
    for _ in range(MAX_DEPTH):
        if a == b:
            return True
        node = g.producer(a)
        if node is None:
            return False
        a = _keeps_leading(g, node, dim)
        if a is None:
            return False
    return False
