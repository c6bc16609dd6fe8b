"""``fold_constants``: evaluate nodes whose inputs are all constants, with a size cap."""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.ir import Graph, Node

from graphopt.passes._evaluate import NotFoldable, evaluate
from graphopt.passes._util import Trace, only_consumer, opset_version, replace_with_initializers, report

NAME = "fold_constants"

#: Default cap on the bytes a folded node may produce (all its outputs together): 16 MiB.
DEFAULT_LIMIT_BYTES = 16 * 2**20
#: Default cap on the bytes all folds of one ``run_cleanup`` (or one ``fold_constants`` call) may
#: create together, so that many nodes just under the per-node cap cannot add up: 1 GiB.
DEFAULT_TOTAL_BYTES = 2**30


@dataclass
class FoldBudget:
    """How many bytes folding may still create; shared by the rounds of ``run_cleanup``."""

    total_bytes: int = DEFAULT_TOTAL_BYTES
    spent_bytes: int = 0

    @property
    def left(self) -> int:
        return max(0, self.total_bytes - self.spent_bytes)

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


#: Ops whose one output holds exactly their data input's elements, re-laid out. The per-node cap is for
#: ops that grow a model (Expand, Tile, ConstantOfShape, a large Range); folding one of these adds at
#: most its input's bytes (nothing once the input has no other reader and dead code drops it), and
#: leaving it costs every run a copy: the dynamo exporter writes a tied lm_head as
#: ``MatMul(x, Transpose(W))`` with W shared by the embedding (GPT-2: 154 MB in fp32), and unfolded the
#: MatMul has no constant weight, so no GemmAct and no tuned lowering (H200, 805f74b: the dynamo GPT-2
#: export 1.96x torch.compile at bs32 against 0.88 for the TorchScript export). They are held to the
#: run's total budget only, and only where the input is read elsewhere too (a copy the model then keeps).
RELAYOUT = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
#: The cap of a re-layout that replaces its input (read nowhere else): it adds nothing, so nothing bounds it.
NO_CAP = 2**63


def _all_inputs_constant(graph: Graph, node: Node) -> bool:
    """True when the node reads at least one tensor and every tensor it reads is a constant."""
    # A plain loop (no generators): every node of every graph is asked this on every call.
    reads = False
    for t in node.inputs:
        if t:
            if not graph.is_constant(t):
                return False
            reads = True
    return reads


def _sole_reader(graph: Graph, node: Node) -> bool:
    """Whether ``node`` is the only reader of its data input, an initializer of its own graph that is not a
    graph output (folding it then drops that initializer as dead: nothing is added)."""
    data = node.inputs[0] if node.inputs else ""
    return bool(data) and graph.is_initializer(data) and only_consumer(graph, data) is node


def _why_not(node: Node) -> str | None:
    """Why a node with constant inputs must not be folded, or None."""
    if node.domain != "":
        return f"domain {node.domain!r} is not folded (only standard ONNX ops are)"
    if node.op_type in NEVER_FOLD:
        return f"{node.op_type} is never folded"
    if node.subgraphs():
        return "ops with subgraphs are never folded"
    return None


def fold_constants(
    graph: Graph,
    *,
    limit_bytes: int = DEFAULT_LIMIT_BYTES,
    budget: FoldBudget | None = None,
    trace: Trace = None,
) -> int:
    """Replace each node whose inputs are all constants by initializers holding its outputs.

    Constants are initializers that are not graph inputs and ``Constant`` outputs, also from outer
    scopes. Output names are kept. The output size is computed by shape inference before anything
    is evaluated; nodes whose outputs are not fully known or take more than ``limit_bytes`` are
    left alone, and so is every node once ``budget`` (default: a fresh ``FoldBudget``) is spent.
    Random ops, ops with subgraphs and non-standard domains are never folded. Nodes are
    visited in graph order, so a chain of constant nodes folds in one call. Returns the number of
    nodes folded.
    """
    budget = budget if budget is not None else FoldBudget()
    changes = 0
    for g, node in list(graph.walk()):
        if node not in g or node.op_type == "Constant" or not _all_inputs_constant(g, node):
            continue  # not a candidate: nothing to report
        reason = _why_not(node)
        if reason is not None:
            report(trace, NAME, node, reason)
            continue
        values = {t: g.constant_value(t) for t in node.inputs if t}
        if any(v is None for v in values.values()):
            report(trace, NAME, node, "a constant input could not be read as an array")
            continue
        relayout = node.op_type in RELAYOUT
        free = relayout and _sole_reader(g, node)
        if free:
            cap = NO_CAP
        elif relayout:
            cap = budget.left
        else:
            cap = min(limit_bytes, budget.left)
        try:
            results = evaluate(node, values, opset_version(g), cap)
        except NotFoldable as exc:
            reason = str(exc)
            if cap < limit_bytes and "over the folding limit" in reason:
                reason += f" (the {budget.total_bytes}-byte folding budget of this run is nearly spent)"
            report(trace, NAME, node, reason)
            continue
        if not free:  # a re-layout of a constant read nowhere else replaces it: the model does not grow
            budget.spent_bytes += sum(r.nbytes for r in results)
        outputs = iter(results)
        replace_with_initializers(g, node, [next(outputs) if t else None for t in node.outputs])
        changes += 1
    return changes
