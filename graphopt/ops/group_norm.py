"""graphopt.GroupNorm: ``Y = act(GroupNorm(X; num_groups, epsilon) * scale + bias)``.

``X`` is ``[N, C, ...]``; the channels split into ``num_groups`` groups, each normalised over its
channels and all spatial positions (statistics in float32). ``scale`` and ``bias`` are per channel,
shaped as the exports store them: ``[C, 1, ..., 1]`` (rank of X minus one) or ``[1, C, 1, ..., 1]``.
The activation (``activation`` and its parameters, the CBR table) covers GroupNorm -> SiLU of
diffusion UNets. The body is the exporters' own decomposition: Reshape to ``[N, G, -1]``,
InstanceNormalization, Reshape back, the channel affine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import AttributeProto, numpy_helper

from graphopt.errors import RuleError
from graphopt.ops._body import Body, dtype_token
from graphopt.ops._keys import format_key, parse_key
from graphopt.ops.activations import ACTIVATION_ATTRIBUTES, ACTIVATIONS, activation_key, check_activation, f32
from graphopt.ops.schema import DOMAIN, OpSchema

NAME = "GroupNorm"
INPUTS = (("X", False), ("scale", False), ("bias", False))
ATTRIBUTES: dict[str, tuple[type, Any]] = {"num_groups": (int, None), "epsilon": (float, 1e-5),
                                            **ACTIVATION_ATTRIBUTES}
DOC = ("graphopt.GroupNorm: Y = act(GroupNorm(X; num_groups, epsilon) * scale + bias), X [N, C, ...], scale and "
       "bias [C, 1, ..., 1]; activation is one of: " + ", ".join(ACTIVATIONS) + ".")


def _check(attrs: dict, present: list[bool]) -> str | None:
    g = attrs.get("num_groups")
    if g is None or g < 1:
        return f"num_groups={g!r} must be given and >= 1"
    eps = attrs.get("epsilon", 1e-5)
    if not (np.isfinite(eps) and eps >= 0):
        return f"epsilon={eps} must be finite and >= 0"
    return check_activation(attrs)


def _overload(attrs: dict, present: list[bool], dtype: int | None) -> str:
    return format_key([f"g{int(attrs['num_groups'])}"], activation_key(attrs), [], dtype_token(dtype))


def _body(overload: str, opset: int):
    parts = parse_key(NAME, overload, 1, ())
    lead = parts.lead[0]
    if not (lead.startswith("g") and lead[1:].isdigit() and int(lead[1:]) >= 1):
        raise RuleError(f"graphopt.{NAME}: malformed overload key {overload!r}: it starts with g<num_groups>")
    groups = int(lead[1:])
    b = Body(opset, parts.dtype)
    ints = lambda v: b.node("Constant", [], value=numpy_helper.from_array(np.asarray(v, dtype=np.int64)))  # noqa: E731
    r = b.node("Reshape", ["X", ints([0, groups, -1])])
    ones = b.node("Expand", [b.const(1.0, "X"), ints([groups])])
    zeros = b.node("Expand", [b.const(0.0, "X"), ints([groups])])
    n = b.node("InstanceNormalization", [r, ones, zeros], refs={"epsilon": ("epsilon", AttributeProto.FLOAT)})
    y = b.node("Add", [b.node("Mul", [b.node("Reshape", [n, b.node("Shape", ["X"])]), "scale"]), "bias"])
    parts.act.onnx_nodes(b, y, "Y", clip_min=parts.clip_min, clip_max=parts.clip_max)
    return b.function(NAME, overload, [n for n, _ in INPUTS], ["Y"], sorted(ATTRIBUTES),
                      f"{DOC} Variant {overload!r}, opset {opset}.", DOMAIN)


def _channel(v: np.ndarray, x: np.ndarray, what: str) -> np.ndarray:
    c, rank = x.shape[1], x.ndim
    if v.shape == (c,) + (1,) * (rank - 2) or v.shape == (1, c) + (1,) * (rank - 2):
        return v.reshape((1, c) + (1,) * (rank - 2))
    raise RuleError(f"graphopt.GroupNorm reference: {what} has shape {v.shape}, expected [{c}, 1, ...] for X {x.shape}")


def _normalize(xp, x, groups: int, eps: float):
    n, c = x.shape[:2]
    if c % groups:
        raise RuleError(f"graphopt.GroupNorm: {c} channels do not split into {groups} groups")
    r = x.reshape(n, groups, -1)
    mean = r.mean(axis=-1, keepdims=True)
    var = ((r - mean) ** 2).mean(axis=-1, keepdims=True)
    return ((r - mean) / xp.sqrt(var + eps)).reshape(x.shape)


def _reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    x_in, scale, bias = inputs
    x = np.asarray(x_in, dtype=np.float64)
    y = _normalize(np, x, int(attrs["num_groups"]), f32(attrs.get("epsilon", 1e-5)))
    y = y * _channel(np.asarray(scale, dtype=np.float64), x, "scale") + _channel(np.asarray(bias, dtype=np.float64), x, "bias")
    y = ACTIVATIONS[attrs.get("activation", "none")].numpy(y, attrs)
    return [y.astype(np.asarray(x_in).dtype)]


def _xp_impl(xp, inputs, attrs, matmul) -> list:
    """The reference's semantics against numpy / cupy, in float32, returned in X's dtype."""
    x_in, scale, bias = inputs[:3]
    x = x_in.astype(np.float32)
    c, rank = x.shape[1], x.ndim
    shape = (1, c) + (1,) * (rank - 2)
    y = _normalize(xp, x, int(attrs["num_groups"]), f32(attrs.get("epsilon", 1e-5)))
    y = y * scale.astype(np.float32).reshape(shape) + bias.astype(np.float32).reshape(shape)
    y = ACTIVATIONS[attrs.get("activation", "none")].xp(xp, y, attrs)
    return [y.astype(x_in.dtype)]


def _output_shapes(shapes: list, attrs: dict) -> list:
    """Y has X's shape."""
    return [shapes[0]]


SCHEMA = OpSchema(name=NAME, inputs=INPUTS, attributes=ATTRIBUTES, doc=DOC, _check=_check,
                  _overload=_overload, _needs_dtype=lambda a, p: True, _body=_body, _reference=_reference,
                  explicit_defaults=("epsilon",), xp_impl=_xp_impl, _output_shapes=_output_shapes)
