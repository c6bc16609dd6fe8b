"""``fold_constants``: evaluate nodes whose inputs are all constants, with a size cap."""

from __future__ import annotations

from graphopt.ir import Graph, Node

from graphopt.passes._evaluate import NotFoldable, evaluate
from graphopt.passes._util import Trace, opset_version, replace_with_initializers, report

NAME = "fold_constants"

#: Default cap on the bytes a folded node may produce (all its outputs together): 16 MiB.
DEFAULT_LIMIT_BYTES = 16 * 2**20

#: Ops never folded: their result is random (differs per run) or they are handled by another pass.
NEVER_FOLD = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",  # random in training mode; eliminate_dropout removes the inference-mode ones
        "Constant",  # already a value; constants_to_initializers turns it into an initializer
    }
)


def _why_not(graph: Graph, node: Node) -> str | None:
    if node.domain != "":
        return f"domain {node.domain!r} is not folded (only standard ONNX ops are)"
    if node.op_type in NEVER_FOLD:
        return f"{node.op_type} is never folded"
    if node.subgraphs():
        return "ops with subgraphs are never folded"
    if not any(node.inputs):
        return "it has no inputs"
    for t in node.inputs:
        if t and not graph.is_constant(t):
            return f"input {t!r} is not a constant"
    return None


def fold_constants(graph: Graph, *, limit_bytes: int = DEFAULT_LIMIT_BYTES, trace: Trace = None) -> int:
    """Replace each node whose inputs are all constants by initializers holding its outputs.

    Constants are initializers that are not graph inputs and ``Constant`` outputs, also from outer
    scopes. Output names are kept. The output size is computed by shape inference before anything
    is evaluated; nodes whose outputs are not fully known or take more than ``limit_bytes`` are
    left alone. Random ops, ops with subgraphs and non-standard domains are never folded. Nodes are
    visited in graph order, so a chain of constant nodes folds in one call. Returns the number of
    nodes folded.
    """
    changes = 0
    for g, node in list(graph.walk()):
        if node not in g:
            continue
        reason = _why_not(g, node)
        if reason is not None:
            if not reason.startswith("input") and not reason.startswith("it has no"):
                report(trace, NAME, node, reason)
            continue
        values = {}
        for t in node.inputs:
            if t and t not in values:
                values[t] = g.constant_value(t)
                if values[t] is None:  # constant but unreadable (e.g. a tensor attribute it cannot decode)
                    break
        if any(v is None for v in values.values()):
            report(trace, NAME, node, "a constant input could not be read")
            continue
        try:
            results = evaluate(node, values, opset_version(g), limit_bytes)
        except NotFoldable as exc:
            report(trace, NAME, node, str(exc))
            continue
        outputs = iter(results)
        replace_with_initializers(g, node, [next(outputs) if t else None for t in node.outputs])
        changes += 1
    return changes
