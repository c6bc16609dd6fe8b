"""``merge_duplicates``: common-subexpression elimination, in every graph and subgraph.

Two nodes compute the same thing when they have the same op (domain, type), the same attributes
and the same inputs, where a small constant input counts by its value (dtype, shape, bytes), not by
its name: exports repeat per layer the same ``Where(mask, 0, -inf)`` on the same mask with their own
copies of 0 and -inf (GPT-2: 12 of them), and the same shape arithmetic. The later node of such a
pair is removed and its readers read the earlier one's outputs. Nodes are visited in graph order
(ONNX's topological order), so a merge upstream makes the nodes downstream of the pair equal too,
in one pass.

Never merged: ops whose result is random (``RandomNormal``...), nodes with subgraphs, nodes without
inputs (``Constant``: ``constants_to_initializers`` handles those), and a duplicate that writes a
graph output (its name is part of the model's interface). onnx's optimizer has the same pass
(``eliminate_common_subexpression``), but works on ``ModelProto``s, not on graphopt's IR, so it is
written here against the IR's mutation API.
"""

from __future__ import annotations

import hashlib

import numpy as np

from graphopt.ir import Graph
from graphopt.ir.node import Node

from graphopt.passes._util import Trace, report

NAME = "merge_duplicates"
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli", "Dropout"})
VALUE_KEY_MAX_BYTES = 4096  # constants up to this size are compared by value; larger ones by name


def _input_key(g: Graph, tensor: str, memo: dict[str, object]) -> object:
    if not tensor:
        return ""
    key = memo.get(tensor)
    if key is not None:
        return key
    key = tensor
    if g.is_constant(tensor) and _small(g, tensor) and tensor not in g.root.fp16_clamped:
        # (a constant the fp16 conversion clamped means more than its value: Graph.fp16_clamped; kept by name)
        value = g.constant_value(tensor)
        if value is not None:
            key = ("const", value.dtype.str, value.shape, hashlib.sha256(value.tobytes()).hexdigest())
    memo[tensor] = key
    return key


def _small(g: Graph, tensor: str) -> bool:
    """Whether a constant holds at most VALUE_KEY_MAX_BYTES (from its header: a weight is not decoded)."""
    info = g.constant_info(tensor)
    return info is not None and info[0].itemsize * int(np.prod(info[1])) <= VALUE_KEY_MAX_BYTES


def _mergeable(node: Node) -> bool:
    if node.op_type in RANDOM_OPS and node.domain in ("", "ai.onnx"):
        return False
    return bool(node.inputs) and bool(node.outputs) and not node.subgraphs()


def _coarse_key(g: Graph, node: Node, coarse_of: dict[str, str]) -> tuple:
    """What the full key refines, cheap to build: constants are only marked, attributes only named.
    Most nodes of a graph have a coarse key of their own and never need the full one."""
    ins = []
    for t in node.inputs:
        c = coarse_of.get(t)
        if c is None:
            c = coarse_of[t] = "\0const" if t and g.is_constant(t) else t
        ins.append(c)
    return (node.domain, node.op_type, len(node.outputs), tuple(node.attr_names()), tuple(ins))


def _node_key(g: Graph, node: Node, memo: dict[str, object]) -> tuple:
    names = node.attr_names()
    attrs = tuple(sorted((name, node.attr_proto(name).SerializeToString(deterministic=True)) for name in names))
    return (node.domain, node.op_type, len(node.outputs), attrs, tuple(_input_key(g, t, memo) for t in node.inputs))


def _merge_graph(g: Graph, trace: Trace) -> int:
    coarse: dict[tuple, list[Node]] = {}  # coarse key -> the first node of each full key seen under it
    full: dict[str, tuple] = {}  # node name -> full key, computed on demand
    memo: dict[str, object] = {}
    coarse_of: dict[str, str] = {}
    changes = 0

    def key_of(n: Node) -> tuple:
        if n.name not in full:
            full[n.name] = _node_key(g, n, memo)
        return full[n.name]

    for node in list(g.nodes()):
        if node not in g or not _mergeable(node):
            continue
        firsts = coarse.setdefault(_coarse_key(g, node, coarse_of), [])
        if not firsts:
            firsts.append(node)
            continue
        first = next((f for f in firsts if key_of(f) == key_of(node)), None)
        if first is None:
            firsts.append(node)
            continue
        if any(o and g.is_graph_output(o) for o in node.outputs):
            report(trace, NAME, node, f"duplicates {first.name!r} but writes a graph output")
            continue
        if any(o and not f for o, f in zip(node.outputs, first.outputs)):
            report(trace, NAME, node, f"duplicates {first.name!r}, which leaves an output it writes unnamed")
            continue
        for dup, keep in zip(node.outputs, first.outputs):
            if dup:
                g.replace_all_uses(dup, keep)
        g.remove_node(node)
        changes += 1
    return changes


def merge_duplicates(graph: Graph, *, trace: Trace = None) -> int:
    """Remove every node that repeats an earlier one of its graph (see the module docstring); returns
    the number removed."""
    return sum(_merge_graph(g, trace) for g in graph.graphs())
