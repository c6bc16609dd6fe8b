"""``--explain``'s list of unfused chains: every Conv, Gemm or MatMul whose output feeds an
activation that no rule took, with the reason.

Run after the fusion rules. The reason is, in order: the near-misses of rules anchored at the
activation (why the rule that would take the chain did not fire), or that no rule covers the pair,
or that the producer's output has another consumer or is a graph output (rules never fuse across it).
"""

from __future__ import annotations

from graphopt.rewrite._engine import _provenance_sources
from graphopt.rewrite._rules import RuleSet
from graphopt.rewrite._syntax import OpPat, pattern_ops

PRODUCERS = ("Conv", "Gemm", "MatMul")
ACTIVATIONS = ("Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Clip", "Elu", "Selu",
               "Celu", "Gelu", "Softplus", "Softsign", "Mish", "ThresholdedRelu")


def _pairs(ruleset: RuleSet) -> set[tuple[str, str]]:
    """(producer op, activation op) pairs some rule's pattern nests, directly or through one Add/Mul."""
    pairs = set()
    for rule in ruleset.rules:
        for p in pattern_ops(rule.pattern):
            if p.domain or p.op not in ACTIVATIONS:
                continue
            for a in p.args:
                if not isinstance(a, OpPat):
                    continue
                inner = [a] + [b for b in a.args if isinstance(b, OpPat)] if a.op in ("Add", "Mul") else [a]
                pairs.update((b.op, p.op) for b in inner if not b.domain and b.op in PRODUCERS)
    return pairs


def unfused_chains(graph, ruleset: RuleSet, near_misses=()) -> list[dict]:
    """One entry per producer -> activation left in ``graph``: node names, ops and the reason."""
    covered = _pairs(ruleset)
    misses: dict[str, list] = {}
    for m in near_misses:
        misses.setdefault(m.anchor, []).append(m)
    out = []
    for g, node in graph.walk():
        op, name = _producer(node)
        if op is None or not node.outputs:
            continue
        tensor = node.outputs[0]
        users = g.consumers(tensor)
        hops = [(u, None) for u in users]
        if op in ("MatMul", "Gemm"):  # MatMul -> Add(bias) -> activation
            hops += [(v, u) for u in users if u.op_type == "Add" and u.outputs for v in g.consumers(u.outputs[0])]
        for act, via in hops:
            if act.domain or act.op_type not in ACTIVATIONS:
                continue
            chain = f"{op} -> {'Add -> ' if via is not None else ''}{act.op_type}"
            out.append({"node": name, "op": op, "activation": act.name,
                        "activation_op": act.op_type, "chain": chain,
                        "reason": _reason(g, op, tensor, users, act, covered, misses)})
    return out


# the late rules that turn a lone producer into a graphopt op without activation: it stands for that producer
_STANDINS = {"conv_alone": "Conv", "gemm_alone": "Gemm", "matmul_alone": "MatMul"}


def _producer(node) -> tuple[str | None, str]:
    """(producer op, the name to show): a Conv/Gemm/MatMul, or the CBR / GemmAct a late rule
    (conv_alone, gemm_alone, matmul_alone) made of one that no fusion took, by its original name."""
    if not node.domain and node.op_type in PRODUCERS:
        return node.op_type, node.name
    doc = node.doc_string or ""
    for rule, op in _STANDINS.items():
        if node.domain == "graphopt" and f"rule={rule} " in doc:
            sources = _provenance_sources(node)
            return op, sources[0] if sources else node.name
    return None, node.name


def _reason(g, op, tensor, users, act, covered, misses) -> str:
    if (op, act.op_type) not in covered:
        return f"no rule fuses {op} -> {act.op_type}"
    found = misses.get(act.name, [])
    related = [m for m in found if op in m.rule.lower() or op.lower() in m.rule.lower()] or found
    if related:
        return "; ".join(f"{m.rule}: {m.reason}" for m in related[:3]) + (
            f" (and {len(related) - 3} more near-misses)" if len(related) > 3 else "")
    if len(users) > 1:
        return f"{op} output {tensor!r} has {len(users)} consumers; rules never fuse across it"
    if g.is_graph_output(tensor):
        return f"{op} output {tensor!r} is a graph output; rules never fuse across it"
    return "the rules for this pair did not match here and recorded no near-miss"
