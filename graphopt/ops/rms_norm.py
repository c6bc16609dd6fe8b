"""graphopt.RMSNorm: ``Y = X / sqrt(mean(X^2, last axis) + epsilon) * scale`` (LLaMA-style RMSNorm).

The body is the ReduceMean / Add / Sqrt / Div / Mul decomposition at every opset (ONNX's own
RMSNormalization exists only from opset 23). Only ``axis=-1`` is accepted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphopt.errors import RuleError
from graphopt.ops._body import Body, dtype_token
from graphopt.ops.activations import f32
from graphopt.ops.layer_norm import flag_key, parse_flags, reduce_mean_last
from graphopt.ops.schema import DOMAIN, OpSchema

NAME = "RMSNorm"
INPUTS = (("X", False), ("scale", False))
ATTRIBUTES: dict[str, tuple[type, Any]] = {
    "axis": (int, -1),
    "epsilon": (float, 1e-6),
    "lowering": (str, None),
    "lowering_params": (str, None),
    "lowering_buckets": (str, None),  # JSON, see graphopt.tune.buckets
}
DOC = "graphopt.RMSNorm: Y = X / sqrt(mean(X * X, axis=-1) + epsilon) * scale."


def _check(attrs: dict, present: list[bool]) -> str | None:
    if attrs.get("axis", -1) != -1:
        return f"axis={attrs['axis']}: only the last axis (-1) is supported"
    eps = attrs.get("epsilon", 1e-6)
    if not (np.isfinite(eps) and eps >= 0):
        return f"epsilon={eps} must be finite and >= 0"
    return None


def _overload(attrs: dict, present: list[bool], dtype: int | None) -> str:
    return flag_key([], dtype_token(dtype))


def _body(overload: str, opset: int):
    _, dtype = parse_flags(NAME, overload, ())
    b = Body(opset, dtype)
    ms = reduce_mean_last(b, b.node("Mul", ["X", "X"]))
    rms = b.node("Sqrt", [b.node("Add", [ms, b.const_ref("epsilon", "X")])])
    b.node("Mul", [b.node("Div", ["X", rms]), "scale"], "Y")
    return b.function(NAME, overload, [n for n, _ in INPUTS], ["Y"], sorted(ATTRIBUTES),
                      f"{DOC} Variant {overload!r}, opset {opset}.", DOMAIN)


def _reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    x_in, scale = inputs
    x = np.asarray(x_in, dtype=np.float64)
    w = np.asarray(scale, dtype=np.float64)
    if w.shape[-1:] != x.shape[-1:] and w.size != 1:
        raise RuleError(f"graphopt.RMSNorm reference: scale with shape {w.shape} does not match the "
                        f"normalised dim {x.shape[-1]}")
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + f32(attrs.get("epsilon", 1e-6))) * w
    return [y.astype(np.asarray(x_in).dtype)]


def _output_shapes(shapes: list, attrs: dict) -> list:
    """Y has X's shape."""
    return [shapes[0]]


SCHEMA = OpSchema(name=NAME, inputs=INPUTS, attributes=ATTRIBUTES, doc=DOC, _check=_check,
                  _overload=_overload, _needs_dtype=lambda a, p: True, _body=_body, _reference=_reference,
                  explicit_defaults=("epsilon",), _output_shapes=_output_shapes)
