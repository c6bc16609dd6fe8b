"""``eliminate_noop_cast``: remove ``Cast`` nodes that convert a tensor to the type it already has.

The TorchScript exporter writes ``x.float()`` / ``x.to(torch.float32)`` on a float32 tensor as a
Cast to FLOAT (LLaMA's RMSNorm, the softmax of eager attention): a copy that hides the pattern
behind it from every fusion rule. A real conversion (fp16 -> fp32) is never removed here; the
norm and attention rules absorb those where the fused op computes in fp32 anyway.
"""

from __future__ import annotations

from graphopt.ir import Graph

from graphopt.passes._util import Trace, bypass, report

NAME = "eliminate_noop_cast"


def eliminate_noop_cast(graph: Graph, *, trace: Trace = None) -> int:
    """Remove every Cast whose input's element type (known from the IR: graph inputs, initializers,
    value_info from shape inference) equals its ``to``; returns the number removed. A Cast whose
    input type is unknown stays and is reported. Graph outputs keep their names as in
    ``eliminate_identity``."""
    changes = 0
    for g, node in graph.find("Cast"):  # through the op index, not a walk over every node
        if node.op_type != "Cast" or node.domain != "" or node not in g:
            continue
        if len(node.inputs) != 1 or not node.inputs[0] or len(node.outputs) != 1 or not node.outputs[0]:
            continue
        src, to = g.dtype(node.inputs[0]), int(node.attr("to", 0))
        if src is None or src == 0:
            report(trace, NAME, node, f"the element type of {node.inputs[0]!r} is unknown, so the Cast may convert")
            continue
        if src != to:
            continue  # a real conversion: not a near-miss
        reason = bypass(g, node, node.inputs[0], node.outputs[0])
        if reason is None:
            changes += 1
        else:
            report(trace, NAME, node, reason)
    return changes
