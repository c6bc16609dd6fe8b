"""``fold_transposes``: the transpose chains exporters write, each made one Transpose (or none).

1. ``Transpose(Transpose(x, p), q)``, the inner one read by nothing else  ==>  ``Transpose(x, p[q])``,
   and no node at all where that is the identity.
2. The swap of the last two axes through a 3-D view, which the dynamo exporter writes for a batched
   MatMul with a transposed operand (attention's K^T in GPT-2, BERT and ViT):
   ``Reshape(Transpose(Reshape(x, [-1, d(n-2), d(n-1)]), perm 0,2,1), [d(0), .., d(n-3), d(n-1), d(n-2)])``
   ==> ``Transpose(x, perm 0, .., n-3, n-1, n-2)``. Both targets are read term by term from x's own
   shape (``_shape_terms``; the batch and sequence dims are symbolic in these exports).

Why: each Transpose is a copy at run time, and the fusion rules see a head split only as one Transpose of
``[B, S, H, D]`` (``attention_qkv_bshd``): in the dynamo GPT-2 / BERT / ViT exports four Transposes a layer
stayed around the attention, against none in the TorchScript exports.
"""

from __future__ import annotations

from graphopt.ir import Graph

from graphopt.passes._shape_terms import is_dim, shape_terms
from graphopt.passes._util import Trace, bypass, only_consumer, report

NAME = "fold_transposes"


def _perm(g: Graph, node, rank: int | None = None) -> list[int] | None:
    """The node's perm; without the attribute, reversed axes of its input's rank (or ``rank``, a
    neighbouring Transpose's)."""
    perm = node.attr("perm")
    if perm is not None:
        return [int(p) for p in perm]
    shape = g.value_info(node.inputs[0]).shape
    rank = len(shape) if shape is not None else rank
    return None if rank is None else list(range(rank))[::-1]


def _producer(g: Graph, tensor: str, op_type: str):
    node = g.producer(tensor)
    return node if node is not None and node.op_type == op_type and node.domain == "" else None


def _fold_pair(g: Graph, outer, trace: Trace) -> int:
    inner = _producer(g, outer.inputs[0], "Transpose")
    if inner is None:
        return 0
    if only_consumer(g, inner.outputs[0]) is not outer:
        report(trace, NAME, outer, f"the Transpose before it, {inner.name!r}, has another reader")
        return 0
    p = _perm(g, inner, len(outer.attr("perm") or ()) or None)
    q = _perm(g, outer, len(p) if p else None)
    if p is None or q is None or len(p) != len(q):
        report(trace, NAME, outer, "a perm is unknown (no perm attribute and an unknown rank)")
        return 0
    composed = [p[i] for i in q]
    x, y = inner.inputs[0], outer.outputs[0]
    if composed == list(range(len(composed))):
        reason = bypass(g, outer, x, y)  # the inner one then has no reader: dead code removes it
        if reason is not None:
            report(trace, NAME, outer, reason)
            return 0
        return 1
    g.replace_subgraph([inner, outer], [{"op_type": "Transpose", "inputs": [x], "outputs": [y], "name": outer.name,
                                         "attrs": {"perm": composed}}])
    return 1


def _swap_reason(g: Graph, r2) -> tuple[str | None, tuple]:
    """Why Reshape ``r2`` does not end a last-two-axes swap through a 3-D view (None: it does)."""
    t = _producer(g, r2.inputs[0], "Transpose") if len(r2.inputs) == 2 else None
    if t is None or _perm(g, t) != [0, 2, 1]:
        return "its input is not a 3-D Transpose(perm 0,2,1)", ()
    r1 = _producer(g, t.inputs[0], "Reshape")
    if r1 is None or len(r1.inputs) != 2:
        return "the Transpose's input is not a Reshape", ()
    if only_consumer(g, t.outputs[0]) is not r2 or only_consumer(g, r1.outputs[0]) is not t:
        return "the 3-D view or its Transpose has another reader", ()
    x = r1.inputs[0]
    shape = g.value_info(x).shape
    if shape is None or len(shape) < 3:
        return f"the rank of {x!r} is unknown or under 3", ()
    n = len(shape)
    first, second = shape_terms(g, r1.inputs[1], x), shape_terms(g, r2.inputs[1], x)
    if first is None or second is None:
        return f"a target is not made of {x!r}'s own dims and constants", ()
    view = len(first) == 3 and first[0] == ("const", -1) and is_dim(first[1], n - 2, shape) and is_dim(first[2], n - 1, shape)
    if not view:
        return f"the first Reshape is not [-1, d{n - 2}, d{n - 1}] of {x!r}", ()
    order = list(range(n - 2)) + [n - 1, n - 2]
    if len(second) != n or not all(is_dim(term, i, shape) for term, i in zip(second, order)):
        return f"the second Reshape is not {x!r}'s dims with the last two swapped", ()
    return None, (r1, t, x, order)


def _fold_swap(g: Graph, r2, trace: Trace) -> int:
    reason, found = _swap_reason(g, r2)
    if reason is not None:
        t = _producer(g, r2.inputs[0], "Transpose")
        if t is not None and _perm(g, t) == [0, 2, 1]:  # the near-misses worth naming: a 3-D swap that stays
            report(trace, NAME, r2, reason)
        return 0
    r1, t, x, order = found
    g.replace_subgraph([r1, t, r2], [{"op_type": "Transpose", "inputs": [x], "outputs": [r2.outputs[0]],
                                      "name": t.name, "attrs": {"perm": order}}])
    return 1  # the shape computation behind the two targets is left to dead code


def fold_transposes(graph: Graph, *, trace: Trace = None) -> int:
    """Fold every last-two-axes swap through a 3-D view, then every Transpose of a Transpose; returns
    the number of folds."""
    changes = 0
    for g, node in graph.find("Reshape"):
        if node.domain == "" and node in g:
            changes += _fold_swap(g, node, trace)
    for g, node in graph.find("Transpose"):
        if node.domain == "" and node in g:
            changes += _fold_pair(g, node, trace)
    return changes
