"""``dead_code``: remove nodes and initializers nothing uses, in every graph and subgraph."""

from __future__ import annotations

from graphopt.ir import Graph, Node

from graphopt.passes._util import Trace, is_used

NAME = "dead_code"


def _sweep(graph: Graph) -> int:
    """Remove dead nodes of one graph (transitively) and its unused initializers."""
    removed = 0
    has_users = graph.has_users  # is_used without its call: this loop visits every node each run
    # A worklist seeded in reverse graph order: removing a node re-examines the producers of its
    # inputs, so a dead chain goes in one sweep whatever the node order. A list, not a set, keeps
    # the order of removals deterministic.
    stack = graph.nodes()
    while stack:
        node = stack.pop()
        if node not in graph:
            continue  # removed already (seeded, then pushed again as a feeder)
        for t in node.outputs:
            if t and has_users(t):
                break
        else:  # no output is read or is a graph output: dead
            feeders = [graph.producer(t) for t in node.inputs if t]
            graph.remove_node(node)
            removed += 1
            stack.extend(p for p in feeders if p is not None)
    for name in graph.initializer_names():
        if not graph.is_graph_input(name) and not is_used(graph, name):
            graph.remove_initializer(name)
            removed += 1
    return removed


def dead_code(graph: Graph, *, trace: Trace = None) -> int:
    """Remove every node none of whose outputs is read or is a graph output, transitively, and
    every initializer that is neither read, a graph output nor a graph input (those are defaults of
    the model's interface). ONNX ops have no side effects, so an unused If/Loop/Scan goes too; a
    used one stays and its bodies are cleaned. Innermost graphs are swept first, and a body that
    has been swept refreshes its owner's outer-scope uses, so a value read only by dead body nodes
    dies in the same call (every owner is refreshed, since the IR does not track changes made
    inside a body by other passes). Returns the number of nodes and initializers removed. ``trace`` is
    accepted for a uniform signature; dead code has no near-misses to report.
    """
    owners: dict[int, tuple[Graph, Node, str]] = {}
    for g, node in graph.subgraph_owners():
        for attr_name, value in node.subgraph_items():
            for sub in value if isinstance(value, list) else [value]:
                owners[id(sub)] = (g, node, attr_name)
    removed = 0
    for sub in reversed(graph.graphs()):  # graphs() is depth-first pre-order: children come later
        count = _sweep(sub)
        removed += count
        owner = owners.get(id(sub))
        if owner is not None:
            owner_graph, node, attr_name = owner
            if node in owner_graph:
                # Re-setting the body re-derives which outer tensors the node reads: other passes
                # (or this sweep) may have removed the body's last reader of an outer value, and
                # the IR does not refresh that on changes inside a body.
                node.set_attr(attr_name, node.attr(attr_name))
    return removed
