"""CBR's ``stem`` family: a convolution with few input channels (C <= 4, groups 1, no residual), an
image stem, on the CUDA cores (``stem_conv.cu``): X read in NCHW, Y written NHWC (``y=nhwc``, 16-byte
stores) or NCHW (``y=nchw``), a thread per ``mv`` output channels of one pixel, every weight in shared
memory. A stem's reduction (C*KH*KW = 27 for a 3x3 RGB stem) is too short for a tensor-core tile:
MobileNetV2's stem at bs32 took 88 us on the H200 through implicit GEMM, and cuDNN offered a single
550 us plan for its Clip form (bench/NOTES_e2e.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.kernels.cbr_common import applied, check_common, check_operands
from graphopt.kernels.mma_args import ptr
from graphopt.kernels.source import SHARED_DEFAULT_BYTES, get_kernel, instance, source_hash
from graphopt.lowering.contract import Candidate, Lowering, Signature

SOURCE = "stem_conv.cu"
MAX_CHANNELS = 4  # input channels (RGB, RGBA)
CHANNELS_PER_THREAD = (8, 16, 32)  # the ``mv`` parameter: output channels a thread accumulates
# the ``px`` parameter: adjacent pixels a thread computes, each shared-memory weight load used px
# times (stem_conv.cu's PX); px = 1 (no parameter) for every ``mv``, more where the registers allow
PIXELS_PER_THREAD = {8: (1, 4), 16: (1, 4), 32: (1, 2)}
Y_LAYOUTS = ("nhwc", "nchw")
SHARED_LIMIT = SHARED_DEFAULT_BYTES  # the staged fp32 weights and bias
UNROLLED = (3, 7)  # square windows with their own instance, taps unrolled (the 3x3 and 7x7 stems); others at run time
THREADS = 256
MAX_BLOCKS = 8192  # many waves (3-5 blocks an SM are resident), so the last one's raggedness costs little; then grid-stride


def stem_reason(sig: Signature, mv: int = CHANNELS_PER_THREAD[0]) -> str | None:
    """Why the ``stem`` family (``mv`` channels a thread) does not take ``sig`` (None: it does)."""
    reason = check_common(sig)
    if reason:
        return reason
    g = geo.conv_geom(sig)
    if g.G != 1:
        return f"a grouped convolution (groups {g.G})"
    if g.C > MAX_CHANNELS:
        return f"{g.C} input channels (the stem kernel takes at most {MAX_CHANNELS})"
    if len(sig.input_shapes) > 3 and sig.input_shapes[3] is not None:
        return "a residual input (the stem kernel fuses none)"
    if g.M % mv:
        return f"{g.M} output channels are not a multiple of {mv} (channels a thread)"
    if shared_bytes(g) > SHARED_LIMIT:
        return f"{g.M} x {g.C * g.KH * g.KW} weights exceed {SHARED_LIMIT // 1024} KiB of shared memory as fp32"
    return None


def shared_bytes(g) -> int:
    return 4 * (g.C * g.KH * g.KW * g.M + g.M)


def window(g) -> int:
    """The kernel instance's compile-time window: KH when the window is square and in ``UNROLLED``, else 0."""
    return g.KH if g.KH == g.KW and g.KH in UNROLLED else 0


def instances(dt: str, mvs: Sequence[int] = CHANNELS_PER_THREAD, windows: Sequence[int] = UNROLLED + (0,),
              pxs: Sequence[int] | None = None) -> list[tuple[str, str]]:
    """``stem_conv<T, MV, KS, PX>`` for each ``mv``, window and pixel count (default: every ``px`` of that ``mv``)."""
    return [(SOURCE, instance("stem_conv", dt, mv, ks, px)) for mv in mvs for ks in windows
            for px in (pxs if pxs is not None else PIXELS_PER_THREAD[mv])]


@dataclass(frozen=True)
class StemConv(Candidate):
    """params: ``mv`` (output channels a thread), ``px`` (adjacent pixels a thread; absent: 1),
    ``y`` (``nhwc`` or ``nchw``, the layout of Y)."""
    ordinary_launch = True  # its launch is one own kernel (Candidate.ordinary_launch)

    def _mv(self) -> int:
        return int(self.param("mv", CHANNELS_PER_THREAD[0]))

    def _px(self) -> int:
        return int(self.param("px", 1))

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        return stem_reason(sig, self._mv())

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        y = self.param("y", "nhwc").upper()
        return ("NCHW", "NCHW", y, y, y)  # X (the graph input's layout), W (OIHW); B and R slots carry Y's

    def source_hash(self) -> str:
        return source_hash(SOURCE)

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        return instances(geo.dtype_of(sig), (self._mv(),), (window(geo.conv_geom(sig)),), (self._px(),))

    def build(self, sig: Signature, arch: str) -> Lowering:
        g, dt = applied(self, sig)
        mv, px, y_layout = self._mv(), self._px(), self.param("y", "nhwc").upper()
        kern = get_kernel(*instances(dt, (mv,), (window(g),), (px,))[0])
        act = geo.act_args(sig)
        i32, f32 = np.int32, np.float32
        geom = tuple(i32(v) for v in (g.N, g.C, g.H, g.W, g.M, g.OH, g.OW, g.KH, g.KW, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw))
        tail = (i32(y_layout == "NHWC"), i32(act.code), f32(act.alpha), f32(act.beta), f32(act.lo), f32(act.hi))
        threads = g.N * g.OH * -(-g.OW // px) * (g.M // mv)  # a thread per (pixel slot, channel group)
        layouts = self.layouts(sig)

        def launch(inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any = None) -> None:
            X, Wt, B = (list(inputs) + [None, None])[:3]
            y = outputs[0]
            check_operands("stem", g, dt, X, Wt, B, y, "NCHW", y_layout)
            if y_layout == "NHWC" and y.data.ptr % 16:
                raise TuningError("stem: an NHWC Y must start on a 16-byte boundary (its vector stores)")
            if threads == 0:
                return  # an empty batch: nothing to write (a grid of no blocks is a launch error)
            blocks = min(MAX_BLOCKS, -(-threads // THREADS))
            kern((blocks,), (THREADS,), (X, Wt, ptr(B), y) + geom + tail, shared_mem=shared_bytes(g))

        return Lowering(launch=launch, layouts=layouts, capturable=True)


def stem_candidates() -> list[StemConv]:
    return [StemConv("stem", (("mv", mv),) + ((("px", px),) if px > 1 else ()) + (("y", y),))
            for mv in CHANNELS_PER_THREAD for px in PIXELS_PER_THREAD[mv] for y in Y_LAYOUTS]


__all__ = ["StemConv", "stem_candidates", "stem_reason"]
