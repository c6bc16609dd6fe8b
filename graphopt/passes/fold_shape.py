"""``fold_shape``: replace ``Shape``/``Size`` of a tensor whose shape is fully static by a constant."""

from __future__ import annotations

import math

import numpy as np

from graphopt.ir import Graph

from graphopt.passes._util import Trace, replace_with_initializers

NAME = "fold_shape"


def fold_shape(graph: Graph, *, trace: Trace = None) -> int:
    """Replace ``Shape(x)`` (with its ``start``/``end`` slice, opset 15) and ``Size(x)`` by int64
    initializers when the IR knows a fully static shape for ``x`` (from graph inputs, initializers or
    value_info). Shapes with symbolic or unknown dims are left alone. Returns the number replaced.
    """
    changes = 0
    for g, node in graph.find("Shape", "Size"):  # through the op index, not a walk over every node
        if node.op_type not in ("Shape", "Size") or node.domain != "" or node not in g:
            continue
        if len(node.inputs) != 1 or not node.inputs[0] or len(node.outputs) != 1 or not node.outputs[0]:
            continue
        info = g.value_info(node.inputs[0])
        if not info.is_static:
            continue
        dims = [int(d) for d in info.shape]
        if node.op_type == "Size":
            value = np.array(math.prod(dims), dtype=np.int64)
        else:
            # ONNX clamps start/end like Python slicing does (negative counts from the end).
            start, end = int(node.attr("start", 0)), node.attr("end")
            value = np.array(dims[start : None if end is None else int(end)], dtype=np.int64)
        replace_with_initializers(g, node, [value])
        changes += 1
    return changes
