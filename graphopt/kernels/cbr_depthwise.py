"""CBR's ``depthwise_nhwc`` family: a depthwise convolution (groups == C == M) read and written in NHWC
(``depthwise_nhwc.cu``), bias and activation fused, no residual. It lets a MobileNet or EfficientNet
block stay NHWC through its depthwise layer: the NCHW ``direct_k3`` made the layout choice alternate
(33 conversions in MobileNetV2 at bs32 on the H100) and cuDNN's NHWC depthwise plans were up to 11x
slower than ``direct_k3`` there (bench/NOTES_e2e.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.kernels.cbr_common import applied, check_common
from graphopt.kernels.mma_args import ptr
from graphopt.kernels.source import VEC16, get_kernel, instance, source_hash
from graphopt.lowering.contract import Candidate, Lowering, Signature
from graphopt.lowering.layout import is_layout

SOURCE = "depthwise_nhwc.cu"
# X, W ([C, 1, KH, KW] as ONNX stores it), B, R (never given), Y; the optional B and R slots carry Y's
# layout, so a node without them reads NHWC for Y too (see Lowering.layouts)
LAYOUTS = ("NHWC", "NCHW", "NHWC", "NHWC", "NHWC")
THREADS = 256
MAX_BLOCKS = 1 << 20  # the kernel strides over the rest (grid-stride loop)


def depthwise_reason(sig: Signature) -> str | None:
    """Why ``depthwise_nhwc`` does not take ``sig`` (None: it does)."""
    reason = check_common(sig)
    if reason:
        return reason
    g = geo.conv_geom(sig)
    if not (g.G == g.C == g.M):
        return f"not a depthwise convolution (groups {g.G}, channels {g.C}, outputs {g.M})"
    if len(sig.input_shapes) > 3 and sig.input_shapes[3] is not None:
        return "a residual input (depthwise_nhwc fuses none)"
    return None


def instances(dt: str) -> list[tuple[str, str]]:
    """The kernel instances of one dtype: channel vectors of 16 bytes, and one channel per thread."""
    return [(SOURCE, instance("depthwise_nhwc", dt, v)) for v in (VEC16[dt], 1)]


@dataclass(frozen=True)
class DepthwiseNhwcConv(Candidate):
    """A depthwise convolution in NHWC: one thread per 16 bytes of channels of one output pixel."""

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        return depthwise_reason(sig)

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        return LAYOUTS

    def source_hash(self) -> str:
        return source_hash(SOURCE)

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        return instances(geo.dtype_of(sig))

    def build(self, sig: Signature, arch: str) -> Lowering:
        g, dt = applied(self, sig)
        vec = VEC16[dt]
        wide, narrow = (get_kernel(src, expr) for src, expr in instances(dt))
        act = geo.act_args(sig)
        i32, f32 = np.int32, np.float32
        geom = tuple(i32(v) for v in (g.N, g.C, g.H, g.W, g.OH, g.OW, g.KH, g.KW, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw))
        tail = (i32(act.code), f32(act.alpha), f32(act.beta), f32(act.lo), f32(act.hi))
        pixels = g.N * g.OH * g.OW

        def launch(inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any = None) -> None:
            X, Wt, B = (list(inputs) + [None, None])[:3]
            y = outputs[0]
            for name, a, shape in (("X", X, (g.N, g.C) + ((g.W,) if g.one_d else (g.H, g.W))), ("Y", y, g.out_shape)):
                if tuple(a.shape) != shape or str(a.dtype) != dt or not is_layout(a, "NHWC"):
                    raise TuningError(f"depthwise_nhwc: {name} must be an NHWC {dt} array of shape {shape}, "
                                      f"got {a.dtype} {tuple(a.shape)} strides {a.strides}")
            w_shape = (g.M, 1) + ((g.KW,) if g.one_d else (g.KH, g.KW))
            if tuple(Wt.shape) != w_shape or str(Wt.dtype) != dt or not Wt.flags.c_contiguous:
                raise TuningError(f"depthwise_nhwc: W must be a C-contiguous {dt} array of shape {w_shape}, "
                                  f"got {Wt.dtype} {tuple(Wt.shape)}")
            if B is not None and (tuple(B.shape) != (g.M,) or str(B.dtype) != dt or not B.flags.c_contiguous):
                raise TuningError(f"depthwise_nhwc: B must be a contiguous {dt} array of shape ({g.M},), "
                                  f"got {B.dtype} {tuple(B.shape)}")
            if pixels == 0:
                return  # an empty batch: nothing to write (a grid of no blocks is a launch error)
            wide_ok = g.C % vec == 0 and X.data.ptr % 16 == 0 and y.data.ptr % 16 == 0
            kern, v = (wide, vec) if wide_ok else (narrow, 1)
            blocks = min(MAX_BLOCKS, -(-(pixels * (g.C // v)) // THREADS))
            kern((blocks,), (THREADS,), (X, Wt, ptr(B), y) + geom + tail)

        return Lowering(launch=launch, layouts=LAYOUTS, capturable=True)


__all__ = ["DepthwiseNhwcConv", "depthwise_reason"]
