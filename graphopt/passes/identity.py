"""``eliminate_identity``: remove ``Identity`` nodes, in every graph and subgraph."""

from __future__ import annotations

from graphopt.ir import Graph

from graphopt.passes._util import Trace, bypass_or_report, report

NAME = "eliminate_identity"


def eliminate_identity(graph: Graph, *, trace: Trace = None) -> int:
    """Remove every ``Identity`` whose removal is legal; returns the number removed.

    Readers of the Identity's output read its input instead. When the output is a graph output, the
    producer of the input is renamed so the output keeps its name; the Identity stays when that is
    impossible (its input is a graph input, an initializer, an outer-scope value or another graph
    output). Sequence and optional Identities are removed the same way: they are copies too.
    """
    changes = 0
    for g, node in graph.find("Identity"):  # through the op index, not a walk over every node
        if node.op_type != "Identity" or node.domain != "" or node not in g:
            continue
        if len(node.inputs) != 1 or not node.inputs[0] or len(node.outputs) != 1 or not node.outputs[0]:
            report(trace, NAME, node, "malformed Identity (needs exactly one input and one output)")
            continue
        changes += bypass_or_report(g, trace, NAME, node, node.inputs[0], node.outputs[0])
    return changes
