"""graphopt.RoPE: rotary position embedding, ``Y = X * cos + rotate(X) * sin``.

``X`` is ``[..., D]`` (D even), ``cos`` and ``sin`` broadcast to ``X`` (the exports'
``[B or 1, 1, S, D]`` tables, from a cache or computed from the positions: any runtime tensor).
``interleaved=0`` rotates halves (``rotate_half``: LLaMA, Qwen2, Mistral, GPT-NeoX):
``rotate(X) = concat(-X[..., D/2:], X[..., :D/2])``; ``interleaved=1`` rotates pairs (GPT-J,
``rotate_every_two``): ``rotate(X)[..., 2i] = -X[..., 2i+1]``, ``rotate(X)[..., 2i+1] = X[..., 2i]``.

``x_bshd=1`` (rank 4): X comes as ``[B, S, H, D]``, the head split's Reshape output, and the op rotates
``Transpose(X, [0, 2, 1, 3])``: Y is ``[B, H, S, D]`` and cos / sin broadcast to Y. The Transpose an export
writes between the head split and the rotation (LLaMA's Q and K, a copy each a layer) goes into the op
(rule ``rope_x_bshd``); the kernels read X's rows where they lie.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import numpy_helper

from graphopt.errors import RuleError
from graphopt.ops._body import Body
from graphopt.ops.schema import DOMAIN, LOWERING_ATTRIBUTES, OpSchema

NAME = "RoPE"
INPUTS = (("X", False), ("cos", False), ("sin", False))
ATTRIBUTES: dict[str, tuple[type, Any]] = {"interleaved": (int, 0), "x_bshd": (int, 0), **LOWERING_ATTRIBUTES}
FORMS = ("half", "interleaved")
BSHD = "_bshd"  # the overload key's suffix for x_bshd=1
HEADS_PERM = (0, 2, 1, 3)  # [B, S, H, D] <-> [B, H, S, D]
MIN_OPSET = 10  # Slice with starts/ends/axes/steps inputs
DOC = ("graphopt.RoPE: Y = X * cos + rotate(X) * sin; interleaved=0 rotates halves "
       "(concat(-X[..., D/2:], X[..., :D/2])), interleaved=1 rotates pairs (GPT-J).")
_BIG = np.iinfo(np.int64).max


def _check(attrs: dict, present: list[bool]) -> str | None:
    for name in ("interleaved", "x_bshd"):
        if attrs.get(name, 0) not in (0, 1):
            return f"{name}={attrs[name]} must be 0 or 1"
    return None


def _overload(attrs: dict, present: list[bool], dtype: int | None) -> str:
    return FORMS[attrs.get("interleaved", 0)] + (BSHD if attrs.get("x_bshd", 0) else "")


def x_bshd(attrs) -> bool:
    """Whether X comes as ``[B, S, H, D]`` (Y is ``[B, H, S, D]``)."""
    return bool(attrs.get("x_bshd", 0))


def rotated_shape(x_shape, attrs):
    """The shape of the tensor the op rotates (Y's): X's, or X's with axes 1 and 2 swapped (``x_bshd=1``)."""
    if x_shape is None or not x_bshd(attrs):
        return x_shape
    if len(x_shape) != 4:
        raise RuleError(f"graphopt.{NAME}: x_bshd=1 needs a rank-4 X [B, S, H, D], got shape {tuple(x_shape)}")
    return tuple(x_shape[i] for i in HEADS_PERM)


def _ints(b: Body, values) -> str:
    return b.node("Constant", [], value=numpy_helper.from_array(np.asarray(values, dtype=np.int64)))


def _unsqueeze_last(b: Body, x: str) -> str:
    if b.opset >= 13:
        return b.node("Unsqueeze", [x, _ints(b, [-1])])
    return b.node("Unsqueeze", [x], axes=[-1])


def _body(overload: str, opset: int):
    form = overload[:-len(BSHD)] if overload.endswith(BSHD) else overload
    if form not in FORMS:
        raise RuleError(f"graphopt.{NAME}: malformed overload key {overload!r}: expected one of "
                        f"{', '.join(f + t for t in ('', BSHD) for f in FORMS)}")
    if opset < MIN_OPSET:
        raise RuleError(f"graphopt.{NAME}: function bodies need default-domain opset >= {MIN_OPSET}, got {opset}")
    b = Body(opset)
    x = b.node("Transpose", ["X"], perm=list(HEADS_PERM)) if form != overload else "X"
    if form == "half":
        # An equal Split (not Slices at a computed D/2): shape inference then keeps every dim.
        lo, hi = b.tmp("lo"), b.tmp("hi")
        b.node("Split", [x], lo, axis=-1, **({"num_outputs": 2} if opset >= 18 else {}))
        b.nodes[-1].output.append(hi)
        rot = b.node("Concat", [b.node("Neg", [hi]), lo], axis=-1)
    else:
        last, one, two = _ints(b, [-1]), _ints(b, [1]), _ints(b, [2])
        even = b.node("Slice", [x, _ints(b, [0]), _ints(b, [_BIG]), last, two])
        odd = b.node("Slice", [x, one, _ints(b, [_BIG]), last, two])
        pairs = b.node("Concat", [_unsqueeze_last(b, b.node("Neg", [odd])), _unsqueeze_last(b, even)], axis=-1)
        rot = b.node("Reshape", [pairs, b.node("Shape", [x])])
    b.node("Add", [b.node("Mul", [x, "cos"]), b.node("Mul", [rot, "sin"])], "Y")
    return b.function(NAME, overload, [n for n, _ in INPUTS], ["Y"], sorted(ATTRIBUTES),
                      f"{DOC} Variant {overload!r}, opset {opset}.", DOMAIN)


def rotate(xp, x, interleaved: int):
    """rotate(X) of the op, against numpy or cupy."""
    d = x.shape[-1]
    if d % 2:
        raise RuleError(f"graphopt.RoPE: the rotated dim must be even, got {d}")
    if interleaved:
        return xp.stack((-x[..., 1::2], x[..., 0::2]), axis=-1).reshape(x.shape)
    return xp.concatenate((-x[..., d // 2:], x[..., : d // 2]), axis=-1)


def _reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    x_in, cos, sin = inputs
    x, c, s = (np.asarray(t, dtype=np.float64) for t in (x_in, cos, sin))
    if x_bshd(attrs):
        rotated_shape(x.shape, attrs)  # the rank check
        x = x.transpose(HEADS_PERM)
    y = x * c + rotate(np, x, attrs.get("interleaved", 0)) * s
    if y.shape != x.shape:
        raise RuleError(f"graphopt.RoPE reference: cos {c.shape} / sin {s.shape} enlarge X {x.shape}")
    return [y.astype(np.asarray(x_in).dtype)]


def _xp_impl(xp, inputs, attrs, matmul) -> list:
    """Y = X cos + rotate(X) sin in float32, returned in X's dtype."""
    x_in, cos, sin = inputs[:3]
    x = x_in.astype(np.float32)
    if x_bshd(attrs):
        x = xp.ascontiguousarray(x.transpose(HEADS_PERM))
    y = x * cos.astype(np.float32) + rotate(xp, x, attrs.get("interleaved", 0)) * sin.astype(np.float32)
    return [y.astype(x_in.dtype)]


def _output_shapes(shapes: list, attrs: dict) -> list:
    """Y has X's shape, or X's with axes 1 and 2 swapped (``x_bshd=1``)."""
    return [rotated_shape(shapes[0], attrs)]


SCHEMA = OpSchema(name=NAME, inputs=INPUTS, attributes=ATTRIBUTES, doc=DOC, _check=_check,
                  _overload=_overload, _needs_dtype=lambda a, p: False, _body=_body, _reference=_reference,
                  xp_impl=_xp_impl, _output_shapes=_output_shapes)
