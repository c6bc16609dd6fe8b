"""``fold_conv_mul_add``: fold a per-channel constant Mul/Div/Add/Sub after a Conv into its W and B."""

from __future__ import annotations

import numpy as np

from graphopt.ir import Graph, Node

from graphopt.passes._conv import along_channels, channel_vector, conv_constants, fold_into_convs, per_channel
from graphopt.passes._util import Trace, only_consumer

NAME = "fold_conv_mul_add"

_OPS = ("Mul", "Add", "Div", "Sub")
_COMMUTATIVE = ("Mul", "Add")


def _match(graph: Graph, node: Node):
    """(conv, new weight, new bias) for a foldable node, the reason it is not foldable, or None
    when no suitable operand comes from a Conv at all (not a near-miss)."""
    if len(node.inputs) != 2 or not all(node.inputs) or len(node.outputs) != 1:
        return f"{node.op_type} needs two inputs and one output"
    # Which operand is the Conv output: either for Mul/Add, only the left one for Div/Sub.
    sides = (0, 1) if node.op_type in _COMMUTATIVE else (0,)
    conv = None
    for side in sides:
        producer = graph.producer(node.inputs[side])
        if producer is not None and producer.op_type == "Conv" and producer.domain == "":
            conv, conv_side = producer, side
            break
    if conv is None:
        return None
    y, c_name = node.inputs[conv_side], node.inputs[1 - conv_side]
    if c_name == y:
        return "both operands are the Conv output"
    if only_consumer(graph, y) is not node:
        return f"the Conv output {y!r} has another consumer or is a graph output"
    weights = conv_constants(graph, conv)
    if isinstance(weights, str):
        return weights
    w, b = weights
    c = graph.constant_value(c_name)
    if c is None:
        return f"operand {c_name!r} is not a constant"
    if c.dtype != w.dtype:
        return f"operand {c_name!r} has dtype {c.dtype}, the Conv weight {w.dtype}"
    channels = w.shape[0]
    reason = per_channel(c.shape, w.ndim, channels)
    if reason is not None:
        return f"operand {c_name!r} is not per-channel: {reason}"
    vec = channel_vector(c, channels)
    w64 = w.astype(np.float64)
    b64 = None if b is None else b.astype(np.float64)
    if node.op_type == "Mul":
        return conv, w64 * along_channels(vec, w.ndim), None if b64 is None else b64 * vec
    if node.op_type == "Div":
        if not np.all(vec != 0):
            return f"operand {c_name!r} has a zero: the division is not foldable"
        return conv, w64 / along_channels(vec, w.ndim), None if b64 is None else b64 / vec
    zero = np.zeros(channels)
    if node.op_type == "Add":
        return conv, w64, (zero if b64 is None else b64) + vec
    return conv, w64, (zero if b64 is None else b64) - vec  # Sub: conv - c


def fold_conv_mul_add(graph: Graph, *, trace: Trace = None) -> int:
    """Fold ``Conv(x, W, B) * c`` (either order) and ``/ c`` into W and B, and ``+ c`` (either
    order) and ``- c`` into B, where ``c`` is a constant that broadcasts along the output channels
    only: shape [1, C, 1, ...], any suffix of it such as [C, 1, 1], or a single value. A [C] vector
    is not per-channel for a Conv output (it broadcasts along the last spatial axis) and is refused.
    The Conv output must be read only by that node and not be a graph output; W and B constant.
    Returns the number of folds.
    """
    return fold_into_convs(graph, _OPS, _match, NAME, trace)
