"""graphopt.GemmAct: ``Y = act(MatMul(A, B) + C)`` (mode "matmul") or ``act(Gemm(A, B, C))`` (mode "gemm").

Mode "matmul" is NumPy-style batched, broadcasting matmul with C broadcast-added; mode "gemm" has
ONNX Gemm semantics, with alpha, beta, transA and transB copied verbatim from the Gemm and passed
to the body's Gemm by reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import AttributeProto

from graphopt.errors import RuleError
from graphopt.ops._body import Body, dtype_token
from graphopt.ops._keys import format_key, parse_key
from graphopt.ops.activations import ACTIVATION_ATTRIBUTES, ACTIVATIONS, f32, activation_key, check_activation
from graphopt.ops.schema import DOMAIN, OpSchema

NAME = "GemmAct"
INPUTS = (("A", False), ("B", False), ("C", True))
MODES = ("matmul", "gemm")
GEMM_ATTRS: dict[str, int] = {
    "alpha": AttributeProto.FLOAT,
    "beta": AttributeProto.FLOAT,
    "transA": AttributeProto.INT,
    "transB": AttributeProto.INT,
}

ATTRIBUTES: dict[str, tuple[type, Any]] = {
    "mode": (str, "matmul"),
    "alpha": (float, 1.0),
    "beta": (float, 1.0),
    "transA": (int, 0),
    "transB": (int, 0),
    **ACTIVATION_ATTRIBUTES,
}

DOC = ('graphopt.GemmAct: Y = act(MatMul(A, B) + C) for mode "matmul", act(Gemm(A, B, C; alpha, beta, '
       'transA, transB)) for mode "gemm"; C is optional; activation is one of: ' + ", ".join(ACTIVATIONS) + ".")


def _check(attrs: dict, present: list[bool]) -> str | None:
    mode = attrs.get("mode", "matmul")
    if mode not in MODES:
        return f"mode={mode!r} must be one of {', '.join(MODES)}"
    if mode == "matmul":
        given = [a for a in GEMM_ATTRS if attrs.get(a) is not None]
        if given:
            return f"attributes {', '.join(given)} only apply to mode 'gemm', not 'matmul'"
    for name in ("transA", "transB"):
        if attrs.get(name, 0) not in (0, 1):
            return f"{name}={attrs[name]} must be 0 or 1"
    return check_activation(attrs)


def _has_c(present: list[bool]) -> bool:
    return len(present) > 2 and present[2]


def _needs_dtype(attrs: dict, present: list[bool]) -> bool:
    act = ACTIVATIONS[attrs.get("activation", "none")]
    # Gemm before opset 11 requires C: a typed zero stands in when it is absent.
    return act.typed_constants or (attrs.get("mode", "matmul") == "gemm" and not _has_c(present))


def _overload(attrs: dict, present: list[bool], dtype: int | None) -> str:
    tok = dtype_token(dtype) if _needs_dtype(attrs, present) else None
    return format_key([attrs.get("mode", "matmul")], activation_key(attrs), ["c"] if _has_c(present) else [], tok)


def _body(overload: str, opset: int):
    parts = parse_key(NAME, overload, 1, ("c",))
    if parts.lead[0] not in MODES:
        raise RuleError(f"graphopt.{NAME}: malformed overload key {overload!r}: mode must be one of {', '.join(MODES)}")
    b = Body(opset, parts.dtype)
    has_c = "c" in parts.flags
    if parts.lead[0] == "matmul":
        y = b.node("MatMul", ["A", "B"])
        if has_c:
            y = b.node("Add", [y, "C"])
    else:
        c = ["C"] if has_c else ([] if opset >= 11 else [b.const(0.0, "A")])
        y = b.node("Gemm", ["A", "B"] + c, refs={name: (name, typ) for name, typ in GEMM_ATTRS.items()})
    parts.act.onnx_nodes(b, y, "Y", clip_min=parts.clip_min, clip_max=parts.clip_max)
    return b.function(NAME, overload, [n for n, _ in INPUTS], ["Y"], sorted(ATTRIBUTES),
                      f"{DOC} Variant {overload!r}, opset {opset}.", DOMAIN)


def _reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    a_in, b_in, c_in = inputs
    a = np.asarray(a_in, dtype=np.float64)
    b = np.asarray(b_in, dtype=np.float64)
    c = None if c_in is None else np.asarray(c_in, dtype=np.float64)
    if attrs.get("mode", "matmul") == "matmul":
        try:
            y = np.matmul(a, b)
        except ValueError as exc:
            raise RuleError(f"graphopt.GemmAct reference: MatMul of {a.shape} and {b.shape} fails: {exc}") from None
        if c is not None:
            try:
                y = y + c
            except ValueError:
                raise RuleError(f"graphopt.GemmAct reference: C with shape {c.shape} does not broadcast "
                                f"with the MatMul output {y.shape}") from None
    else:
        if a.ndim != 2 or b.ndim != 2:
            raise RuleError(f"graphopt.GemmAct reference: mode 'gemm' needs 2-D A and B, got {a.shape} and {b.shape}")
        a = a.T if attrs.get("transA", 0) else a
        b = b.T if attrs.get("transB", 0) else b
        if a.shape[1] != b.shape[0]:
            raise RuleError(f"graphopt.GemmAct reference: Gemm inner dims differ: A' {a.shape}, B' {b.shape}")
        y = f32(attrs.get("alpha", 1.0)) * (a @ b)
        if c is not None:
            out = y.shape
            y = y + f32(attrs.get("beta", 1.0)) * c
            if y.shape != out:
                raise RuleError(f"graphopt.GemmAct reference: C with shape {c.shape} must broadcast to {out}")
    y = ACTIVATIONS[attrs.get("activation", "none")].numpy(y, attrs)
    return [y.astype(np.asarray(a_in).dtype)]


def matmul_shape(a, b) -> tuple[int, ...]:
    """numpy.matmul's output shape (1-D operands promoted and dropped as matmul does)."""
    a1, b1 = len(a) == 1, len(b) == 1
    a2 = (1,) + tuple(a) if a1 else tuple(a)
    b2 = tuple(b) + (1,) if b1 else tuple(b)
    out = tuple(np.broadcast_shapes(a2[:-2], b2[:-2])) + (a2[-2], b2[-1])
    if a1:
        out = out[:-2] + out[-1:]
    if b1:
        out = out[:-1]
    return out


def _output_shapes(shapes: list, attrs: dict) -> list:
    """matmul mode: numpy.matmul's shape; gemm mode: (M, N) after transA / transB."""
    a, b = shapes[0], shapes[1]
    if attrs.get("mode", "matmul") == "gemm":
        return [(a[1] if attrs.get("transA", 0) else a[0], b[0] if attrs.get("transB", 0) else b[1])]
    return [matmul_shape(a, b)]


def _check_input(i: int, shape: tuple, dtype: str, attrs, rng) -> np.ndarray | None:
    """B scaled by 1/sqrt(K) (its reduced dim: the last with transB in gemm mode), so the check's
    outputs stay O(1)."""
    if i != 1:
        return None
    transposed = attrs.get("transB", 0) and attrs.get("mode", "matmul") == "gemm"
    fan_in = int(shape[0] if len(shape) == 1 else (shape[-1] if transposed else shape[-2]))
    return (rng.standard_normal(shape) / np.sqrt(max(1, fan_in))).astype(dtype)


SCHEMA = OpSchema(name=NAME, inputs=INPUTS, attributes=ATTRIBUTES, doc=DOC, _check=_check,
                  _overload=_overload, _needs_dtype=_needs_dtype, _body=_body, _reference=_reference, _output_shapes=_output_shapes,
                  _check_input=_check_input)
