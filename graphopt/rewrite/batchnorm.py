"""A standalone inference BatchNormalization as a depthwise 1x1 ``graphopt.CBR``.

``BatchNormalization(x)`` in inference mode is ``x * s + t`` per channel with
``s = scale / sqrt(var + eps)`` and ``t = bias - mean * s``: exactly a 1x1 convolution with
``group = C``, weight ``s`` shaped ``[C, 1, 1(, 1)]`` and bias ``t``. A BN that no Conv precedes
(DenseNet's pre-activation BN -> ReLU -> Conv, 62 of them in DenseNet-121) and that feeds an
activation thus becomes one CBR: a per-channel affine with the activation fused, run by the same
kernels and function bodies as every CBR. (The cleanup pass ``fold_conv_bn`` folds a BN into the
Conv *before* it; folding it into the Conv *after* it is exact only without an activation between
and without zero padding, which is not this pattern.)

Constraint: ``bn_inference(bn)``. Builders: ``bn_weight(bn)`` / ``bn_bias(bn)`` (new
initializers), ``bn_conv_attrs(bn)`` (the Conv attributes of the 1x1 depthwise conv).
"""

from __future__ import annotations

import numpy as np

from graphopt.rewrite.constraints import known_rank
from graphopt.rewrite.registry import BuildFailed, NewConstant, register_builder, register_constraint


def _params(g, bn):
    """(s, t, channels, spatial rank) of an inference BN, or the reason it is not one."""
    if len(bn.inputs) != 5 or not all(bn.inputs):
        return f"BatchNormalization {bn.name!r} needs its five inputs"
    if any(t and g.has_users(t) for t in bn.outputs[1:]):
        return f"BatchNormalization {bn.name!r} has its running mean/var outputs used (training mode)"
    opset = g.root.opset.get("", 0)
    if bn.attr("training_mode", 0):
        return f"BatchNormalization {bn.name!r} has training_mode=1"
    if opset < 7 and not bn.attr("is_test", 0):
        return f"BatchNormalization {bn.name!r} runs in training mode (opset < 7 without is_test=1)"
    if opset < 9 and not bn.attr("spatial", 1):
        return f"BatchNormalization {bn.name!r} has spatial=0 (per-activation statistics)"
    rank = known_rank(g, bn.inputs[0])
    if rank not in (3, 4):
        return (f"the input {bn.inputs[0]!r} of {bn.name!r} has rank {rank}; a CBR takes rank 3 or 4 "
                "(N, C, [H,] W)")
    values = []
    for role, t in zip(("scale", "bias", "mean", "var"), bn.inputs[1:]):
        v = g.constant_value(t)
        if v is None:
            return f"BatchNormalization {role} {t!r} of {bn.name!r} is not a constant"
        if v.ndim != 1 or v.dtype.kind != "f":
            return f"BatchNormalization {role} {t!r} of {bn.name!r} has shape {v.shape}, expected [C] floats"
        values.append(np.asarray(v, dtype=np.float64))
    if len({v.shape for v in values}) != 1:
        return f"the parameters of {bn.name!r} disagree on the channel count"
    shape = g.shape(bn.inputs[0])
    c = values[0].shape[0]
    if shape is not None and isinstance(shape[1], int) and shape[1] != c:
        return f"{bn.inputs[0]!r} has {shape[1]} channels but {bn.name!r} has {c} parameters"
    scale, bias, mean, var = values
    s = scale / np.sqrt(var + float(np.float32(bn.attr("epsilon", 1e-5))))
    return s, bias - mean * s, c, rank - 2


@register_constraint("bn_inference", "n")
def bn_inference(g, bn):
    """bn is an inference-mode BatchNormalization with constant [C] parameters on a rank-3/4 input."""
    out = _params(g, bn)
    return out if isinstance(out, str) else None


def _dtype(g, bn):
    v = g.constant_value(bn.inputs[1])
    return np.asarray(v).dtype


@register_builder("bn_weight", "n", "tensor")
def bn_weight(g, bn):
    """The depthwise weight [C, 1, 1(, 1)] = scale / sqrt(var + eps)."""
    out = _params(g, bn)
    if isinstance(out, str):
        raise BuildFailed(out)
    s, _, c, spatial = out
    return NewConstant(s.reshape((c, 1) + (1,) * spatial).astype(_dtype(g, bn)), f"{bn.name}_dw_weight")


@register_builder("bn_bias", "n", "tensor")
def bn_bias(g, bn):
    """The bias [C] = bias - mean * scale / sqrt(var + eps)."""
    out = _params(g, bn)
    if isinstance(out, str):
        raise BuildFailed(out)
    return NewConstant(out[1].astype(_dtype(g, bn)), f"{bn.name}_dw_bias")


@register_builder("bn_conv_attrs", "n", "attrs")
def bn_conv_attrs(g, bn):
    """The attributes of the 1x1 depthwise Conv a BN is: group = C, unit kernel, no padding."""
    out = _params(g, bn)
    if isinstance(out, str):
        raise BuildFailed(out)
    _, _, c, spatial = out
    return {"group": int(c), "kernel_shape": [1] * spatial, "strides": [1] * spatial,
            "pads": [0] * (2 * spatial), "dilations": [1] * spatial}
