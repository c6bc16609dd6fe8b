"""graphopt.Gelu: ``Y = gelu(X)``, exact (``approximate="none"``, erf) or the tanh approximation.

The formulas and body emitters are the shared activation registry's ``Gelu`` / ``GeluTanh``
entries (the same ones GemmAct's bias+GELU epilogue uses), so the standalone op and the epilogue
cannot drift apart. From opset 20 the body is ONNX's own Gelu.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphopt.ops._body import Body, dtype_token
from graphopt.ops.activations import ACTIVATIONS
from graphopt.ops.layer_norm import parse_flags
from graphopt.ops.schema import DOMAIN, OpSchema

NAME = "Gelu"
INPUTS = (("X", False),)
# approximate -> activation registry entry ("quick": CLIP's QuickGELU x * sigmoid(1.702 x))
APPROXIMATIONS = {"none": "Gelu", "tanh": "GeluTanh", "quick": "QuickGelu"}
ATTRIBUTES: dict[str, tuple[type, Any]] = {
    "approximate": (str, "none"),
    "lowering": (str, None),
    "lowering_params": (str, None),
    "lowering_buckets": (str, None),  # JSON, see graphopt.tune.buckets
}
DOC = ('graphopt.Gelu: Y = 0.5 * X * (1 + erf(X / sqrt(2))) for approximate="none", '
       '0.5 * X * (1 + tanh(sqrt(2 / pi) * (X + 0.044715 X^3))) for approximate="tanh", '
       'X * sigmoid(1.702 X) for approximate="quick" (QuickGELU).')


def _check(attrs: dict, present: list[bool]) -> str | None:
    approx = attrs.get("approximate", "none")
    if approx not in APPROXIMATIONS:
        return f"approximate={approx!r} must be one of {', '.join(APPROXIMATIONS)}"
    return None


def _overload(attrs: dict, present: list[bool], dtype: int | None) -> str:
    tok = dtype_token(dtype)
    return attrs.get("approximate", "none") + (f"_{tok}" if tok else "")


def _body(overload: str, opset: int):
    approx, _, rest = overload.partition("_")
    if approx not in APPROXIMATIONS:
        from graphopt.errors import RuleError

        raise RuleError(f"graphopt.{NAME}: malformed overload key {overload!r}: expected none, tanh or quick, "
                        "then an optional dtype token")
    _, dtype = parse_flags(NAME, rest or "base", ())
    b = Body(opset, dtype)
    ACTIVATIONS[APPROXIMATIONS[approx]].onnx_nodes(b, "X", "Y")
    return b.function(NAME, overload, ["X"], ["Y"], sorted(ATTRIBUTES),
                      f"{DOC} Variant {overload!r}, opset {opset}.", DOMAIN)


def _reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    (x,) = inputs
    y = ACTIVATIONS[APPROXIMATIONS[attrs.get("approximate", "none")]].numpy(x, attrs)
    return [y.astype(np.asarray(x).dtype)]


def _xp_impl(xp, inputs, attrs, matmul) -> list:
    """Y = gelu(X) against numpy / cupy, in float32 (fp16 upcast), returned in X's dtype."""
    x = inputs[0]
    y = ACTIVATIONS[APPROXIMATIONS[attrs.get("approximate", "none")]].xp(xp, x.astype(np.float32), attrs)
    return [y.astype(x.dtype)]


def _output_shapes(shapes: list, attrs: dict) -> list:
    """Y has X's shape."""
    return [shapes[0]]


SCHEMA = OpSchema(name=NAME, inputs=INPUTS, attributes=ATTRIBUTES, doc=DOC, _check=_check,
                  _overload=_overload, _needs_dtype=lambda a, p: True, _body=_body, _reference=_reference,
                  xp_impl=_xp_impl, _output_shapes=_output_shapes)
