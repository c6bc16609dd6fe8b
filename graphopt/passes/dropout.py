"""``eliminate_dropout``: remove inference-mode ``Dropout`` nodes (they copy their input)."""

from __future__ import annotations

import numpy as np

from graphopt.ir import Graph, Node

from graphopt.passes._util import Trace, bypass_each, is_used, opset_version

NAME = "eliminate_dropout"


def _why_not_inference(graph: Graph, node: Node) -> str | None:
    """None when this Dropout is the identity on its first output, else the reason it may not be."""
    if not node.inputs or not node.inputs[0] or not node.outputs or not node.outputs[0]:
        return "Dropout without a data input or output"
    if len(node.outputs) > 1 and is_used(graph, node.outputs[1]):
        return f"its mask output {node.outputs[1]!r} is used"
    if opset_version(graph) < 7:
        # Dropout-1/-6 run in training mode unless is_test is set (spec default is_test=0).
        if not node.attr("is_test", 0):
            return "opset < 7 Dropout without is_test=1 runs in training mode"
        return None
    training = node.inputs[2] if len(node.inputs) > 2 else ""
    if training:
        value = graph.constant_value(training)
        if value is None:
            return f"training_mode input {training!r} is not a constant"
        if value.size != 1 or bool(np.asarray(value).reshape(-1)[0]):
            return f"training_mode input {training!r} is true"
    return None


def eliminate_dropout(graph: Graph, *, trace: Trace = None) -> int:
    """Remove every Dropout that is an identity at inference; returns the number removed.

    A Dropout qualifies when its mask output is absent or unused and its ``training_mode`` input is
    absent or a constant false (opset >= 12), or always for opsets 7-11, or with ``is_test=1`` for
    opsets < 7. Graph outputs keep their names as in ``eliminate_identity``.
    """
    return bypass_each(graph, "Dropout", NAME, _why_not_inference, trace)
