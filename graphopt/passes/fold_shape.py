"""``fold_shape``: replace ``Shape``/``Size`` of a statically known tensor, and a ``Gather`` of the
static dims of a ``Shape``, by constants (the arithmetic behind them is then ``fold_constants``'s)."""

from __future__ import annotations

import math

import numpy as np

from graphopt.ir import Graph

from graphopt.passes._util import Trace, replace_with_initializers

NAME = "fold_shape"


def _static(d) -> bool:
    return isinstance(d, int) and not isinstance(d, bool) and d >= 0


def _returned_dims(g, node) -> list | None:
    """The dims of x that ``Shape(x)`` returns (its opset-15 ``start``/``end`` slice applied; ONNX
    clamps them like Python slicing, negative counts from the end), or all of them for ``Size(x)``;
    None when x's shape is unknown. Read once per node: ``_shape_value`` and ``_gathered_dims`` share it."""
    shape = g.value_info(node.inputs[0]).shape
    if shape is None:
        return None
    if node.op_type == "Size":
        return list(shape)
    start, end = int(node.attr("start", 0)), node.attr("end")
    return list(shape)[start : None if end is None else int(end)]


def _shape_value(node, dims: list) -> np.ndarray | None:
    """The value of ``Shape(x)`` or ``Size(x)`` when every dim in ``dims`` (``_returned_dims``) is
    known, else None."""
    if not all(_static(d) for d in dims):
        return None
    return np.array(math.prod(dims), dtype=np.int64) if node.op_type == "Size" else np.array(dims, dtype=np.int64)


def _gathered_dims(g, gather, dims: list) -> np.ndarray | None:
    """``Gather(Shape(x), idx, axis=0)``, ``dims`` what that Shape returns (``_returned_dims``), with
    constant idx picking static dims (the others may be symbolic: a dynamic-batch export's hidden
    size), else None."""
    if gather.op_type != "Gather" or gather.domain != "" or len(gather.inputs) != 2 or int(gather.attr("axis", 0)) != 0:
        return None
    idx = g.constant_value(gather.inputs[1])
    if idx is None or idx.dtype.kind not in "iu":
        return None
    flat = [int(i) for i in np.asarray(idx).reshape(-1)]
    if any(not -len(dims) <= i < len(dims) for i in flat):
        return None
    picked = [dims[i] for i in flat]
    if not all(_static(d) for d in picked):
        return None
    return np.array(picked, dtype=np.int64).reshape(np.shape(idx))


def fold_shape(graph: Graph, *, trace: Trace = None) -> int:
    """Replace ``Shape(x)`` (with its ``start``/``end`` slice, opset 15) and ``Size(x)`` by int64
    initializers when the IR knows the dims they return (from graph inputs, initializers or
    value_info), and ``Gather(Shape(x), constant indices)`` when the gathered dims are known even
    though others are symbolic. Returns the number of nodes replaced.
    """
    changes = 0
    for g, node in graph.find("Shape", "Size"):  # through the op index, not a walk over every node
        if node.op_type not in ("Shape", "Size") or node.domain != "" or node not in g:
            continue
        if len(node.inputs) != 1 or not node.inputs[0] or len(node.outputs) != 1 or not node.outputs[0]:
            continue
        dims = _returned_dims(g, node)
        if dims is None:
            continue
        value = _shape_value(node, dims)
        if value is not None:
            replace_with_initializers(g, node, [value])
            changes += 1
            continue
        if node.op_type != "Shape":
            continue
        for user in list(g.consumers(node.outputs[0])):
            if user not in g or node.outputs[0] not in user.inputs[:1]:
                continue  # (so its first input is this Shape's output)
            picked = _gathered_dims(g, user, dims)
            if picked is not None and len(user.outputs) == 1 and user.outputs[0]:
                replace_with_initializers(g, user, [picked])
                changes += 1
    return changes
