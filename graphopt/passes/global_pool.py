"""``reduce_to_global_pool``: a mean (or max) over every spatial axis of an image tensor, written as
``ReduceMean`` / ``ReduceMax``, becomes ``GlobalAveragePool`` / ``GlobalMaxPool``.

``ReduceMean(x, axes = {2, .., r-1}, keepdims = 1)`` of a float x of rank r >= 4  ==>  ``GlobalAveragePool(x)``
(ReduceMax likewise ==> ``GlobalMaxPool``): the same values in the same [N, C, 1, .., 1] shape.

Why: the dynamo exporter (torch's default) writes ``adaptive_avg_pool2d(x, 1)`` as ``ReduceMean(x, [-1, -2])``
where the TorchScript exporter writes ``GlobalAveragePool``: ResNet-50's and MobileNetV2's head and
EfficientNet-B0's 16 squeeze-excitation blocks. The runtime runs the pooling op with its own kernel in
the layout of its input (``tune/layout_choice`` NEUTRAL_OPS), while any other reduction reads NCHW, so each
such ReduceMean cut the convolutions' NHWC region with two layout conversions of a whole feature map.

Only rank 4 and up (two or more spatial axes): over the last axis of a rank-3 tensor a mean is a LayerNorm's
or RMSNorm's (``rules/norm.toml`` matches that ReduceMean), not a pooling.
"""

from __future__ import annotations

from onnx import TensorProto

from graphopt.ir import Graph, Node

from graphopt.passes._util import Trace, report
from graphopt.rewrite.constraints import reduce_axes

NAME = "reduce_to_global_pool"

POOLS = {"ReduceMean": "GlobalAveragePool", "ReduceMax": "GlobalMaxPool"}
# The element types the Global*Pool ops take (opset 1 through 22: float16, float, double).
POOL_TYPES = frozenset({TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE})


def _why_not(g: Graph, node: Node) -> str | None:
    """Why this reduction is not a global pool (None: it is)."""
    if int(node.attr("keepdims", 1)) != 1:
        return "keepdims=0 (a global pool keeps the reduced axes)"
    x = node.inputs[0] if node.inputs else ""
    info = g.value_info(x)
    if info.dtype not in POOL_TYPES:
        return f"{x!r} is not float16, float or double"
    if info.shape is None or len(info.shape) < 4:
        return f"the rank of {x!r} is unknown or under 4 (one spatial axis or none)"
    axes = reduce_axes(g, node)
    if isinstance(axes, str):
        return axes
    rank = len(info.shape)
    if len(axes) != rank - 2 or sorted(a % rank for a in axes) != list(range(2, rank)):
        return f"axes {axes} are not every spatial axis of a rank-{rank} tensor"
    return None


def reduce_to_global_pool(graph: Graph, *, trace: Trace = None) -> int:
    """Make every ReduceMean / ReduceMax over all spatial axes (keepdims) a Global*Pool; returns the count."""
    changes = 0
    for g, node in graph.find(*POOLS):
        if node.domain != "" or node not in g:
            continue
        reason = _why_not(g, node)
        if reason is not None:
            report(trace, NAME, node, reason)
            continue
        y = node.outputs[0]
        info = g.value_info(y)  # the same tensor: keep what is known of it (a re-optimization would infer it)
        g.replace_subgraph([node], [{"op_type": POOLS[node.op_type], "inputs": [node.inputs[0]], "outputs": [y],
                                     "name": node.name}])
        if info.dtype is not None and not g.is_graph_output(y):
            g.set_value_info(y, info.dtype, info.shape)
        changes += 1  # an axes constant left unread goes with dead code
    return changes
