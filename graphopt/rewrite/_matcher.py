"""Structural matching of one pattern at one anchor node.

The engine hands the matcher a candidate whose op type already equals the pattern root's (found
through ``graph.nodes_by_op``), so the work per candidate is bounded by the pattern's size and
matching a graph costs time linear in the number of candidates: no whole-graph isomorphism search.

Matching is a backtracking generator: commutative ops (Add, Mul, Max, Min, Sum) try every operand
order, and each complete structural match is yielded so the engine can check it and, when a
constraint fails, move on to the next order. A variable seen twice must bind the same tensor;
``x as name`` binds the node and, as a tensor, the output that was matched. Failures are recorded
in a ``Trace`` with how far the match got, so ``--explain`` reports the most specific reason.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from graphopt.rewrite._syntax import OpPat, VarPat
from graphopt.rewrite.casts import type_name


@dataclass
class Binding:
    """One (partial) match: tensor and node captures, matched nodes in post-order, and the tensor
    each matched node was reached through."""

    tensors: dict
    nodes: dict
    matched: list  # [(Node, OpPat)] children before parents
    via: dict  # node name -> tensor through which the parent reads it
    seen: int = 0  # pattern ops whose op type matched so far (pre-order): how far the match got

    def copy(self) -> "Binding":
        return Binding(dict(self.tensors), dict(self.nodes), list(self.matched), dict(self.via), self.seen)

    def progress(self) -> int:
        return self.seen * 1000 + len(self.tensors)

    def matched_names(self) -> list[str]:
        return [n.name for n, _ in self.matched]


class Trace:
    """Keeps the failure reason of the attempt that matched the most pattern ops."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.best_progress = -1
        self.reason: str | None = None

    @property
    def ops_matched(self) -> int:
        """How many pattern ops matched by type in the attempt that got furthest."""
        return max(self.best_progress, 0) // 1000

    def fail(self, b: "Binding", message) -> None:
        if self.enabled:
            progress = b.progress()
            if progress > self.best_progress:
                self.best_progress = progress
                self.reason = message() if callable(message) else message


def _present(inputs: list[str]) -> list[str]:
    """Inputs with trailing omitted ("") optional inputs dropped."""
    end = len(inputs)
    while end and not inputs[end - 1]:
        end -= 1
    return inputs[:end]


def _orders(pat: OpPat, n: int):
    if pat.any_order:
        return itertools.permutations(range(n))
    return [tuple(range(n))]


def could_match(g, pat: OpPat, node) -> bool:
    """False when ``pat`` cannot match at ``node``: the node is not of the pattern's op, has more
    inputs than it has arguments, or some op argument has no producer of its skeleton at its
    position (at any position for an op matched in any order).

    A relaxation of ``match_root`` (captures and matching a node twice are not checked), so it
    never refuses a match; it is cheap because it stops at the first op that differs without
    building bindings or trying operand orders. On the 21k-node GPT-2 it turns away 17,408 of the
    18,335 candidates of the shipped rules, and every one it lets through matches."""
    if node.op_type != pat.op or (node.domain or "") not in pat.domains:
        return False
    inputs = node.inputs
    n = len(pat.args)
    if len(inputs) > n and any(inputs[n:]):
        return False
    producer = g.producer
    for i, sub in pat.op_args:
        # plain loops, not any(generator): this runs 46,000 times on GPT-2
        for t in (inputs if pat.any_order else inputs[i:i + 1]):
            p = producer(t) if t else None
            if p is not None and could_match(g, sub, p):
                break
        else:
            return False
    return True


def _quick_reject(g, pat: OpPat, node) -> bool:
    """True when some op child of the root has no producer of its op among the root's inputs."""
    for arg in pat.args:
        if isinstance(arg, OpPat):
            for t in node.inputs:
                p = g.producer(t) if t else None
                if p is not None and p.op_type == arg.op:
                    break
            else:
                return True
    return False


def match_root(g, pat: OpPat, node, trace: Trace):
    """Yield every complete ``Binding`` of ``pat`` rooted at ``node``."""
    # Also with explain: a candidate whose root lacks a producer for one of its op children is a
    # different subgraph, not a near-miss.
    if _quick_reject(g, pat, node):
        return
    out = node.outputs[0] if node.outputs else ""
    yield from _match_node(g, pat, node, out, Binding({}, {}, [], {}), trace)


def _match_node(g, pat: OpPat, node, via: str, b: Binding, trace: Trace):
    if node.op_type != pat.op or (node.domain or "") not in pat.domains:
        trace.fail(b, lambda: f"{via!r} is produced by {_kind(node)} {node.name!r}{_cast_note(g, node)}, not {pat.qualname}")
        return
    b = Binding(b.tensors, b.nodes, b.matched, b.via, b.seen + 1)  # shares dicts: they are copied before writes
    if any(n is node for n, _ in b.matched):
        trace.fail(b, lambda: f"node {node.name!r} would be matched twice; bind it once with 'as' and reuse the name")
        return
    inputs = _present(list(node.inputs))
    if len(inputs) > len(pat.args):
        trace.fail(b, lambda: (f"{_kind(node)} {node.name!r} has {len(inputs)} inputs, the pattern gives "
                                      f"{len(pat.args)} (mark optional inputs with '?')"))
        return
    inputs = inputs + [""] * (len(pat.args) - len(inputs))
    for order in _orders(pat, len(pat.args)):
        ordered = [inputs[i] for i in order]
        for inner in _match_args(g, pat, node, pat.args, ordered, 0, b, trace):
            done = _bind_node(pat, node, via, inner, trace)
            if done is not None:
                yield done


def _bind_node(pat: OpPat, node, via: str, b: Binding, trace: Trace):
    b = b.copy()
    b.matched.append((node, pat))
    b.via[node.name] = via
    if pat.bind:
        prev = b.tensors.get(pat.bind, via)
        if prev != via:
            trace.fail(b, lambda: f"{pat.bind!r} is bound to {prev!r} but {node.name!r} produces {via!r}")
            return None
        b.tensors[pat.bind] = via
        b.nodes[pat.bind] = node
    return b


def _match_args(g, pat, node, args, inputs, i, b: Binding, trace: Trace):
    """Every binding of ``args[i:]`` to ``inputs[i:]``, depth first, with an explicit stack of
    generators (one per argument): a call with many arguments never nests Python frames."""
    if i == len(args):
        yield b
        return
    stack = [_match_arg(g, pat, node, args[i], inputs[i], i, b, trace)]
    while stack:
        nb = next(stack[-1], None)
        if nb is None:
            stack.pop()
            continue
        k = i + len(stack)
        if k == len(args):
            yield nb
        else:
            stack.append(_match_arg(g, pat, node, args[k], inputs[k], k, nb, trace))


def _match_arg(g, parent_pat, parent, arg, tensor: str, index: int, b: Binding, trace: Trace):
    if isinstance(arg, VarPat):
        if not tensor and not arg.optional:
            trace.fail(b, lambda: f"input {index} of {parent.name!r} is absent but the pattern needs {arg.name!r}")
            return
        if arg.name == "_":
            yield b
            return
        value = tensor or None
        if arg.name in b.tensors:
            if b.tensors[arg.name] != value:
                trace.fail(b, lambda: (f"{arg.name!r} is bound to {b.tensors[arg.name]!r}{_via_cast(g, b.tensors[arg.name])} "
                                              f"but input {index} of {parent.name!r} is {value!r}{_via_cast(g, value)}"))
                return
            yield b
            return
        nb = b.copy()
        nb.tensors[arg.name] = value
        yield nb
        return
    # An op sub-pattern: the input must be produced by a node of that op.
    if not tensor:
        trace.fail(b, lambda: f"input {index} of {parent.name!r} is absent, expected {arg.qualname}")
        return
    producer = g.producer(tensor)
    if producer is None:
        trace.fail(b, lambda: f"input {index} of {parent.name!r} ({tensor!r}) is {_what(g, tensor)}, not the output of {arg.qualname}")
        return
    yield from _match_node(g, arg, producer, tensor, b, trace)


def _what(g, tensor: str) -> str:
    if g.is_graph_input(tensor):
        return "a graph input"
    return "a constant" if g.constant_info(tensor) is not None else "defined outside this graph"


def _cast_note(g, node) -> str:
    """' (float16 -> float)' for a Cast node, so --explain names the conversion that blocked a match."""
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return ""
    src = g.dtype(node.inputs[0]) if node.inputs and node.inputs[0] else None
    return f" ({type_name(src)} -> {type_name(int(node.attr('to', 0)))})"


def _via_cast(g, tensor) -> str:
    """' (Cast 'c', float16 -> float)' when ``tensor`` is a Cast's output, else ''."""
    node = g.producer(tensor) if tensor else None
    if node is None or node.op_type != "Cast":
        return ""
    return f" (from Cast {node.name!r}{_cast_note(g, node)})"


def _kind(node) -> str:
    return f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
