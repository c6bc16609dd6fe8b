"""graphopt.CBR: ``Y = act(Conv(X, W, B) + R)`` with optional bias B and residual R.

Conv's attributes (auto_pad, dilations, group, kernel_shape, pads, strides) are copied verbatim
from the fused Conv and passed to the body's Conv by reference, so absent ones keep Conv's
defaults. The NumPy reference is an N-d grouped convolution by im2col + einsum in float64.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from onnx import AttributeProto

from graphopt.errors import RuleError
from graphopt.ops._body import Body, dtype_token
from graphopt.ops._keys import format_key, parse_key
from graphopt.ops.activations import ACTIVATION_ATTRIBUTES, ACTIVATIONS, activation_key, check_activation
from graphopt.ops.schema import DOMAIN, OpSchema

NAME = "CBR"
INPUTS = (("X", False), ("W", False), ("B", True), ("R", True))
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")

# Conv's own attributes: name -> AttributeProto type used for the body's reference.
CONV_ATTRS: dict[str, int] = {
    "auto_pad": AttributeProto.STRING,
    "dilations": AttributeProto.INTS,
    "group": AttributeProto.INT,
    "kernel_shape": AttributeProto.INTS,
    "pads": AttributeProto.INTS,
    "strides": AttributeProto.INTS,
}

ATTRIBUTES: dict[str, tuple[type, Any]] = {
    "auto_pad": (str, "NOTSET"),
    "dilations": (list, None),
    "group": (int, 1),
    "kernel_shape": (list, None),
    "pads": (list, None),
    "strides": (list, None),
    **ACTIVATION_ATTRIBUTES,
}

DOC = ("graphopt.CBR: Y = act(Conv(X, W, B) + R). B ([M]) and R (broadcastable to the conv output) "
       "are optional; Conv attributes are Conv's own; activation is one of: " + ", ".join(ACTIVATIONS) + ".")


def _check(attrs: dict, present: list[bool]) -> str | None:
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad not in AUTO_PADS:
        return f"auto_pad={auto_pad!r} must be one of {', '.join(AUTO_PADS)}"
    if auto_pad != "NOTSET" and attrs.get("pads") is not None:
        return f"pads cannot be given together with auto_pad={auto_pad} (Conv forbids it)"
    if attrs.get("group", 1) < 1:
        return f"group={attrs['group']} must be >= 1"
    ranks = {}
    for name in ("dilations", "kernel_shape", "strides"):
        if attrs.get(name) is not None:
            ranks[name] = len(attrs[name])
            if any(v < 1 for v in attrs[name]):
                return f"{name}={list(attrs[name])} must be all >= 1"
    if attrs.get("pads") is not None:
        pads = list(attrs["pads"])
        if len(pads) % 2 or any(p < 0 for p in pads):
            return f"pads={pads} must have an even length (begins then ends) and no negative values"
        ranks["pads/2"] = len(pads) // 2
    if len(set(ranks.values())) > 1 or 0 in ranks.values():
        return "spatial attributes disagree on the number of spatial dims: " + ", ".join(
            f"{k}={v}" for k, v in sorted(ranks.items()))
    return check_activation(attrs)


def _flags(present: list[bool]) -> list[str]:
    return [flag for flag, i in (("b", 2), ("r", 3)) if i < len(present) and present[i]]


def _needs_dtype(attrs: dict, present: list[bool]) -> bool:
    return ACTIVATIONS[attrs.get("activation", "none")].typed_constants


def _overload(attrs: dict, present: list[bool], dtype: int | None) -> str:
    tok = dtype_token(dtype) if _needs_dtype(attrs, present) else None
    return format_key([], activation_key(attrs), _flags(present), tok)


def _body(overload: str, opset: int):
    parts = parse_key(NAME, overload, 0, ("b", "r"))
    b = Body(opset, parts.dtype)
    conv_inputs = ["X", "W"] + (["B"] if "b" in parts.flags else [])
    y = b.node("Conv", conv_inputs, refs={name: (name, typ) for name, typ in CONV_ATTRS.items()})
    if "r" in parts.flags:
        y = b.node("Add", [y, "R"])
    parts.act.onnx_nodes(b, y, "Y", clip_min=parts.clip_min, clip_max=parts.clip_max)
    return b.function(NAME, overload, [n for n, _ in INPUTS], ["Y"], sorted(ATTRIBUTES),
                      f"{DOC} Variant {overload!r}, opset {opset}.", DOMAIN)


# -- NumPy reference -----------------------------------------------------------------------------

def conv_pads(in_shape: tuple[int, ...], kernel: tuple[int, ...], strides: list[int], dilations: list[int],
              auto_pad: str, pads: list[int] | None) -> list[int]:
    """Explicit [begins..., ends...] pads for Conv's auto_pad rules (ONNX operator spec)."""
    r = len(in_shape)
    if auto_pad == "VALID":
        return [0] * (2 * r)
    if auto_pad == "NOTSET":
        return list(pads) if pads is not None else [0] * (2 * r)
    begins, ends = [], []
    for size, k, s, d in zip(in_shape, kernel, strides, dilations):
        out = -(-size // s)  # ceil(size / stride)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)  # odd extra: end for UPPER, begin for LOWER
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def conv_output(in_spatial, kernel, strides=None, dilations=None, auto_pad: str = "NOTSET", pads=None,
                ceil_mode: bool = False) -> tuple[list[int], list[int]]:
    """``(pads, out)``: Conv's (and pooling's) explicit [begins..., ends...] pads and output spatial sizes.

    The one home of a convolution's geometry: the reference, the kernels' ``conv_geom``, the
    heuristic and the runtime's Conv / pooling ops all call it. ``ceil_mode`` is pooling's: the last
    window must still start inside the input or the left padding (the ONNX / onnxruntime rule).
    """
    nd = len(kernel)
    strides = list(strides) if strides is not None else [1] * nd
    dilations = list(dilations) if dilations is not None else [1] * nd
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    full = conv_pads(tuple(in_spatial), tuple(kernel), strides, dilations, auto_pad or "NOTSET", pads)
    out = []
    for i in range(nd):
        span = in_spatial[i] + full[i] + full[i + nd] - (kernel[i] - 1) * dilations[i] - 1
        o = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= in_spatial[i] + full[i]:
            o -= 1
        out.append(o)
    return full, out


def conv_nd(x: np.ndarray, w: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    """ONNX Conv (no bias) for any number of spatial dims, in float64, by im2col + einsum.

    Hand-written because NumPy has no grouped N-d convolution and the ground truth must not be
    one of the ONNX implementations it checks; tests cross-check it with onnx.reference's Conv
    and with a naive loop.
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    r = x.ndim - 2
    group = int(attrs.get("group", 1))
    if r < 1 or w.ndim != x.ndim:
        raise RuleError(f"graphopt.CBR reference: X has shape {x.shape} and W {w.shape}; "
                        "both need the same rank >= 3 (N, C, spatial...)")
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    kernel = tuple(w.shape[2:])
    if c != cg * group or m % group:
        raise RuleError(f"graphopt.CBR reference: X has {c} channels and W shape {w.shape} with group={group}; "
                        "need C == W.shape[1] * group and W.shape[0] divisible by group")
    if attrs.get("kernel_shape") is not None and tuple(attrs["kernel_shape"]) != kernel:
        raise RuleError(f"graphopt.CBR reference: kernel_shape={list(attrs['kernel_shape'])} "
                        f"disagrees with W's spatial shape {list(kernel)}")
    strides = list(attrs.get("strides") or [1] * r)
    dilations = list(attrs.get("dilations") or [1] * r)
    pads = conv_pads(x.shape[2:], kernel, strides, dilations, attrs.get("auto_pad", "NOTSET"), attrs.get("pads"))
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + r]) for i in range(r)])
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if any(xp.shape[2 + i] < extent[i] for i in range(r)):
        raise RuleError(f"graphopt.CBR reference: padded input {xp.shape[2:]} is smaller than the "
                        f"dilated kernel {extent}")
    # (N, C, *positions, *window) -> keep every stride-th position and every dilation-th tap.
    win = sliding_window_view(xp, extent, axis=tuple(range(2, 2 + r)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
              + tuple(slice(None, None, d) for d in dilations)]
    out_spatial = win.shape[2:2 + r]
    patches = win.reshape((n, group, cg) + out_spatial + kernel)
    wg = w.reshape((group, m // group, cg) + kernel)
    o, k = "opqrstuv"[:r], "ijklabde"[:r]
    y = np.einsum(f"ngc{o}{k},gmc{k}->ngm{o}", patches, wg, optimize=True)
    return y.reshape((n, m) + out_spatial)


def _reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    x, w, bias, residual = inputs
    y = conv_nd(x, w, attrs)
    if bias is not None:
        bias = np.asarray(bias, dtype=np.float64)
        if bias.shape != (w.shape[0],):
            raise RuleError(f"graphopt.CBR reference: B has shape {bias.shape}, expected ({w.shape[0]},)")
        y = y + bias.reshape((1, -1) + (1,) * (y.ndim - 2))
    if residual is not None:
        shape = y.shape
        y = y + np.asarray(residual, dtype=np.float64)
        if y.shape != shape:
            raise RuleError(f"graphopt.CBR reference: R with shape {np.shape(residual)} must broadcast "
                            f"to the conv output {shape} without growing it")
    y = ACTIVATIONS[attrs.get("activation", "none")].numpy(y, attrs)
    return [y.astype(np.asarray(x).dtype)]


def _output_shapes(shapes: list, attrs: dict) -> list:
    """(N, M, spatial out...) from X, W and Conv's attributes (``conv_output``)."""
    x, w = shapes[0], shapes[1]
    _, out = conv_output(x[2:], w[2:], attrs.get("strides"), attrs.get("dilations"), attrs.get("auto_pad", "NOTSET"),
                         attrs.get("pads"))
    return [(x[0], w[0]) + tuple(out)]


def _check_input(i: int, shape: tuple, dtype: str, attrs, rng) -> np.ndarray | None:
    """W scaled by 1/sqrt(fan-in = C/group * kh * kw), so the check's outputs stay O(1)."""
    if i != 1:
        return None
    return (rng.standard_normal(shape) / np.sqrt(max(1, int(np.prod(shape[1:]))))).astype(dtype)


SCHEMA = OpSchema(name=NAME, inputs=INPUTS, attributes=ATTRIBUTES, doc=DOC, _check=_check,
                  _overload=_overload, _needs_dtype=_needs_dtype, _body=_body, _reference=_reference, _output_shapes=_output_shapes,
                  _check_input=_check_input)
