"""``lint``: the checks of a ``Graph``'s invariants (``Graph.lint`` runs them): no cycle, no dangling
input, one producer per tensor, every output provided, no duplicate graph input or output, and
producer/consumer indexes in step with the nodes."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from graphopt.errors import InvalidGraph
from graphopt.ir.traverse import _networkx

if TYPE_CHECKING:
    from graphopt.ir.graph import Graph


def lint(graph: Graph) -> Graph:
    """Raise ``InvalidGraph`` on a cycle, a dangling input, a tensor with two producers, an output
    with no producer, duplicate graph outputs or inconsistent indexes."""
    if not graph._topo_valid and graph.topological_order() is None:  # a valid toposort proves acyclicity
        cycle = _networkx().find_cycle(graph.nx)
        names = " -> ".join(f"{u!r}" for u, _, _ in cycle)
        raise InvalidGraph(f"graph {graph.name!r} has a cycle: {names}; the model is not a DAG")
    seen_outputs: dict[str, str] = {}
    for node in graph.nodes():
        for t in node.outputs:
            if not t:
                continue
            if t in seen_outputs:
                raise InvalidGraph(f"tensor {t!r} is produced twice (nodes {seen_outputs[t]!r} and {node.name!r})")
            if t in graph._inputs or t in graph._inits:
                raise InvalidGraph(f"tensor {t!r} is produced by node {node.name!r} but is also a graph input or initializer")
            seen_outputs[t] = node.name
    produced, inits = graph._producer, graph._inits
    for node in graph.nodes():
        for t in node.inputs:
            if t and t not in produced and t not in inits and not graph.visible(t):  # (the common cases first)
                raise InvalidGraph(
                    f"node {node.name!r} ({node.qualified_op}) reads {t!r}, which no node, input or initializer provides"
                )
    if len(set(graph._outputs)) != len(graph._outputs):
        dup = sorted(t for t, c in Counter(graph._outputs).items() if c > 1)
        raise InvalidGraph(f"graph {graph.name!r} lists output(s) {', '.join(map(repr, dup))} more than once")
    if len(set(graph._inputs)) != len(graph._inputs):
        dup = sorted(t for t, c in Counter(graph._inputs).items() if c > 1)
        raise InvalidGraph(f"graph {graph.name!r} lists input(s) {', '.join(map(repr, dup))} more than once")
    for t in graph._outputs:
        if not graph.visible(t):
            raise InvalidGraph(f"graph output {t!r} of graph {graph.name!r} is produced by no node, input or initializer")
    # node -> what it reads, built once per node: its input list itself when short (searching a
    # few names beats building a set, 20k times a lint), a set when long (a node may have 100k
    # inputs, each a link to check) or when its subgraphs read outer tensors too
    reads: dict[str, Any] = {}
    for t, users in graph._consumers.items():
        for u in users:
            read = reads.get(u)
            if read is None:
                node = graph._nodes.get(u)
                if node is None:
                    raise InvalidGraph(f"internal: stale consumer link {t!r} -> {u!r}")
                implicit = graph._implicit.get(u)
                read = reads[u] = node.inputs if len(node.inputs) <= 8 and not implicit else set(node.inputs) | set(implicit or ())
            if t not in read:
                raise InvalidGraph(f"internal: stale consumer link {t!r} -> {u!r}")
    for node in graph.nodes():
        for sub in node.subgraphs():
            sub.lint()
    return graph
