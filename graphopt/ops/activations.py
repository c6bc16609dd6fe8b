"""The activations graphopt's fused ops accept: one registry shared by CBR and GemmAct.

Each entry has a float64 NumPy implementation (the ground truth) and an emitter of ONNX nodes
for a function body at a given default-domain opset, including the decompositions old opsets
need (HardSwish before 14, Clip's attribute form before 11, Gelu before 20).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
from onnx import AttributeProto

from graphopt.ops._body import Body
from graphopt.ops.schema import LOWERING_ATTRIBUTES

F = AttributeProto.FLOAT

# Activation parameters a node may carry, with the activations that read them.
PARAM_NAMES: tuple[str, ...] = ("act_alpha", "act_beta", "clip_min", "clip_max")


def f32(value: Any) -> float:
    """ONNX stores float attributes as float32: the reference uses exactly that value."""
    return float(np.float32(value))


def _param(attrs: Mapping[str, Any], name: str, default: float | None) -> float | None:
    value = attrs.get(name)
    return default if value is None else f32(value)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp(-logaddexp(0, -x)) = 1 / (1 + exp(-x)) without overflow for large |x|.
    return np.exp(-np.logaddexp(0.0, -x))


# NumPy has no erf and scipy is not a dependency; math.erf is correctly rounded in float64, and
# np.vectorize applies it elementwise (a C-level loop over the flat array, fine for test sizes).
_erf = np.vectorize(math.erf, otypes=[np.float64])


#: QuickGELU's sigmoid slope (CLIP): x * sigmoid(1.702 x). Taken as float32, as the exports store it.
QUICK_GELU_ALPHA = 1.702


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.clip(alpha * x + beta, 0.0, 1.0)


@dataclass(frozen=True)
class Activation:
    """One activation: ``numpy(x, attrs)`` in float64 and ``onnx_nodes(body, x, y)``.

    ``key`` is its overload-key token; ``params`` are the node attributes it reads;
    ``typed_constants`` says whether its body (below opset 20/15) holds numeric constants.
    """

    name: str
    key: str
    doc: str
    params: tuple[str, ...]
    _numpy: Callable[[np.ndarray, Mapping[str, Any]], np.ndarray]
    _emit: Callable[..., None]
    typed_constants: bool = False
    # ``xp(xp, x, attrs)``: the activation against an array module (numpy or cupy), in x's dtype
    # (callers pass float32): how ``xp_impl`` of an op applies it on the device.
    _xp: Callable[..., Any] | None = None

    def numpy(self, x: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
        """Apply the activation to ``x`` in float64."""
        return self._numpy(np.asarray(x, dtype=np.float64), attrs)

    def xp(self, xp, x, attrs: Mapping[str, Any]):
        """Apply the activation to the array ``x`` of module ``xp`` (numpy or cupy) in x's dtype."""
        return self._xp(xp, x, attrs)

    def onnx_nodes(self, body: Body, x: str, y: str, *, clip_min: bool = False, clip_max: bool = False) -> None:
        """Append to ``body`` the nodes computing ``y = act(x)``.

        ``clip_min`` / ``clip_max`` say whether the calling node carries those bounds (encoded in
        the overload key, because an absent bound must leave the Clip input empty).
        """
        self._emit(body, x, y, clip_min=clip_min, clip_max=clip_max)


# -- emitters ------------------------------------------------------------------------------------

def _emit_none(b: Body, x: str, y: str, **_: bool) -> None:
    b.node("Identity", [x], y)


def _emit_unary(op: str) -> Callable[..., None]:
    def emit(b: Body, x: str, y: str, **_: bool) -> None:
        b.node(op, [x], y)
    return emit


def _emit_leaky(b: Body, x: str, y: str, **_: bool) -> None:
    b.node("LeakyRelu", [x], y, refs={"alpha": ("act_alpha", F)})  # absent -> ONNX default 0.01


def _emit_silu(b: Body, x: str, y: str, **_: bool) -> None:
    b.node("Mul", [x, b.node("Sigmoid", [x])], y)


def _emit_hardswish(b: Body, x: str, y: str, **_: bool) -> None:
    if b.opset >= 14:
        b.node("HardSwish", [x], y)
    else:  # HardSwish(x) = x * HardSigmoid(x; 1/6, 0.5), HardSigmoid exists since opset 6
        b.node("Mul", [x, b.node("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)], y)


def _emit_hardsigmoid_mul(b: Body, x: str, y: str, **_: bool) -> None:
    # Absent act_alpha / act_beta fall back to HardSigmoid's own defaults (0.2, 0.5).
    hs = b.node("HardSigmoid", [x], refs={"alpha": ("act_alpha", F), "beta": ("act_beta", F)})
    b.node("Mul", [x, hs], y)


def _emit_hardsigmoid(b: Body, x: str, y: str, **_: bool) -> None:
    b.node("HardSigmoid", [x], y, refs={"alpha": ("act_alpha", F), "beta": ("act_beta", F)})


def _emit_quick_gelu(b: Body, x: str, y: str, **_: bool) -> None:
    # x * sigmoid(1.702 x): CLIP's QuickGELU
    b.node("Mul", [x, b.node("Sigmoid", [b.node("Mul", [x, b.const(QUICK_GELU_ALPHA, x)])])], y)


def _emit_clip(b: Body, x: str, y: str, *, clip_min: bool = False, clip_max: bool = False) -> None:
    if b.opset < 11:  # Clip-6: bounds are attributes; absent ones default to -/+ FLT_MAX
        b.node("Clip", [x], y, refs={"min": ("clip_min", F), "max": ("clip_max", F)})
        return
    lo = b.const_ref("clip_min", x) if clip_min else ""
    hi = b.const_ref("clip_max", x) if clip_max else ""
    inputs = [x, lo, hi]
    while inputs[-1] == "":
        inputs.pop()
    b.node("Clip", inputs, y)


def _emit_gelu(b: Body, x: str, y: str, **_: bool) -> None:
    if b.opset >= 20:
        b.node("Gelu", [x], y, approximate="none")
        return
    # 0.5 * x * (1 + erf(x / sqrt(2)))
    e = b.node("Erf", [b.node("Mul", [x, b.const(1.0 / math.sqrt(2.0), x)])])
    u = b.node("Add", [e, b.const(1.0, x)])
    b.node("Mul", [b.node("Mul", [x, b.const(0.5, x)]), u], y)


def _emit_gelu_tanh(b: Body, x: str, y: str, **_: bool) -> None:
    if b.opset >= 20:
        b.node("Gelu", [x], y, approximate="tanh")
        return
    # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))); x^3 as two Muls, because Pow's
    # exponent must share x's type before opset 12.
    x3 = b.node("Mul", [b.node("Mul", [x, x]), x])
    inner = b.node("Add", [x, b.node("Mul", [x3, b.const(0.044715, x)])])
    t = b.node("Tanh", [b.node("Mul", [inner, b.const(math.sqrt(2.0 / math.pi), x)])])
    u = b.node("Add", [t, b.const(1.0, x)])
    b.node("Mul", [b.node("Mul", [x, b.const(0.5, x)]), u], y)


# -- NumPy ---------------------------------------------------------------------------------------

def _np_clip(x: np.ndarray, a: Mapping[str, Any]) -> np.ndarray:
    lo, hi = _param(a, "clip_min", None), _param(a, "clip_max", None)
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return x


def _np_leaky(x: np.ndarray, a: Mapping[str, Any]) -> np.ndarray:
    return np.where(x >= 0, x, _param(a, "act_alpha", 0.01) * x)


def _np_hardsigmoid_mul(x: np.ndarray, a: Mapping[str, Any]) -> np.ndarray:
    return x * _hard_sigmoid(x, _param(a, "act_alpha", 0.2), _param(a, "act_beta", 0.5))


def _np_gelu_tanh(x: np.ndarray, _: Mapping[str, Any]) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# -- array-module (numpy / cupy) forms ------------------------------------------------------------

def _xp_sigmoid(xp, x):
    return 0.5 * (xp.tanh(0.5 * x) + 1)  # no overflow for large |x|


def xp_erf(xp, x):
    """erf against numpy (math.erf per element: the host path is a testing aid) or cupy."""
    if xp is np:
        return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)
    import cupyx.scipy.special as sp  # pragma: no cover - GPU only

    return sp.erf(x)


def _xp_param(a: Mapping[str, Any], name: str, default):
    return default if a.get(name) is None else f32(a[name])


def _xp_clip(xp, x, a):
    lo, hi = _xp_param(a, "clip_min", None), _xp_param(a, "clip_max", None)
    if lo is not None:
        x = xp.maximum(x, x.dtype.type(lo))
    if hi is not None:
        x = xp.minimum(x, x.dtype.type(hi))
    return x


def _xp_hard_sigmoid(xp, x, a):
    return xp.clip(x * _xp_param(a, "act_alpha", 0.2) + _xp_param(a, "act_beta", 0.5), 0, 1)


_XP: dict[str, Callable[..., Any]] = {
    "none": lambda xp, x, a: x,
    "Relu": lambda xp, x, a: xp.maximum(x, 0),
    "Clip": _xp_clip,
    "LeakyRelu": lambda xp, x, a: xp.where(x >= 0, x, x * _xp_param(a, "act_alpha", 0.01)),
    "Sigmoid": lambda xp, x, a: _xp_sigmoid(xp, x),
    "SiLU": lambda xp, x, a: x * _xp_sigmoid(xp, x),
    "HardSwish": lambda xp, x, a: x * xp.clip(x / 6 + 0.5, 0, 1),
    "HardSigmoidMul": lambda xp, x, a: x * _xp_hard_sigmoid(xp, x, a),
    "HardSigmoid": _xp_hard_sigmoid,
    "Gelu": lambda xp, x, a: 0.5 * x * (1 + xp_erf(xp, x / math.sqrt(2.0))),
    "GeluTanh": lambda xp, x, a: 0.5 * x * (1 + xp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    "QuickGelu": lambda xp, x, a: x * _xp_sigmoid(xp, x * f32(QUICK_GELU_ALPHA)),
}


_ALL: tuple[Activation, ...] = (
    Activation("none", "none", "identity", (), lambda x, a: x, _emit_none),
    Activation("Relu", "relu", "max(x, 0)", (), lambda x, a: np.maximum(x, 0.0), _emit_unary("Relu")),
    Activation("Clip", "clip", "min(max(x, clip_min), clip_max); absent bounds are unbounded (ReLU6 = 0, 6)",
               ("clip_min", "clip_max"), _np_clip, _emit_clip, typed_constants=True),
    Activation("LeakyRelu", "leakyrelu", "x if x >= 0 else act_alpha * x (act_alpha default 0.01)",
               ("act_alpha",), _np_leaky, _emit_leaky),
    Activation("Sigmoid", "sigmoid", "1 / (1 + exp(-x))", (), lambda x, a: _sigmoid(x), _emit_unary("Sigmoid")),
    Activation("SiLU", "silu", "x * sigmoid(x)", (), lambda x, a: x * _sigmoid(x), _emit_silu),
    Activation("HardSwish", "hardswish", "x * max(0, min(1, x / 6 + 0.5))", (),
               lambda x, a: x * _hard_sigmoid(x, 1.0 / 6.0, 0.5), _emit_hardswish),
    Activation("HardSigmoidMul", "hardsigmoidmul",
               "x * max(0, min(1, act_alpha * x + act_beta)) (defaults 0.2, 0.5)",
               ("act_alpha", "act_beta"), _np_hardsigmoid_mul, _emit_hardsigmoid_mul),
    Activation("Gelu", "gelu", "0.5 * x * (1 + erf(x / sqrt(2)))", (),
               lambda x, a: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))), _emit_gelu, typed_constants=True),
    Activation("GeluTanh", "gelutanh", "0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))", (),
               _np_gelu_tanh, _emit_gelu_tanh, typed_constants=True),
    Activation("HardSigmoid", "hardsigmoid", "max(0, min(1, act_alpha * x + act_beta)) (defaults 0.2, 0.5)",
               ("act_alpha", "act_beta"),
               lambda x, a: _hard_sigmoid(x, _param(a, "act_alpha", 0.2), _param(a, "act_beta", 0.5)),
               _emit_hardsigmoid),
    Activation("QuickGelu", "quickgelu", "x * sigmoid(1.702 x) (CLIP's QuickGELU)", (),
               lambda x, a: x * _sigmoid(f32(QUICK_GELU_ALPHA) * x), _emit_quick_gelu, typed_constants=True),
)
_ALL = tuple(Activation(a.name, a.key, a.doc, a.params, a._numpy, a._emit, a.typed_constants, _XP[a.name])
             for a in _ALL)

#: name (the value of a node's ``activation`` attribute) -> Activation, in a fixed order.
ACTIVATIONS: dict[str, Activation] = {act.name: act for act in _ALL}
#: overload-key token -> Activation.
BY_KEY: dict[str, Activation] = {act.key: act for act in _ALL}


def check_activation(attrs: Mapping[str, Any]) -> str | None:
    """Reason why the activation and its parameters in ``attrs`` are invalid, or ``None``."""
    name = attrs.get("activation", "none")
    act = ACTIVATIONS.get(name)
    if act is None:
        return f"unknown activation {name!r}; expected one of: {', '.join(ACTIVATIONS)}"
    for param in PARAM_NAMES:
        if attrs.get(param) is not None and param not in act.params:
            users = [a.name for a in _ALL if param in a.params]
            return f"attribute {param} is only used by activation {' or '.join(users)}, not {name}"
    lo, hi = attrs.get("clip_min"), attrs.get("clip_max")
    if lo is not None and hi is not None and f32(lo) > f32(hi):
        return f"clip_min={lo} is greater than clip_max={hi}"
    for param in PARAM_NAMES:
        value = attrs.get(param)
        if value is not None and not math.isfinite(float(value)) and not param.startswith("clip_"):
            return f"attribute {param}={value} must be finite"
    return None


def activation_key(attrs: Mapping[str, Any]) -> list[str]:
    """Overload-key tokens for the activation: its key, then ``lo`` / ``hi`` for given clip bounds."""
    act = ACTIVATIONS[attrs.get("activation", "none")]
    tokens = [act.key]
    if act.name == "Clip":
        if attrs.get("clip_min") is not None:
            tokens.append("lo")
        if attrs.get("clip_max") is not None:
            tokens.append("hi")
    return tokens


# The attributes every activation-carrying op declares (CBR, GemmAct): the activation, its
# parameters, and the lowering the tuner records. One table, merged into each op's schema.
ACTIVATION_ATTRIBUTES: dict = {
    "activation": (str, "none"),
    "act_alpha": (float, None),
    "act_beta": (float, None),
    "clip_min": (float, None),
    "clip_max": (float, None),
    **LOWERING_ATTRIBUTES,
}
