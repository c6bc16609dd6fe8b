"""Built-in value builders: the computed parts of a replacement.

* ``add_bias(b?, c, conv)`` -> a new bias initializer ``b + c`` of shape [M] (Conv bias folded with a
  per-channel constant Add);
* ``activation_of(act)`` -> the ``activation`` / ``act_alpha`` / ``act_beta`` / ``clip_min`` /
  ``clip_max`` attributes (ops contract) for an activation node: Relu, Sigmoid, HardSwish,
  LeakyRelu, HardSigmoid (with its alpha and beta), Clip (bounds from attributes below opset 11, from constant inputs from 11), Gelu
  (``approximate='tanh'`` gives GeluTanh);
* ``gate_activation(gate)`` -> the attributes for ``x * gate(x)``: Sigmoid gives SiLU,
  HardSigmoid gives HardSigmoidMul with its alpha and beta.

Builders are pure; a failure raises ``BuildFailed`` with the reason.
"""

from __future__ import annotations

import numpy as np

from graphopt.rewrite.constraints import conv_channels
from graphopt.rewrite.registry import BuildFailed, NewConstant, register_builder


def _dtype_of(g, *tensors) -> np.dtype | None:
    for t in tensors:
        if not t:
            continue
        info = g.constant_info(t)
        if info is not None:
            return info[0]
    return None


@register_builder("add_bias", "t?tn", "tensor")
def add_bias(g, b, c, conv):
    """A new [M] bias: conv's bias b (absent = 0) plus the per-channel constant c."""
    info = conv_channels(g, conv)
    if info is None:
        raise BuildFailed(f"the output channels of {conv.name!r} are unknown")
    m, _ = info
    cv = g.constant_value(c)
    if cv is None:
        raise BuildFailed(f"{c!r} is not a constant")
    dtype = _dtype_of(g, b, conv.inputs[1], c) or np.dtype(np.float32)
    cv = np.asarray(cv)
    extra = np.broadcast_to(cv.reshape(-1), (m,)) if cv.size == 1 else cv.reshape(m)
    if b:
        bv = g.constant_value(b)
        if bv is None:
            raise BuildFailed(f"the bias {b!r} of {conv.name!r} is not a constant, so it cannot absorb {c!r}")
        base = np.asarray(bv).reshape(m)
    else:
        base = np.zeros((m,), dtype=dtype)
    # Sum in the model's dtype, as the unfused graph does (Conv output + b, then + c).
    value = (base.astype(dtype) + extra.astype(dtype)).astype(dtype)
    return NewConstant(np.ascontiguousarray(value), f"{conv.name}_bias")


def _scalar_input(g, node, index: int, what: str) -> float | None:
    if index >= len(node.inputs) or not node.inputs[index]:
        return None
    t = node.inputs[index]
    v = g.constant_value(t)
    if v is None:
        raise BuildFailed(f"{what} {t!r} of {node.name!r} is not a constant")
    if np.size(v) != 1:
        raise BuildFailed(f"{what} {t!r} of {node.name!r} has {np.size(v)} elements, expected one")
    return float(np.asarray(v, dtype=np.float64).reshape(-1)[0])


def _float_attr(node, name: str, default: float) -> float:
    return float(node.attr(name, default)) if node.has_attr(name) else float(default)


@register_builder("scaled_by", "t?t", "tensor")
def scaled_by(g, w, s):
    """The constant float ``w`` times the constant scalar ``s``, in ``w``'s dtype (absent when ``w`` is);
    refused where a finite weight would overflow or a normal one flush to zero (the unfused graph scales
    the product, whose values are larger)."""
    if not w:
        return None
    wv, sv = g.constant_value(w), g.constant_value(s)
    if wv is None:
        raise BuildFailed(f"{w!r} is not a constant")
    if sv is None or np.size(sv) != 1 or np.ndim(sv) > 1:
        raise BuildFailed(f"{s!r} is not a constant scalar")
    wv = np.asarray(wv)
    if wv.dtype.kind != "f":
        raise BuildFailed(f"{w!r} is {wv.dtype}, not a float tensor")
    work = np.promote_types(wv.dtype, np.float32)  # fp16 weights scaled in fp32, then rounded once
    with np.errstate(all="ignore"):
        value = (wv.astype(work) * work.type(np.asarray(sv, dtype=np.float64).reshape(-1)[0])).astype(wv.dtype)
    tiny = np.finfo(wv.dtype).tiny
    lost = (np.isfinite(wv) & ~np.isfinite(value)) | ((np.abs(wv) >= tiny) & (value == 0))
    if lost.any():
        raise BuildFailed(f"scaling {w!r} by {s!r} would overflow or flush to zero {int(lost.sum())} of its {wv.dtype} values")
    return NewConstant(np.ascontiguousarray(value), f"{w}_scaled")


@register_builder("activation_of", "n", "attrs")
def activation_of(g, act):
    """The activation attributes that reproduce the activation node act."""
    op = act.op_type if act.domain in ("", "ai.onnx") else f"{act.domain}.{act.op_type}"
    if op in ("Relu", "Sigmoid", "HardSwish"):
        return {"activation": op}
    if op == "LeakyRelu":
        return {"activation": "LeakyRelu", "act_alpha": _float_attr(act, "alpha", 0.01)}
    if op == "HardSigmoid":
        return {"activation": "HardSigmoid", "act_alpha": _float_attr(act, "alpha", 0.2),
                "act_beta": _float_attr(act, "beta", 0.5)}
    if op == "Clip":
        out = {"activation": "Clip"}
        if len(act.inputs) > 1 and any(act.inputs[1:]):  # opset >= 11: bounds are inputs
            lo = _scalar_input(g, act, 1, "Clip min")
            hi = _scalar_input(g, act, 2, "Clip max")
        else:  # opset < 11: bounds are attributes (absent = unbounded)
            lo = float(act.attr("min")) if act.has_attr("min") else None
            hi = float(act.attr("max")) if act.has_attr("max") else None
        for key, v in (("clip_min", lo), ("clip_max", hi)):
            if v is not None and np.isfinite(v):
                out[key] = v
        return out
    if op == "Gelu":
        approx = act.attr("approximate", "none")
        if isinstance(approx, bytes):
            approx = approx.decode()
        if approx not in ("none", "tanh"):
            raise BuildFailed(f"Gelu {act.name!r} has approximate={approx!r}")
        return {"activation": "GeluTanh" if approx == "tanh" else "Gelu"}
    raise BuildFailed(f"{op} {act.name!r} is not a supported activation")


@register_builder("gate_activation", "n", "attrs")
def gate_activation(g, gate):
    """The activation attributes for x * gate(x): Sigmoid -> SiLU, HardSigmoid -> HardSigmoidMul."""
    if gate.domain not in ("", "ai.onnx"):
        raise BuildFailed(f"{gate.op_type} {gate.name!r} is not a supported gate")
    if gate.op_type == "Sigmoid":
        return {"activation": "SiLU"}
    if gate.op_type == "HardSigmoid":
        return {"activation": "HardSigmoidMul", "act_alpha": _float_attr(gate, "alpha", 0.2),
                "act_beta": _float_attr(gate, "beta", 0.5)}
    raise BuildFailed(f"{gate.op_type} {gate.name!r} is not a supported gate (Sigmoid, HardSigmoid)")
