"""Read-only walks over a ``Graph`` (its methods of the same names call these): the topological order
from the producer/consumer indexes, the depth-first walk through subgraphs, op lookups across
scopes, outer-scope references, reachability, and the ``networkx`` view for what networkx does best."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import networkx as nx

    from graphopt.ir.graph import Graph
    from graphopt.ir.node import Node


def _networkx():
    """networkx, imported on first use: most runs never build ``Graph.nx`` (the IR keeps its own
    producer/consumer indexes and topological order), and importing it costs 0.085 s of every command."""
    import networkx

    return networkx


def dependency_graph(graph: Graph) -> nx.MultiDiGraph:
    """A new ``networkx.MultiDiGraph`` of ``graph``'s node names, an edge producer -> consumer per tensor."""
    g = _networkx().MultiDiGraph()
    g.add_nodes_from(graph._nodes)
    g.add_edges_from(
        (graph._producer[t], user, t) for t, users in graph._consumers.items() if t in graph._producer for user in users
    )
    return g


def reaches(graph: Graph, src: str, dst: str, window: tuple | None = None) -> bool:
    """Whether producer -> consumer edges (those of ``dependency_graph``: explicit inputs and the outer
    tensors a node's subgraphs read) lead from node ``src`` to node ``dst``: a breadth-first search
    from both ends that grows the smaller frontier, as networkx's ``has_path`` does, but over the IR's
    own indexes. Why not networkx: ``Graph.nx`` had to be built for it (20k nodes of the GPT-2 export,
    a MultiDiGraph with an edge per tensor use) only for the rewrite engine's cycle checks.

    ``window`` (src's and dst's positions, where the node order is known to be topological): every node on
    a path from src to dst lies between them, so neither search leaves that stretch (the packed-attention
    rule's 84 checks on the 20k-node GPT-2 walked 537k nodes, 0.48 s, without it)."""
    if src == dst:
        return True
    nodes, consumers, producer, implicit = graph._nodes, graph._consumers, graph._producer, graph._implicit
    lo, hi = window if window is not None else (None, None)

    def successors(name: str) -> Iterator[str]:
        for t in nodes[name].outputs:
            if t:
                for m in consumers.get(t, ()):
                    if hi is None or nodes[m]._pos <= hi:
                        yield m

    def predecessors(name: str) -> Iterator[str]:
        for t in (*nodes[name].inputs, *implicit.get(name, ())):
            p = producer.get(t) if t else None
            if p is not None and (lo is None or nodes[p]._pos >= lo):
                yield p

    seen_fwd, seen_bwd = {src}, {dst}
    front_fwd, front_bwd = [src], [dst]
    while front_fwd and front_bwd:
        forward = len(front_fwd) <= len(front_bwd)
        front, seen, other, step = ((front_fwd, seen_fwd, seen_bwd, successors) if forward
                                    else (front_bwd, seen_bwd, seen_fwd, predecessors))
        grown: list[str] = []
        for name in front:
            for m in step(name):
                if m in other:
                    return True
                if m not in seen:
                    seen.add(m)
                    grown.append(m)
        if forward:
            front_fwd = grown
        else:
            front_bwd = grown
    return False


def topological_order(graph: Graph) -> list[str] | None:
    """``Graph.topological_order``: Kahn's algorithm with a heap of ranks by position."""
    nodes = graph._nodes
    names = sorted(nodes, key=lambda n: nodes[n]._pos)  # stable: equal positions by insertion
    rank = {name: i for i, name in enumerate(names)}
    indegree = [0] * len(names)
    children: list[list[int]] = [[] for _ in names]
    producer = graph._producer
    for t, users in graph._consumers.items():
        p = producer.get(t)
        if p is None:
            continue
        kids = children[rank[p]]
        for u in users:
            r = rank[u]
            indegree[r] += 1
            kids.append(r)
    ready = [r for r, d in enumerate(indegree) if d == 0]  # ascending: already a heap
    order: list[str] = []
    pop, push = heapq.heappop, heapq.heappush
    while ready:
        r = pop(ready)
        order.append(names[r])
        for kid in children[r]:
            indegree[kid] -= 1
            if indegree[kid] == 0:
                push(ready, kid)
    return order if len(order) == len(names) else None


def walk(graph: Graph) -> Iterator[tuple[Graph, Node]]:
    """``Graph.walk``: each node of a snapshot of the order, then (depth first) its subgraphs' nodes.
    Recursive generators: nesting is bounded at loading (``graphopt.ir.io``), and one generator per
    scope costs less than a stack of iterators looked up per node (20k nodes in each cleanup pass)."""
    for node in graph.nodes():
        yield graph, node
        if node._has_sub:
            for sub in node.subgraphs():
                yield from walk(sub)


def find(graph: Graph, op_types: tuple[str, ...], domain: str) -> list[tuple[Graph, Node]]:
    """``Graph.find``: the op index of each scope, then the scopes its subgraph holders open."""
    out: list[tuple[Graph, Node]] = []
    stack: list[Graph] = [graph]
    while stack:
        g = stack.pop()
        hits = [n for op in op_types for n in g.nodes_by_op(op, domain)]
        hits.sort(key=lambda n: n._pos)
        out.extend((g, n) for n in hits)
        holders = [g._nodes[name] for name in _subgraph_holders(g)]
        for n in sorted(holders, key=lambda n: n._pos, reverse=True):
            stack.extend(reversed(n.subgraphs()))
    return out


def _subgraph_holders(graph: Graph) -> list[str]:
    return [name for name, n in graph._nodes.items() if n._has_sub] if graph._has_subgraphs else []


def subgraph_owners(graph: Graph) -> list[tuple[Graph, Node]]:
    """``Graph.subgraph_owners``: (graph, node) for every node holding a subgraph, in walk order,
    found through each scope's holders (``_subgraph_holders``), not by looking at every node."""
    out: list[tuple[Graph, Node]] = []
    for node in sorted((graph._nodes[name] for name in _subgraph_holders(graph)), key=lambda n: n._pos):
        out.append((graph, node))
        for sub in node.subgraphs():
            out.extend(subgraph_owners(sub))
    return out


def graphs(graph: Graph) -> list[Graph]:
    """``Graph.graphs``: ``graph`` and the subgraphs of every node ``walk`` meets, in its order."""
    out = [graph]
    _add_subgraphs(graph, out)
    return out


def _add_subgraphs(graph: Graph, out: list[Graph]) -> None:
    # Only the holders of each scope are visited, not every node: a 20k-node graph without
    # subgraphs costs a flag test (walk would touch every node, twice a rewrite run).
    holders = sorted((graph._nodes[name] for name in _subgraph_holders(graph)), key=lambda n: n._pos)
    for node in holders:
        subs = node.subgraphs()
        out.extend(subs)
        for sub in subs:
            _add_subgraphs(sub, out)


def outer_references(graph: Graph) -> list[str]:
    """``Graph.outer_references``: every name read (or output) and not defined here, in first-read order."""
    defined: set[str] = set(graph._inputs) | set(graph._inits) | set(graph._producer) | set(graph.sparse_initializer_names())
    seen: dict[str, None] = {}
    for node in graph.nodes():
        for t in node.inputs:
            if t and t not in defined:
                seen[t] = None
        for sub in node.subgraphs():
            for t in sub.outer_references():
                if t not in defined:
                    seen[t] = None
    for t in graph._outputs:
        if t not in defined:
            seen[t] = None
    return list(seen)
