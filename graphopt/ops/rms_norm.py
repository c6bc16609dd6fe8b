"""graphopt.RMSNorm: ``Y = S / sqrt(mean(S^2, last axis) + epsilon) * scale`` (LLaMA-style RMSNorm).

``S = X + skip`` (SkipRMSNorm, a pre-norm block's residual Add taken in) when the optional ``skip``
input is given, else ``S = X``. With ``sum_output=1`` the node has a second output, ``S`` itself:
the residual stream of LLaMA-family blocks is read again by the next block's Add, so a kernel writes
the sum once instead of an Add writing it and the norm reading it back (``graphopt.LayerNorm``'s
SkipLayerNorm, for RMSNorm).

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
INPUTS = (("X", False), ("scale", False), ("skip", True))
OUTPUTS = ("Y", "S")
ATTRIBUTES: dict[str, tuple[type, Any]] = {
    "axis": (int, -1),
    "epsilon": (float, 1e-6),
    "sum_output": (int, 0),
    "lowering": (str, None),
    "lowering_params": (str, None),
    "lowering_buckets": (str, None),  # JSON, see graphopt.tune.buckets
}
FLAG_ORDER = ("skip", "sum")
SKIP = 2  # the skip input's position
DOC = ("graphopt.RMSNorm: Y = S / sqrt(mean(S * S, axis=-1) + epsilon) * scale with S = X [+ skip]; "
       "sum_output=1 adds output S.")


def _skip_given(present: list[bool]) -> bool:
    return len(present) > SKIP and present[SKIP]


def _check(attrs: dict, present: list[bool]) -> str | None:
    if attrs.get("axis", -1) != -1:
        return f"axis={attrs['axis']}: only the last axis (-1) is supported"
    eps = attrs.get("epsilon", 1e-6)
    if not (np.isfinite(eps) and eps >= 0):
        return f"epsilon={eps} must be finite and >= 0"
    if attrs.get("sum_output", 0) not in (0, 1):
        return f"sum_output={attrs['sum_output']} must be 0 or 1"
    if attrs.get("sum_output", 0) and not _skip_given(present):
        return f"sum_output=1 needs skip (input {SKIP}): without it the sum is X itself"
    return None


def _overload(attrs: dict, present: list[bool], dtype: int | None) -> str:
    flags = (["skip"] if _skip_given(present) else []) + (["sum"] if attrs.get("sum_output", 0) else [])
    return flag_key(flags, dtype_token(dtype))


def _body(overload: str, opset: int):
    flags, dtype = parse_flags(NAME, overload, FLAG_ORDER)
    if "sum" in flags and "skip" not in flags:
        raise RuleError(f"graphopt.{NAME}: malformed overload key {overload!r}: 'sum' needs 'skip'")
    b = Body(opset, dtype)
    s = b.node("Add", ["X", "skip"]) if "skip" in flags else "X"
    ms = reduce_mean_last(b, b.node("Mul", [s, s]))
    rms = b.node("Sqrt", [b.node("Add", [ms, b.const_ref("epsilon", "X")])])
    b.node("Mul", [b.node("Div", [s, rms]), "scale"], "Y")
    outputs = ["Y"]
    if "sum" in flags:
        b.node("Identity", [s], "S")
        outputs.append("S")
    return b.function(NAME, overload, [n for n, _ in INPUTS], outputs, sorted(ATTRIBUTES),
                      f"{DOC} Variant {overload!r}, opset {opset}.", DOMAIN)


def _reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    x_in, scale, skip = inputs
    s = np.asarray(x_in, dtype=np.float64)
    if skip is not None:
        s = s + np.asarray(skip, dtype=np.float64)
    w = np.asarray(scale, dtype=np.float64)
    if w.shape[-1:] != s.shape[-1:] and w.size != 1:
        raise RuleError(f"graphopt.RMSNorm reference: scale with shape {w.shape} does not match the "
                        f"normalised dim {s.shape[-1]}")
    y = s / np.sqrt((s * s).mean(axis=-1, keepdims=True) + f32(attrs.get("epsilon", 1e-6))) * w
    dtype = np.asarray(x_in).dtype
    return [y.astype(dtype)] + ([s.astype(dtype)] if attrs.get("sum_output", 0) else [])


def _output_shapes(shapes: list, attrs: dict) -> list:
    """Y (and S with sum_output=1) have X's shape."""
    return [shapes[0]] * (2 if attrs.get("sum_output", 0) else 1)


SCHEMA = OpSchema(name=NAME, inputs=INPUTS, attributes=ATTRIBUTES, doc=DOC, _check=_check,
                  _overload=_overload, _needs_dtype=lambda a, p: True, _body=_body, _reference=_reference,
                  outputs=OUTPUTS, explicit_defaults=("epsilon",), _output_shapes=_output_shapes)
