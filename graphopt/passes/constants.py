"""``constants_to_initializers``: turn ``Constant`` nodes into initializers of the same name."""

from __future__ import annotations

from graphopt.ir import Graph, Node
from graphopt.ir.constants import plain_value_tensor

from graphopt.passes._util import Trace, replace_with_initializers, report

NAME = "constants_to_initializers"


def constants_to_initializers(graph: Graph, *, trace: Trace = None) -> int:
    """Replace every ``Constant`` node (in all graphs) by an initializer with the same name and value.

    Initializers are what the other passes and runtimes treat as weights; the value and the tensor
    name are unchanged, graph outputs included. Constants the IR cannot decode into an array
    (``sparse_value``, strings) are left as they are. Returns the number replaced.
    """
    changes = 0
    for g, node in graph.find("Constant"):  # through the op index, not a walk over every node
        if node.op_type != "Constant" or node.domain != "" or node not in g:
            continue
        if len(node.outputs) != 1 or not node.outputs[0]:
            report(trace, NAME, node, "malformed Constant (needs exactly one output)")
            continue
        # A plain `value` tensor (nearly every Constant) moves over as it is: no decode/encode round trip.
        value = plain_value_tensor(node)
        if value is None:
            value = _other_value(g, node)
        if value is None:
            report(trace, NAME, node, "its value is not a numeric tensor the IR can decode")
            continue
        replace_with_initializers(g, node, [value])
        changes += 1
    return changes


def _other_value(g: Graph, node: Node):
    """The value of a Constant whose ``value`` tensor is not plain (external, or of an exotic type:
    moved as it is when it decodes to a numeric array) or that uses another form (``value_float``,
    ``value_ints``, ...: the decoded array); None when it is not numeric."""
    proto = node.attr_proto("value")
    if proto is not None and proto.type == proto.TENSOR:
        info = g.constant_info(node.outputs[0])
        return proto.t if info is not None and info[0].kind in "biufc" else None
    value = g.constant_value(node.outputs[0])
    return value if value is not None and value.dtype.kind in "biufc" else None
