"""``constants_to_initializers``: turn ``Constant`` nodes into initializers of the same name."""

from __future__ import annotations

from graphopt.ir import Graph
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
        proto = node.attr_proto("value")
        if proto is not None and proto.type == proto.TENSOR:
            # A `value` tensor moves over as it is (no decode/encode round trip): only its dtype is
            # asked, which the tensor's header answers (plain_value_tensor) unless it is external
            # or of an exotic type; then constant_info decodes it.
            value = plain_value_tensor(node)
            if value is None:
                info = g.constant_info(node.outputs[0])
                value = proto.t if info is not None and info[0].kind in "biufc" else None
        else:  # other forms (value_float, value_ints, ...) become the decoded array
            value = g.constant_value(node.outputs[0])
            value = value if value is not None and value.dtype.kind in "biufc" else None
        if value is None:
            report(trace, NAME, node, "its value is not a numeric tensor the IR can decode")
            continue
        replace_with_initializers(g, node, [value])
        changes += 1
    return changes
