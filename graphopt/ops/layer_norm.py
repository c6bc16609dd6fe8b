"""graphopt.LayerNorm: ``Y = (S - mean(S)) / sqrt(var(S) + epsilon) * scale + bias`` over the last axis.

``S = X + skip + skip_bias`` (SkipLayerNorm) when the optional ``skip`` / ``skip_bias`` inputs are
given, else ``S = X``. With ``sum_output=1`` the node has a second output, ``S`` itself, for blocks
whose residual sum is read again downstream (GPT-2, pre-LN BERT variants): a kernel then writes the
sum once instead of an Add writing it and the norm reading it back.

The body uses ONNX LayerNormalization from opset 17 and the ReduceMean / Sub / Mul / ReduceMean /
Add / Sqrt / Div decomposition below it. Only ``axis=-1`` is accepted (rules normalise a positive
last axis to -1): the normalised dim is the last one, which is what every kernel expects.

This module also holds the small flag-key helpers the transformer ops share (``flag_key`` /
``parse_flags``): their overload keys are flag tokens in a fixed order, not activations.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import AttributeProto

from graphopt.errors import RuleError
from graphopt.ops._body import DTYPE_TOKENS, TOKEN_DTYPES, Body, dtype_token
from graphopt.ops.activations import f32
from graphopt.ops.schema import DOMAIN, OpSchema

NAME = "LayerNorm"
INPUTS = (("X", False), ("scale", False), ("bias", True), ("skip", True), ("skip_bias", True))
OUTPUTS = ("Y", "S")
ATTRIBUTES: dict[str, tuple[type, Any]] = {
    "axis": (int, -1),
    "epsilon": (float, 1e-5),
    "sum_output": (int, 0),
    "lowering": (str, None),
    "lowering_params": (str, None),
    "lowering_buckets": (str, None),  # JSON, see graphopt.tune.buckets
}
FLAG_ORDER = ("b", "skip", "sb", "sum")
NATIVE_OPSET = 17  # ONNX LayerNormalization

DOC = ("graphopt.LayerNorm: Y = LayerNormalization(X [+ skip [+ skip_bias]], scale, bias; axis=-1, epsilon); "
       "bias, skip and skip_bias are optional; sum_output=1 adds output S = the normalised sum.")


# -- overload keys shared by the transformer ops ------------------------------------------------

def flag_key(flags: list[str], dtype_tok: str | None, base: str = "base") -> str:
    """``_``-joined flags (already in canonical order) and the dtype token; ``base`` when empty."""
    tokens = list(flags) + ([dtype_tok] if dtype_tok else [])
    return "_".join(tokens) if tokens else base


def parse_flags(op: str, key: str, order: tuple[str, ...], base: str = "base") -> tuple[frozenset[str], int | None]:
    """Parse a key made by ``flag_key``; RuleError naming the op and the key when it is not canonical."""
    if key == base:
        return frozenset(), None
    tokens = key.split("_") if isinstance(key, str) and key else []
    full = list(order) + sorted(DTYPE_TOKENS.values())
    positions = [full.index(t) if t in full else -1 for t in tokens]
    dtypes = [t for t in tokens if t in TOKEN_DTYPES]
    if not tokens or -1 in positions or positions != sorted(set(positions)) or len(dtypes) > 1:
        raise RuleError(f"graphopt.{op}: malformed overload key {key!r}: expected {base!r} or these tokens in "
                        f"this order, each once: {', '.join(full)} (one dtype at most)")
    return frozenset(t for t in tokens if t in order), (TOKEN_DTYPES[dtypes[0]] if dtypes else None)


def _given(present: list[bool], i: int) -> bool:
    return i < len(present) and present[i]


# -- schema callables ---------------------------------------------------------------------------

def _check(attrs: dict, present: list[bool]) -> str | None:
    if attrs.get("axis", -1) != -1:
        return f"axis={attrs['axis']}: only the last axis (-1) is supported; normalise a positive last axis to -1"
    eps = attrs.get("epsilon", 1e-5)
    if not (np.isfinite(eps) and eps >= 0):
        return f"epsilon={eps} must be finite and >= 0"
    if attrs.get("sum_output", 0) not in (0, 1):
        return f"sum_output={attrs['sum_output']} must be 0 or 1"
    if _given(present, 4) and not _given(present, 3):
        return "skip_bias needs skip (input 3)"
    if attrs.get("sum_output", 0) and not _given(present, 3):
        return "sum_output=1 needs skip (input 3): without it the sum is X itself"
    return None


def _flags(attrs: dict, present: list[bool]) -> list[str]:
    flags = [f for f, i in (("b", 2), ("skip", 3), ("sb", 4)) if _given(present, i)]
    return flags + (["sum"] if attrs.get("sum_output", 0) else [])


def _needs_dtype(attrs: dict, present: list[bool]) -> bool:
    return True  # epsilon is a constant in the decomposed body (opset < 17)


def _overload(attrs: dict, present: list[bool], dtype: int | None) -> str:
    return flag_key(_flags(attrs, present), dtype_token(dtype))


def reduce_mean_last(b: Body, x: str) -> str:
    """ReduceMean over the last axis with keepdims, at any opset (axes is an input from opset 18)."""
    if b.opset >= 18:
        return b.node("ReduceMean", [x, int_const(b, [-1])], keepdims=1)
    return b.node("ReduceMean", [x], axes=[-1], keepdims=1)


def int_const(b: Body, values: list[int]) -> str:
    """An int64 1-D constant (shape [len(values)])."""
    from onnx import TensorProto, helper

    return b.node("Constant", [], value=helper.make_tensor("value", TensorProto.INT64, [len(values)], values))


def _body(overload: str, opset: int):
    flags, dtype = parse_flags(NAME, overload, FLAG_ORDER)
    b = Body(opset, dtype)
    s = "X"
    if "skip" in flags:
        s = b.node("Add", [s, "skip"])
        if "sb" in flags:
            s = b.node("Add", [s, "skip_bias"])
    elif "sb" in flags or "sum" in flags:
        raise RuleError(f"graphopt.{NAME}: malformed overload key {overload!r}: 'sb' and 'sum' need 'skip'")
    inputs = [s, "scale"] + (["bias"] if "b" in flags else [])
    if opset >= NATIVE_OPSET:
        b.node("LayerNormalization", inputs, "Y", axis=-1, refs={"epsilon": ("epsilon", AttributeProto.FLOAT)})
    else:
        d = b.node("Sub", [s, reduce_mean_last(b, s)])
        var = reduce_mean_last(b, b.node("Mul", [d, d]))
        std = b.node("Sqrt", [b.node("Add", [var, b.const_ref("epsilon", "X")])])
        y = b.node("Mul", [b.node("Div", [d, std]), "scale"])
        if "b" in flags:
            b.node("Add", [y, "bias"], "Y")
        else:
            b.node("Identity", [y], "Y")
    outputs = ["Y"]
    if "sum" in flags:
        b.node("Identity", [s], "S")
        outputs.append("S")
    return b.function(NAME, overload, [n for n, _ in INPUTS], outputs, sorted(ATTRIBUTES),
                      f"{DOC} Variant {overload!r}, opset {opset}.", DOMAIN)


def _f64(x) -> np.ndarray | None:
    return None if x is None else np.asarray(x, dtype=np.float64)


def layer_norm_ref(s: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """Layer normalisation of ``s`` over its last axis in float64."""
    if scale.shape[-1:] != s.shape[-1:] and scale.size != 1:
        raise RuleError(f"graphopt.LayerNorm reference: scale with shape {scale.shape} does not match the "
                        f"normalised dim {s.shape[-1]}")
    mean = s.mean(axis=-1, keepdims=True)
    var = ((s - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (s - mean) / np.sqrt(var + eps) * scale
    return y if bias is None else y + bias


def _reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    x_in, scale, bias, skip, skip_bias = inputs
    s = _f64(x_in)
    if skip is not None:
        s = s + _f64(skip)
        if skip_bias is not None:
            s = s + _f64(skip_bias)
    y = layer_norm_ref(s, _f64(scale), _f64(bias), f32(attrs.get("epsilon", 1e-5)))
    dtype = np.asarray(x_in).dtype
    out = [y.astype(dtype)]
    if attrs.get("sum_output", 0):
        out.append(s.astype(dtype))
    return out


def _output_shapes(shapes: list, attrs: dict) -> list:
    """Y (and S with sum_output=1) have X's shape."""
    return [shapes[0]] * (2 if attrs.get("sum_output", 0) else 1)


SCHEMA = OpSchema(name=NAME, inputs=INPUTS, attributes=ATTRIBUTES, doc=DOC, _check=_check,
                  _overload=_overload, _needs_dtype=_needs_dtype, _body=_body, _reference=_reference,
                  outputs=OUTPUTS, explicit_defaults=("epsilon",), _output_shapes=_output_shapes)
