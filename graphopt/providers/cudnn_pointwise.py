"""A CBR's or GemmAct's activation as cuDNN frontend pointwise ops (the conv, channel-padded and
matmul graphs share it).

One op each: none, Relu, Clip (a relu clipped to [clip_min, clip_max]; no lower bound is -inf),
LeakyRelu, Sigmoid, SiLU (swish), Gelu (erf), GeluTanh. Composed (``COMPOSED``), because no pointwise
mode computes them: HardSwish and HardSigmoidMul, ``y * clamp(alpha * y + beta, 0, 1)`` as mul, add,
a relu clipped to [0, 1] and mul, with alpha and beta pass-by-value fp32 scalars
(:func:`act_constants`) the launch binds every time (``cudnn.bind_constants``), as the norm graphs'
epsilon. HardSigmoid and QuickGelu have no form here (the own kernels run them).

The graph is an argument, so the CPU tests evaluate these ops on NumPy with cuDNN's semantics.
"""

from __future__ import annotations

import math

import numpy as np

from graphopt.errors import TuningError
from graphopt.lowering.contract import Signature

ACTIVATIONS = ("none", "Relu", "Clip", "LeakyRelu", "Sigmoid", "SiLU", "Gelu", "GeluTanh", "HardSwish", "HardSigmoidMul")
# y * clamp(alpha * y + beta, 0, 1): no single cuDNN pointwise mode, four ops with two scalars
COMPOSED = ("HardSwish", "HardSigmoidMul")


def activation_reason(sig: Signature) -> str | None:
    """Why the signature's activation has no cuDNN form here, or None."""
    act = sig.attr("activation", "none")
    if act not in ACTIVATIONS:
        return f"activation {act} has no cuDNN pointwise form here (supported: {', '.join(ACTIVATIONS)})"
    return None


def act_constants(sig: Signature) -> dict[str, np.ndarray]:
    """The pass-by-value scalars of the signature's activation (tensor name -> fp32 host array, read
    by value each time a plan executes, so a CUDA graph keeps them): ``act_alpha`` and ``act_beta`` of
    a composed hard sigmoid (HardSwish: 1/6 and 0.5, ONNX's; HardSigmoidMul: the node's, defaults 0.2
    and 0.5); none for the others."""
    name = sig.attr("activation", "none")
    if name not in COMPOSED:
        return {}
    if name == "HardSwish":
        alpha, beta = 1.0 / 6.0, 0.5
    else:
        alpha = 0.2 if sig.attr("act_alpha") is None else float(sig.attr("act_alpha"))
        beta = 0.5 if sig.attr("act_beta") is None else float(sig.attr("act_beta"))
    return {"act_alpha": np.full((1,), alpha, np.float32), "act_beta": np.full((1,), beta, np.float32)}


def activation(graph, y, sig: Signature, f32, t: dict, rank: int):
    """``y`` through the signature's activation as cuDNN pointwise ops. A composed one adds its
    scalars to ``t`` (``t[name]``: the graph's tensor, ``t["constants"]``: the values to bind,
    shaped ``[1] * rank``: one element broadcast over ``y``)."""
    name = sig.attr("activation", "none")
    if name == "none":
        return y
    if name in COMPOSED:
        values = act_constants(sig)
        ones = [1] * rank
        t["constants"] = {k: v.reshape(ones) for k, v in values.items()}
        for k in values:
            t[k] = graph.tensor(name=k, dim=ones, stride=ones, data_type=f32, is_pass_by_value=True)
        h = graph.mul(a=y, b=t["act_alpha"], compute_data_type=f32, name="act_scale")
        h = graph.add(a=h, b=t["act_beta"], compute_data_type=f32, name="act_shift")
        h = graph.relu(input=h, lower_clip=0.0, upper_clip=1.0, compute_data_type=f32, name="act_clamp")
        return graph.mul(a=y, b=h, compute_data_type=f32, name="act")
    if name == "Relu":
        return graph.relu(input=y, compute_data_type=f32, name="act")
    if name == "Clip":
        lo, hi = sig.attr("clip_min"), sig.attr("clip_max")
        kw = {}
        if lo is not None:
            kw["lower_clip"] = float(lo)
        if hi is not None:
            kw["upper_clip"] = float(hi)
        if lo is None:  # a relu clips below at 0 unless told otherwise
            kw["lower_clip"] = -math.inf
        return graph.relu(input=y, compute_data_type=f32, name="act", **kw)
    if name == "LeakyRelu":
        return graph.leaky_relu(input=y, negative_slope=float(sig.attr("act_alpha", 0.01)), compute_data_type=f32, name="act")
    if name == "Sigmoid":
        return graph.sigmoid(input=y, compute_data_type=f32, name="act")
    if name == "SiLU":
        return graph.swish(input=y, compute_data_type=f32, name="act")
    if name == "Gelu":
        return graph.gelu(input=y, compute_data_type=f32, name="act")
    if name == "GeluTanh":
        return graph.gelu_approx_tanh(input=y, compute_data_type=f32, name="act")
    raise TuningError(f"activation {name} has no cuDNN form")
