"""``eliminate_noop_cast``: remove ``Cast`` nodes that convert a tensor to the type it already has,
and the second Cast of an exact round trip (fp16 -> fp32 -> fp16: widening is exact, so narrowing
back gives the input bit for bit).

The TorchScript exporter writes ``x.float()`` / ``x.to(torch.float32)`` on a float32 tensor as a
Cast to FLOAT (LLaMA's RMSNorm, the softmax of eager attention): a copy that hides the pattern
behind it from every fusion rule. A real conversion (fp16 -> fp32) is never removed here; the
norm and attention rules absorb those where the fused op computes in fp32 anyway.
"""

from __future__ import annotations

from onnx import TensorProto

from graphopt.ir import Graph

from graphopt.passes._util import Trace, bypass_or_report, report

NAME = "eliminate_noop_cast"

# (from, to) float conversions that are exact: every value of ``from`` is a value of ``to``.
_EXACT_WIDENING = {
    (TensorProto.FLOAT16, TensorProto.FLOAT), (TensorProto.FLOAT16, TensorProto.DOUBLE),
    (TensorProto.BFLOAT16, TensorProto.FLOAT), (TensorProto.BFLOAT16, TensorProto.DOUBLE),
    (TensorProto.FLOAT, TensorProto.DOUBLE),
}


def _round_trip_source(g, node) -> str | None:
    """The tensor x when ``node`` is Cast(Cast(x, to=wider), to=type of x) with an exact widening."""
    up = g.producer(node.inputs[0])
    if up is None or up.op_type != "Cast" or up.domain != "" or len(up.inputs) != 1 or not up.inputs[0]:
        return None
    src = g.dtype(up.inputs[0])
    if src is None or src != int(node.attr("to", 0)):
        return None
    return up.inputs[0] if (src, int(up.attr("to", 0))) in _EXACT_WIDENING else None


def eliminate_noop_cast(graph: Graph, *, trace: Trace = None) -> int:
    """Remove every Cast whose input's element type (known from the IR: graph inputs, initializers,
    value_info from shape inference) equals its ``to``, and every Cast that narrows an exact widening
    Cast back to its source type (readers then read the source; the widening Cast stays while other
    nodes read it); returns the number removed. A Cast whose
    input type is unknown stays and is reported. Graph outputs keep their names as in
    ``eliminate_identity``."""
    changes = 0
    for g, node in graph.find("Cast"):  # through the op index, not a walk over every node
        if node.op_type != "Cast" or node.domain != "" or node not in g:
            continue
        if len(node.inputs) != 1 or not node.inputs[0] or len(node.outputs) != 1 or not node.outputs[0]:
            continue
        back = _round_trip_source(g, node)
        if back is not None:
            changes += bypass_or_report(g, trace, NAME, node, back, node.outputs[0])
            continue
        src, to = g.dtype(node.inputs[0]), int(node.attr("to", 0))
        if src is None or src == 0:
            report(trace, NAME, node, f"the element type of {node.inputs[0]!r} is unknown, so the Cast may convert")
            continue
        if src != to:
            continue  # a real conversion: not a near-miss
        changes += bypass_or_report(g, trace, NAME, node, node.inputs[0], node.outputs[0])
    return changes
