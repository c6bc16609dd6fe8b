"""graphopt.GatedMLP: ``Y = act(X @ Wg [+ Bg]) * (X @ Wu [+ Bu])``, the gated MLP of current LLMs.

SwiGLU (LLaMA, Qwen2, Mistral: ``activation="SiLU"``) and GeGLU (T5 v1.1: ``"GeluTanh"``; ``"Gelu"``
for the erf form) up to the product; the down projection stays a separate MatMul after it. ``X`` is
``[..., K]``, ``Wg`` and ``Wu`` are ``[K, N]`` (the exports' transposed Linear weights), the optional
biases ``[N]``. Both GEMMs read the same ``X``, so a lowering may run them as one GEMM over the
concatenated weights ``[K, 2N]`` with the gate applied in the epilogue. The activation is any entry
of the shared activation registry (the same table as CBR and GemmAct).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphopt.errors import RuleError
from graphopt.ops._body import Body, dtype_token
from graphopt.ops._keys import format_key, parse_key
from graphopt.ops.activations import ACTIVATION_ATTRIBUTES, ACTIVATIONS, activation_key, check_activation
from graphopt.ops.schema import DOMAIN, OpSchema

NAME = "GatedMLP"
INPUTS = (("X", False), ("Wg", False), ("Wu", False), ("Bg", True), ("Bu", True))
FLAGS = ("bg", "bu")
ATTRIBUTES: dict[str, tuple[type, Any]] = dict(ACTIVATION_ATTRIBUTES)
DOC = ("graphopt.GatedMLP: Y = act(X @ Wg + Bg) * (X @ Wu + Bu), Bg and Bu optional (SwiGLU: activation "
       "SiLU; GeGLU: Gelu or GeluTanh); activation is one of: " + ", ".join(ACTIVATIONS) + ".")


def _flags(present: list[bool]) -> list[str]:
    return [f for f, i in zip(FLAGS, (3, 4)) if len(present) > i and present[i]]


def _check(attrs: dict, present: list[bool]) -> str | None:
    return check_activation(attrs)


def _needs_dtype(attrs: dict, present: list[bool]) -> bool:
    return ACTIVATIONS[attrs.get("activation", "none")].typed_constants


def _overload(attrs: dict, present: list[bool], dtype: int | None) -> str:
    tok = dtype_token(dtype) if _needs_dtype(attrs, present) else None
    return format_key(["glu"], activation_key(attrs), _flags(present), tok)


def _body(overload: str, opset: int):
    parts = parse_key(NAME, overload, 1, FLAGS)
    if parts.lead != ("glu",):
        raise RuleError(f"graphopt.{NAME}: malformed overload key {overload!r}: it starts with 'glu'")
    b = Body(opset, parts.dtype)
    gate = b.node("MatMul", ["X", "Wg"])
    if "bg" in parts.flags:
        gate = b.node("Add", [gate, "Bg"])
    up = b.node("MatMul", ["X", "Wu"])
    if "bu" in parts.flags:
        up = b.node("Add", [up, "Bu"])
    act = b.tmp("act")
    parts.act.onnx_nodes(b, gate, act, clip_min=parts.clip_min, clip_max=parts.clip_max)
    b.node("Mul", [act, up], "Y")
    return b.function(NAME, overload, [n for n, _ in INPUTS], ["Y"], sorted(ATTRIBUTES),
                      f"{DOC} Variant {overload!r}, opset {opset}.", DOMAIN)


def _shapes_ok(x, wg, wu, bg, bu) -> None:
    if wg.ndim != 2 or wu.shape != wg.shape or x.shape[-1:] != wg.shape[:1]:
        raise RuleError(f"graphopt.GatedMLP reference: X {x.shape}, Wg {wg.shape} and Wu {wu.shape} must be "
                        "[..., K], [K, N] and [K, N]")
    for name, v in (("Bg", bg), ("Bu", bu)):
        if v is not None and v.shape not in ((wg.shape[1],), (1, wg.shape[1])):
            raise RuleError(f"graphopt.GatedMLP reference: {name} has shape {v.shape}, expected [{wg.shape[1]}]")


def _reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    x_in = inputs[0]
    x, wg, wu = (np.asarray(t, dtype=np.float64) for t in inputs[:3])
    bg, bu = (None if t is None else np.asarray(t, dtype=np.float64) for t in inputs[3:5])
    _shapes_ok(x, wg, wu, bg, bu)
    gate = x @ wg + (0.0 if bg is None else bg)
    up = x @ wu + (0.0 if bu is None else bu)
    y = ACTIVATIONS[attrs.get("activation", "none")].numpy(gate, attrs) * up
    return [y.astype(np.asarray(x_in).dtype)]


def _xp_impl(xp, inputs, attrs, matmul) -> list:
    """Two GEMMs through the runtime's ``matmul`` (fp16 operands stay fp16 for tensor cores), then the
    fused gate in float32: act(x Wg + bg) * (x Wu + bu), returned in X's dtype."""
    x, wg, wu = inputs[:3]
    bg = inputs[3] if len(inputs) > 3 else None
    bu = inputs[4] if len(inputs) > 4 else None
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    gate = matmul(x2, wg).astype(np.float32)
    up = matmul(x2, wu).astype(np.float32)
    if bg is not None:
        gate = gate + bg.astype(np.float32).reshape(-1)
    if bu is not None:
        up = up + bu.astype(np.float32).reshape(-1)
    y = ACTIVATIONS[attrs.get("activation", "none")].xp(xp, gate, attrs) * up
    return [y.astype(x.dtype).reshape(lead + (wg.shape[1],))]


def _output_shapes(shapes: list, attrs: dict) -> list:
    """X [..., K] times Wg [K, N]: [..., N]."""
    from graphopt.ops.gemm_act import matmul_shape

    return [matmul_shape(shapes[0], shapes[1])]


def _check_input(i: int, shape: tuple, dtype: str, attrs, rng) -> np.ndarray | None:
    """Wg and Wu scaled by 1/sqrt(K), so the check's gate and up projections stay O(1)."""
    if i not in (1, 2):
        return None
    return (rng.standard_normal(shape) / np.sqrt(max(1, int(shape[0])))).astype(dtype)


SCHEMA = OpSchema(name=NAME, inputs=INPUTS, attributes=ATTRIBUTES, doc=DOC, _check=_check,
                  _overload=_overload, _needs_dtype=_needs_dtype, _body=_body, _reference=_reference,
                  xp_impl=_xp_impl, _output_shapes=_output_shapes, _check_input=_check_input)
