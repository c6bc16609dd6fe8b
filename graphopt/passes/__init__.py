"""Cleanup passes: each is ``pass(graph, *, trace=None) -> int`` (the number of changes).

Every pass works on ``graphopt.ir.Graph`` through its mutation API only, recurses into If/Loop/Scan
bodies, keeps graph-output names, and is idempotent (a second run reports 0 changes). ``trace``,
when given, is called as ``trace(pass_name, node_name, reason)`` for each near-miss a pass rejects.

``run_cleanup`` runs them in a fixed order until nothing changes (bounded), and returns the number
of changes per pass.
"""

from __future__ import annotations

from graphopt.ir import Graph, refine_shapes

from graphopt.passes._util import Trace
from graphopt.passes.cast import eliminate_noop_cast
from graphopt.passes.constants import constants_to_initializers
from graphopt.passes.conv_bn import fold_conv_bn
from graphopt.passes.conv_mul_add import fold_conv_mul_add
from graphopt.passes.dead_code import dead_code
from graphopt.passes.dropout import eliminate_dropout
from graphopt.passes.fold_constants import DEFAULT_LIMIT_BYTES, DEFAULT_TOTAL_BYTES, FoldBudget, fold_constants
from graphopt.passes.fold_shape import fold_shape
from graphopt.passes.global_pool import reduce_to_global_pool
from graphopt.passes.identity import eliminate_identity
from graphopt.passes.identity_reshape import eliminate_identity_reshape
from graphopt.passes.merge_duplicates import merge_duplicates
from graphopt.passes.pad_conv import fold_pad_into_conv
from graphopt.passes.reshape_dims import infer_reshape_dims
from graphopt.passes.single_concat import eliminate_single_concat
from graphopt.passes.transposes import fold_transposes

__all__ = [
    "DEFAULT_LIMIT_BYTES",
    "DEFAULT_TOTAL_BYTES",
    "CLEANUP_ORDER",
    "FoldBudget",
    "constants_to_initializers",
    "dead_code",
    "eliminate_dropout",
    "eliminate_identity",
    "eliminate_identity_reshape",
    "eliminate_noop_cast",
    "eliminate_single_concat",
    "fold_constants",
    "fold_conv_bn",
    "fold_conv_mul_add",
    "fold_pad_into_conv",
    "fold_shape",
    "fold_transposes",
    "infer_reshape_dims",
    "merge_duplicates",
    "reduce_to_global_pool",
    "run_cleanup",
]

#: The order ``run_cleanup`` applies the passes in, by name. Copies go first so the folds see the
#: real producers; constants are folded before the Conv folds need constant operands; dead code
#: last removes what the others orphaned (for example a weight no longer read); duplicates are merged
#: after the folds, whose results may make two nodes equal.
CLEANUP_ORDER = (
    "eliminate_identity",
    "eliminate_single_concat",
    "eliminate_noop_cast",
    "eliminate_dropout",
    "constants_to_initializers",
    "fold_shape",
    "fold_constants",
    "infer_reshape_dims",
    "eliminate_identity_reshape",
    "fold_transposes",
    "reduce_to_global_pool",
    "fold_pad_into_conv",
    "fold_conv_bn",
    "fold_conv_mul_add",
    "merge_duplicates",
    "dead_code",
)


def run_cleanup(
    graph: Graph,
    *,
    fold_limit_bytes: int = DEFAULT_LIMIT_BYTES,
    fold_total_bytes: int = DEFAULT_TOTAL_BYTES,
    max_rounds: int = 8,
    disable: tuple[str, ...] | list[str] = (),
    trace: Trace = None,
    refine: bool = False,
) -> dict[str, int]:
    """Run the cleanup passes in ``CLEANUP_ORDER`` until a round changes nothing, at most
    ``max_rounds`` rounds; returns ``{pass name: total changes}`` (every pass, in order, zeros too).

    ``fold_limit_bytes`` caps what constant folding may create per node, ``fold_total_bytes`` what
    it may create in all (over all rounds). ``disable`` names passes
    to skip. The result is deterministic: passes visit nodes in graph order. ``trace`` receives the
    near-misses of the last round only (earlier rounds' near-misses may have been resolved later).

    ``refine`` (the optimize pipeline sets it): while Shape/Size nodes remain, infer the shapes
    again after a round that changed something (``graphopt.ir.refine_shapes``), so a folded shape
    computation makes the tensors behind it static and their Shapes fold in the next round.
    """
    budget = FoldBudget(total_bytes=fold_total_bytes)
    passes = {
        "eliminate_identity": eliminate_identity,
        "eliminate_single_concat": eliminate_single_concat,
        "eliminate_noop_cast": eliminate_noop_cast,
        "eliminate_dropout": eliminate_dropout,
        "constants_to_initializers": constants_to_initializers,
        "fold_shape": fold_shape,
        "fold_constants": lambda g, trace=None: fold_constants(g, limit_bytes=fold_limit_bytes, budget=budget, trace=trace),
        "infer_reshape_dims": infer_reshape_dims,
        "eliminate_identity_reshape": eliminate_identity_reshape,
        "fold_transposes": fold_transposes,
        "reduce_to_global_pool": reduce_to_global_pool,
        "fold_pad_into_conv": fold_pad_into_conv,
        "fold_conv_bn": fold_conv_bn,
        "fold_conv_mul_add": fold_conv_mul_add,
        "merge_duplicates": merge_duplicates,
        "dead_code": dead_code,
    }
    unknown = [name for name in disable if name not in passes]
    if unknown:
        raise ValueError(f"unknown cleanup pass(es) {', '.join(map(repr, unknown))}; known: {', '.join(CLEANUP_ORDER)}")
    totals = {name: 0 for name in CLEANUP_ORDER}
    for _ in range(max_rounds):
        notes: list[tuple[str, str, str]] = []
        changed = 0
        for name in CLEANUP_ORDER:
            if name in disable:
                continue
            count = passes[name](graph, trace=lambda p, n, r: notes.append((p, n, r)))
            totals[name] += count
            changed += count
        if not changed:
            break
        if refine and any(True for _ in graph.find("Shape", "Size")) and not refine_shapes(graph):
            refine = False  # inference proves nothing new: later rounds need not ask again
    if trace is not None:
        for note in notes:
            trace(*note)
    return totals
