"""``fold_conv_bn``: fold an inference-mode BatchNormalization into the preceding Conv."""

from __future__ import annotations

import numpy as np

from graphopt.ir import Graph, Node

from graphopt.passes._conv import along_channels, conv_constants, fold_into_convs
from graphopt.passes._util import Trace, is_used, only_consumer, opset_version

NAME = "fold_conv_bn"


def _match(graph: Graph, bn: Node):
    """(conv, new weight, new bias) for a foldable BatchNormalization, or the reason it is not."""
    if len(bn.inputs) != 5 or not all(bn.inputs):
        return "BatchNormalization needs its five inputs"
    if any(is_used(graph, t) for t in bn.outputs[1:] if t):
        return "its running mean/var outputs are used (training mode)"
    opset = opset_version(graph)
    if bn.attr("training_mode", 0):
        return "training_mode=1"
    if opset < 7 and not bn.attr("is_test", 0):
        return "opset < 7 BatchNormalization without is_test=1 runs in training mode"
    if opset < 9 and not bn.attr("spatial", 1):
        return "spatial=0 (per-activation statistics) is not per-channel"
    conv = graph.producer(bn.inputs[0])
    if conv is None or conv.op_type != "Conv" or conv.domain != "":
        return "its input is not produced by a Conv"
    if only_consumer(graph, bn.inputs[0]) is not bn:
        return f"the Conv output {bn.inputs[0]!r} has another consumer or is a graph output"
    weights = conv_constants(graph, conv)
    if isinstance(weights, str):
        return weights
    w, b = weights
    channels = w.shape[0]
    params = []
    for role, t in zip(("scale", "B", "mean", "var"), bn.inputs[1:]):
        value = graph.constant_value(t)
        if value is None:
            return f"BatchNormalization {role} {t!r} is not a constant"
        if value.shape != (channels,) or value.dtype.kind != "f":
            return f"BatchNormalization {role} {t!r} has shape {value.shape}, expected ({channels},) floats"
        params.append(value.astype(np.float64))
    scale, shift, mean, var = params
    eps = float(bn.attr("epsilon", 1e-5))
    # A model's own NaN / inf / negative variance folds to what the BN would compute at run time; NumPy's
    # RuntimeWarnings about them would only reach the user as noise.
    with np.errstate(all="ignore"):
        factor = scale / np.sqrt(var + eps)
        bias = b.astype(np.float64) if b is not None else np.zeros(channels)
        new_w = w.astype(np.float64) * along_channels(factor, w.ndim)
        new_b = (bias - mean) * factor + shift
    return conv, new_w, new_b


def fold_conv_bn(graph: Graph, *, trace: Trace = None) -> int:
    """Fold ``BatchNormalization(Conv(x, W, B))`` into ``Conv(x, W', B')`` with
    ``W' = W * s`` and ``B' = (B - mean) * s + bias`` per output channel, ``s = scale / sqrt(var + eps)``.

    Needs constant W (and B when present) and constant scale/bias/mean/var; the BN in inference mode
    with only its first output used; the Conv output read only by the BN and not a graph output.
    Works for any Conv rank and group count (the BN acts on output channels, W's first axis).
    Returns the number of folds.
    """
    return fold_into_convs(graph, ("BatchNormalization",), _match, NAME, trace)
