"""Shape arithmetic shared by the CBR and GemmAct lowerings (pure Python, no GPU).

It resolves a signature into the integers the kernels take: convolution geometry (ONNX ``auto_pad``,
asymmetric pads, strides, dilations, groups, 1-D convs as 2-D with H = 1), broadcast strides for
bias / residual operands, and activation parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from graphopt.errors import TuningError
from graphopt.ops.cbr import conv_output
from graphopt.lowering.contract import Signature
from graphopt.kernels.source import ACT_CODES

INT32_MAX = 2**31 - 1
# A dense 2-D convolution with fewer input channels than this is a network's stem (an image's 1-4
# channels): cuDNN's stem forms (channel padding to this many, the split form) and its plan notes key on it.
STEM_CHANNELS = 8


@dataclass(frozen=True)
class ConvGeom:
    """A 2-D convolution in kernel terms (a 1-D conv has H = OH = KH = 1)."""

    N: int
    C: int
    H: int
    W: int
    M: int
    KH: int
    KW: int
    sh: int
    sw: int
    ph: int  # begin pads; the end pads (eh, ew) only change OH / OW for graphopt's kernels
    pw: int
    dh: int
    dw: int
    G: int
    OH: int
    OW: int
    one_d: bool
    eh: int = 0  # end pads as the model declares them (auto_pad resolved): a library that takes padding
    ew: int = 0  # gets the model's own, as torch passes its symmetric pads (cuDNN's first-layer engines
    #              refuse the trimmed end pad: bench/NOTES_kernels.md, fifteenth session)

    @property
    def out_shape(self) -> tuple[int, ...]:
        if self.one_d:
            return (self.N, self.M, self.OW)
        return (self.N, self.M, self.OH, self.OW)

    @property
    def flops(self) -> int:
        return 2 * self.N * self.M * self.OH * self.OW * (self.C // self.G) * self.KH * self.KW


def is_stem(g: ConvGeom) -> bool:
    """Whether ``g`` is a network's stem: dense (group 1), 2-D, fewer than ``STEM_CHANNELS`` input channels."""
    return g.G == 1 and not g.one_d and g.C < STEM_CHANNELS


def _pair(v, default, n, what, sig) -> list[int]:
    if v is None:
        return [default] * n
    v = [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
    if len(v) != n:
        raise TuningError(f"CBR {what}={v} does not match a {n}-D convolution ({sig.key()})")
    return v


_GEOMS: dict[str, ConvGeom] = {}  # signature key -> its geometry (ConvGeom is frozen; bounded below)


def conv_geom(sig: Signature) -> ConvGeom:
    """Resolve a CBR signature (inputs X, W, B?, R?) into a :class:`ConvGeom`. Resolved once per
    signature and process: every CBR candidate's ``applies`` asks (2,500 times for a warm ResNet-50's
    25 signatures); a signature that does not resolve raises every time."""
    key = sig.key()
    g = _GEOMS.get(key)
    if g is None:
        if len(_GEOMS) >= 4096:
            _GEOMS.clear()
        g = _GEOMS[key] = _resolve_conv(sig)
    return g


def _resolve_conv(sig: Signature) -> ConvGeom:
    xs, ws = sig.input_shapes[0], sig.input_shapes[1]
    if xs is None or ws is None or len(xs) not in (3, 4) or len(ws) != len(xs):
        raise TuningError(f"CBR needs X and W of rank 3 or 4 with equal rank, got {xs} and {ws}")
    nd = len(xs) - 2
    one_d = nd == 1
    G = int(sig.attr("group", 1))
    ks = _pair(sig.attr("kernel_shape"), None, nd, "kernel_shape", sig) if sig.attr("kernel_shape") is not None else list(ws[2:])
    if list(ks) != list(ws[2:]):
        raise TuningError(f"CBR kernel_shape={ks} disagrees with W shape {ws}")
    st = _pair(sig.attr("strides"), 1, nd, "strides", sig)
    dl = _pair(sig.attr("dilations"), 1, nd, "dilations", sig)
    spatial = list(xs[2:])
    auto_pad = sig.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad not in ("NOTSET", "", None, "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise TuningError(f"CBR auto_pad={auto_pad!r} is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    pads = _pair(sig.attr("pads"), 0, 2 * nd, "pads", sig) if (auto_pad or "NOTSET") == "NOTSET" else None
    full, out = conv_output(spatial, ks, st, dl, auto_pad or "NOTSET", pads)
    begin, end = full[:nd], full[nd:]
    N, C = xs[0], xs[1]
    M = ws[0]
    if G < 1 or C % G or M % G or ws[1] != C // G:
        raise TuningError(f"CBR group={G} does not fit X channels {C} and W shape {ws}")
    if any(o < 1 for o in out):
        raise TuningError(f"CBR output would be empty: spatial {spatial}, kernel {ks}, strides {st}")
    if one_d:
        g = ConvGeom(N, C, 1, spatial[0], M, 1, ks[0], 1, st[0], 0, begin[0], 1, dl[0], G, 1, out[0], True, 0, end[0])
    else:
        g = ConvGeom(N, C, spatial[0], spatial[1], M, ks[0], ks[1], st[0], st[1], begin[0], begin[1],
                     dl[0], dl[1], G, out[0], out[1], False, end[0], end[1])
    if max(N * C * g.H * g.W, N * M * g.OH * g.OW) > INT32_MAX:
        raise TuningError(f"CBR tensors over 2**31 elements are not supported by the kernels ({sig.key()})")
    return g


def broadcast_strides(shape: Sequence[int] | None, target: Sequence[int]) -> list[int] | None:
    """Element strides that read a C-contiguous tensor of ``shape`` broadcast to ``target``.

    A broadcast dimension gets stride 0. ``None`` when ``shape`` does not broadcast to ``target``.
    """
    if shape is None:
        return None
    shape = list(shape)
    if len(shape) > len(target):
        if any(d != 1 for d in shape[: len(shape) - len(target)]):
            return None
        shape = shape[len(shape) - len(target):]
    shape = [1] * (len(target) - len(shape)) + shape
    strides, acc = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == target[i]:
            strides[i] = acc if target[i] != 1 else 0
        elif shape[i] == 1:
            strides[i] = 0
        else:
            return None
        acc *= shape[i]
    return strides


def residual_shape_4d(rshape: Sequence[int], g: ConvGeom) -> tuple[int, ...]:
    """The residual's shape aligned to the 4-D (N, M, OH, OW) view (a 1-D conv gains OH = 1)."""
    r = tuple(int(d) for d in rshape)
    if g.one_d:
        r = (1,) * (3 - len(r)) + r if len(r) <= 3 else r
        return r[:-1] + (1,) + r[-1:]
    return (1,) * (4 - len(r)) + r if len(r) <= 4 else r


def residual_strides(rshape: Sequence[int] | None, g: ConvGeom) -> tuple[int, int, int] | None:
    """(n, m, pixel) strides of the residual, or None when it needs materialising first.

    The kernels flatten (oh, ow) into one pixel index, so the residual must be either full or
    broadcast over both spatial dims together.
    """
    st = broadcast_strides(residual_shape_4d(rshape, g), (g.N, g.M, g.OH, g.OW))
    if st is None:
        raise TuningError(f"CBR residual shape {tuple(rshape)} does not broadcast to the output {g.out_shape}")
    rn, rm, rh, rw = st
    if g.OH == 1:
        return rn, rm, rw
    if g.OW == 1:
        return rn, rm, rh
    if rh == rw * g.OW and rw != 0:
        return rn, rm, rw
    if rh == 0 and rw == 0:
        return rn, rm, 0
    return None


@dataclass(frozen=True)
class ActArgs:
    code: int
    alpha: float
    beta: float
    lo: float
    hi: float

    def as_tuple(self):
        return (self.code, self.alpha, self.beta, self.lo, self.hi)


def act_args(sig: Signature) -> ActArgs:
    """The activation code and its float parameters (defaults as in the ops contract)."""
    name = sig.attr("activation", "none")
    if isinstance(name, bytes):
        name = name.decode()
    if name not in ACT_CODES:
        raise TuningError(f"{sig.op} activation {name!r} has no kernel; known: {', '.join(ACT_CODES)}")
    default_alpha = 0.01 if name == "LeakyRelu" else 0.2
    alpha = float(sig.attr("act_alpha", default_alpha))
    beta = float(sig.attr("act_beta", 0.5))
    lo = sig.attr("clip_min")
    hi = sig.attr("clip_max")
    return ActArgs(ACT_CODES[name], alpha, beta, -math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))


def plan_or_reason(sig: Signature, plan_of, dtypes: Sequence[str]) -> tuple[Any, str | None]:
    """``(plan_of(sig), None)`` when graphopt's own kernels can take ``sig``, else ``(None, why not)``:
    ``plan_of`` (the op's geometry) raises, the dtypes are mixed or outside ``dtypes``, or the
    activation has no kernel code."""
    try:
        plan = plan_of(sig)
        dt = dtype_of(sig)
        act_args(sig)
    except TuningError as exc:
        return None, str(exc)
    if dt not in dtypes:
        return None, f"dtype {dt} (supported: {', '.join(dtypes)})"
    return plan, None


def dtype_of(sig: Signature) -> str:
    dts = [d for d, s in zip(sig.dtypes, sig.input_shapes) if s is not None] or list(sig.dtypes)
    if len(set(dts)) != 1:
        raise TuningError(f"{sig.op} mixes dtypes {sig.dtypes}; the kernels need one dtype")
    return dts[0]
