"""Small helpers shared by the cleanup passes (private).

Everything here goes through the ``Graph`` query and mutation API; no pass touches protobufs.
"""

from __future__ import annotations

from typing import Callable

from graphopt.ir import Graph, Node

#: ``trace`` callbacks receive (pass name, node name, reason) for every near-miss a pass rejects.
Trace = Callable[[str, str, str], None] | None


def opset_version(graph: Graph, domain: str = "") -> int:
    """The opset version the model imports for ``domain`` (subgraphs use the root's imports)."""
    opset = graph.root.opset
    return int(opset.get(domain, opset.get("ai.onnx", 0)) if domain == "" else opset.get(domain, 0))


def only_consumer(graph: Graph, tensor: str) -> Node | None:
    """The single node that reads ``tensor`` (directly, not from a subgraph), or None when the
    tensor has no consumer, several, is read by a subgraph, or is a graph output."""
    if graph.is_graph_output(tensor):
        return None
    users = graph.consumers(tensor)
    if len(users) != 1:
        return None
    user = users[0]
    if tensor not in user.inputs:
        return None  # read only from inside one of the user's subgraphs
    return user


def is_used(graph: Graph, tensor: str) -> bool:
    """True when ``tensor`` is read by a node (or a subgraph) or is a graph output."""
    return bool(tensor) and graph.has_users(tensor)


def report(trace: Trace, pass_name: str, node: Node, reason: str) -> None:
    if trace is not None:
        trace(pass_name, node.name, reason)


def bypass(graph: Graph, node: Node, src: str, dst: str) -> str | None:
    """Remove ``node``, whose output ``dst`` is a copy of ``src``, making readers of ``dst`` read ``src``.

    Returns None on success, or the reason the node must stay. When ``dst`` is a graph output its
    name is part of the model's interface, so instead of renaming the output the producer of ``src``
    is made to write ``dst`` directly (readers of ``src``, subgraph bodies included, follow the
    rename). That is impossible, and the node stays, when ``src`` is a graph input, an initializer,
    an outer-scope value or another graph output (two graph outputs cannot share one name).
    """
    if not graph.is_graph_output(dst):
        graph.replace_all_uses(dst, src)
        graph.remove_node(node)
        return None
    if graph.is_graph_output(src):
        return f"its input {src!r} and output {dst!r} are both graph outputs (they cannot share one name)"
    if graph.producer(src) is None:
        return f"its output {dst!r} is a graph output and its input {src!r} is not produced by a node of this graph"
    # Keep the interface name: move dst aside, point everything at src, drop the copy, then give
    # src's producer the name dst. Each step is a Graph mutation that keeps the links consistent.
    tmp = graph.unique_name(dst)
    graph.rename_tensor(dst, tmp)
    graph.replace_all_uses(tmp, src)
    graph.remove_node(node)
    graph.rename_tensor(src, dst)
    graph.clear_value_info(dst)  # the graph-output entry already carries dst's type
    return None


def bypass_or_report(graph: Graph, trace: Trace, pass_name: str, node: Node, src: str, dst: str) -> int:
    """``bypass``; 1 when the node was removed, else 0 with the reason reported to ``trace``."""
    reason = bypass(graph, node, src, dst)
    if reason is None:
        return 1
    report(trace, pass_name, node, reason)
    return 0


def replace_with_initializers(graph: Graph, node: Node, values: list) -> None:
    """Replace ``node`` by initializers holding ``values`` (one per output, same order), keeping
    every output's name, graph outputs included. Outputs whose value is None must be unused."""
    graph.replace_with_initializers(node, values)


def bypass_each(graph: Graph, op_type: str, pass_name: str, why_not, trace: Trace) -> int:
    """Remove every default-domain ``op_type`` node (in every graph) whose output is a copy of its first
    input, as ``why_not(g, node)`` says by returning None; any other reason is reported to ``trace``.
    Returns the number removed."""
    changes = 0
    for g, node in graph.find(op_type):  # through the op index, not a walk over every node
        if node.op_type != op_type or node.domain != "" or node not in g:
            continue
        reason = why_not(g, node)
        if reason is not None:
            report(trace, pass_name, node, reason)
            continue
        changes += bypass_or_report(g, trace, pass_name, node, node.inputs[0], node.outputs[0])
    return changes
