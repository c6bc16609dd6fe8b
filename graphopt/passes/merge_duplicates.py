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
    if g.is_constant(tensor) and _small(g, tensor):
        value = g.constant_value(tensor)
        if value is not None:
            key = ("const", str(value.dtype), tuple(value.shape), hashlib.sha256(value.tobytes()).hexdigest())
    memo[tensor] = key
    return key


def _small(g: Graph, tensor: str) -> bool:
    """Whether a constant holds at most VALUE_KEY_MAX_BYTES, read from its header where it is an
    initializer (a weight is never decoded for this)."""
    scope: Graph | None = g
    while scope is not None:
        if scope.is_initializer(tensor):
            proto = scope.initializer(tensor)
            n = 1
            for d in proto.dims:
                n *= int(d)
            return n * 8 <= VALUE_KEY_MAX_BYTES  # 8: the widest numeric element
        if scope.producer(tensor) is not None:
            break
        scope = scope.parent
    info = g.constant_info(tensor)
    return info is not None and info[0].itemsize * int(np.prod(info[1])) <= VALUE_KEY_MAX_BYTES


def _node_key(g: Graph, node: Node, memo: dict[str, object]) -> tuple | None:
    if node.op_type in RANDOM_OPS and node.domain in ("", "ai.onnx"):
        return None
    if not node.inputs or node.subgraphs() or not node.outputs:
        return None
    attrs = tuple(sorted((name, node.attr_proto(name).SerializeToString(deterministic=True))
                         for name in node.attr_names()))
    return (node.domain, node.op_type, len(node.outputs), attrs, tuple(_input_key(g, t, memo) for t in node.inputs))


def _merge_graph(g: Graph, trace: Trace) -> int:
    seen: dict[tuple, Node] = {}
    memo: dict[str, object] = {}
    changes = 0
    for node in list(g.nodes()):
        if node not in g:
            continue
        key = _node_key(g, node, memo)
        if key is None:
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        if any(o and g.is_graph_output(o) for o in node.outputs):
            report(trace, NAME, node, f"duplicates {first.name!r} but writes a graph output")
            continue
        if any(o and not f for o, f in zip(node.outputs, first.outputs)):
            report(trace, NAME, node, f"duplicates {first.name!r} but reads an output {first.name!r} does not write")
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
