"""CBR's ``depthwise_nhwc`` family: a depthwise convolution (groups == C == M) read and written in NHWC
(``depthwise_nhwc.cu``), bias and activation fused, no residual. It lets a MobileNet or EfficientNet
block stay NHWC through its depthwise layer: the NCHW ``direct_k3`` made the layout choice alternate
(33 conversions in MobileNetV2 at bs32 on the H100) and cuDNN's NHWC depthwise plans were up to 11x
slower than ``direct_k3`` there (bench/NOTES_e2e.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from graphopt.kernels import geometry as geo
from graphopt.kernels.cbr_common import applied, check_common, check_operands
from graphopt.kernels.divisor import fast_divisor
from graphopt.kernels.mma_args import ptr
from graphopt.kernels.source import SHARED_DEFAULT_BYTES, VEC16, get_kernel, instance, source_hash
from graphopt.lowering.contract import Candidate, Lowering, Signature

SOURCE = "depthwise_nhwc.cu"
# X, W ([C, 1, KH, KW] as ONNX stores it), B, R (never given), Y; the optional B and R slots carry Y's
# layout, so a node without them reads NHWC for Y too (see Lowering.layouts)
LAYOUTS = ("NHWC", "NCHW", "NHWC", "NHWC", "NHWC")
THREADS = 256
TILE_VECS = 32  # channel vectors a block owns at most (256 channels of fp16): a warp reads 512 bytes of a pixel
MAX_BLOCKS = 4096  # along the pixels (about 4 waves of 8 blocks an SM on an H200); the kernel strides over the rest
SHARED_LIMIT = SHARED_DEFAULT_BYTES  # a block's weight tile in shared memory
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y, which counts channel tiles
UNROLLED = ((3, 3), (5, 5))  # windows with their own kernel instance, the taps unrolled; others: KH, KW at run time
ROW_GROUPS = (4,)  # ``rows``: vertically adjacent outputs a thread computes (unrolled windows, vertical stride 1)
TILES = ((8, 8), (16, 16))  # ``tile=HxW``: the spatially tiled form's output tiles (``depthwise_nhwc_tiled``)
TILED_VECS = 8  # channel vectors a tiled block owns at most (64 channels of fp16): 32 or more threads per channel vector


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
    if g.KH * g.KW * 8 * 4 > SHARED_LIMIT:  # the widest channel vector (8 fp16) as fp32
        return f"a {g.KH}x{g.KW} window: one channel vector's weights exceed {SHARED_LIMIT // 1024} KiB of shared memory"
    worst_tiles = -(-g.C // tile(g, 1)[0])  # one channel a thread: the most channel tiles
    if worst_tiles > MAX_GRID_Y:
        return f"{g.C} channels: {worst_tiles} channel tiles exceed the grid's {MAX_GRID_Y} rows"
    return None


def window(g) -> tuple[int, int]:
    """The (KH, KW) template arguments of ``g``'s instance: its window where one is unrolled, else (0, 0)."""
    return (g.KH, g.KW) if (g.KH, g.KW) in UNROLLED else (0, 0)


def instances(dt: str, windows=None, rows: int | None = None, tiled: bool = False) -> list[tuple[str, str]]:
    """Kernel instances of one dtype: per window and row group (or of the tiled form), channel vectors of
    16 bytes and one channel a thread. Default: every instance any signature can take."""
    if windows is None:
        combos = [(kh, kw, 1) for kh, kw in UNROLLED + ((0, 0),)] + [(kh, kw, r) for kh, kw in UNROLLED for r in ROW_GROUPS]
        return ([(SOURCE, instance("depthwise_nhwc", dt, v, kh, kw, r)) for kh, kw, r in combos for v in (VEC16[dt], 1)]
                + instances(dt, UNROLLED + ((0, 0),), tiled=True))
    if tiled:
        return [(SOURCE, instance("depthwise_nhwc_tiled", dt, v, kh, kw)) for kh, kw in windows for v in (VEC16[dt], 1)]
    combos = [(kh, kw, rows or 1) for kh, kw in windows]
    return [(SOURCE, instance("depthwise_nhwc", dt, v, kh, kw, r)) for kh, kw, r in combos for v in (VEC16[dt], 1)]


def tile(g, vec: int) -> tuple[int, int]:
    """(channel vectors a block owns, shared-memory bytes of its weights, fp32) for ``g`` at ``vec`` channels a thread."""
    tcv = max(1, min(g.C // vec, TILE_VECS, SHARED_LIMIT // (g.KH * g.KW * vec * 4)))
    return tcv, g.KH * g.KW * tcv * vec * 4


def tiled_tile(g, vec: int, th: int, tw: int, esz: int) -> tuple[int, int] | None:
    """(channel vectors a tiled block owns, its shared-memory bytes: the fp32 weight tile, then the input
    window of its ``th`` x ``tw`` output tile in ``esz``-byte elements) at ``vec`` channels a thread: at
    most ``TILED_VECS`` and what fits ``SHARED_LIMIT``, spread evenly over the channel tiles (144 fp16
    channels: three tiles of 6 vectors, not 8, 8 and 2); None when not even one fits."""
    ih = (th - 1) * g.sh + (g.KH - 1) * g.dh + 1
    iw = (tw - 1) * g.sw + (g.KW - 1) * g.dw + 1

    def nbytes(tcv: int) -> int:
        return g.KH * g.KW * tcv * vec * 4 + ih * iw * tcv * vec * esz

    cv = max(1, g.C // vec)
    for most in range(min(cv, TILED_VECS), 0, -1):
        if nbytes(most) <= SHARED_LIMIT:
            tcv = -(-cv // -(-cv // most))  # the same number of tiles, as even as they go
            return tcv, nbytes(tcv)
    return None


@dataclass(frozen=True)
class DepthwiseNhwcConv(Candidate):
    """A depthwise convolution in NHWC: a block per tile of channels (its weights in shared memory), a
    thread per 16 bytes of channels of one output pixel at a time, or of ``rows`` vertically adjacent
    ones (params ``rows``; none: 1); or, with ``tile=HxW``, a block per H x W tile of output pixels and
    tile of channels, its input window staged in shared memory (``depthwise_nhwc_tiled``)."""
    ordinary_launch = True  # its launch is one own kernel (Candidate.ordinary_launch)

    def _rows(self) -> int:
        return int(self.param("rows", 1))

    def _tile(self, g=None) -> tuple[int, int] | None:
        """The output tile (``tile=HxW``), cut to the output's own size where ``g`` is given (a 7x7 output
        stages a 9x9 window, not 18x18); None: the per-pixel form."""
        t = self.param("tile")
        if t is None:
            return None
        th, tw = (int(v) for v in str(t).split("x"))
        return (th, tw) if g is None else (max(1, min(th, g.OH)), max(1, min(tw, g.OW)))

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        reason = depthwise_reason(sig)
        if reason:
            return reason
        if self._tile() is not None:
            g = geo.conv_geom(sig)
            th, tw = self._tile(g)
            narrow = tiled_tile(g, 1, th, tw, np.dtype(geo.dtype_of(sig)).itemsize)  # the most channel tiles
            if narrow is None:
                return f"a {th}x{tw} tile's input window does not fit {SHARED_LIMIT // 1024} KiB of shared memory"
            if -(-g.C // narrow[0]) > MAX_GRID_Y:
                return f"{g.C} channels: more channel tiles than the grid's {MAX_GRID_Y} rows"
            return None
        if self._rows() == 1:
            return None
        g = geo.conv_geom(sig)
        if window(g) == (0, 0):
            return f"a {g.KH}x{g.KW} window (row groups need an unrolled one: {', '.join(f'{a}x{b}' for a, b in UNROLLED)})"
        if g.sh != 1 or g.dh != 1:
            return f"vertical stride {g.sh} / dilation {g.dh} (row groups share input rows only at 1 / 1)"
        return None

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        return LAYOUTS

    def source_hash(self) -> str:
        return source_hash(SOURCE)

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        return instances(geo.dtype_of(sig), (window(geo.conv_geom(sig)),), self._rows(), tiled=self._tile() is not None)

    def build(self, sig: Signature, arch: str) -> Lowering:
        g, dt = applied(self, sig)
        vec = VEC16[dt]
        rows = self._rows()
        wide, narrow = (get_kernel(src, expr) for src, expr in self.kernels(sig))
        act = geo.act_args(sig)
        i32, f32 = np.int32, np.float32
        geom = tuple(i32(v) for v in (g.N, g.C, g.H, g.W, g.OH, g.OW, g.KH, g.KW, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw))
        tail = (i32(act.code), f32(act.alpha), f32(act.beta), f32(act.lo), f32(act.hi))
        pixels = g.N * g.OH * g.OW
        groups = g.N * -(-g.OH // rows) * g.OW  # what the kernel's threads walk: rows output rows each
        divisors = ()  # the per-pixel form splits a pixel index by OW and by its row groups (fast_div)
        if pixels:
            (ow_mul, ow_shr), (ohg_mul, ohg_shr) = fast_divisor(g.OW), fast_divisor(-(-g.OH // rows))
            divisors = (np.uint32(ow_mul), i32(ow_shr), np.uint32(ohg_mul), i32(ohg_shr))
        tiled = None  # the tiled form: (channel vectors, shared bytes) per vector width (None: does not fit)
        if self._tile() is not None:
            th, tw = self._tile(g)
            tiled = {v: tiled_tile(g, v, th, tw, np.dtype(dt).itemsize) for v in (vec, 1)}

        def launch(inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any = None) -> None:
            X, Wt, B = (list(inputs) + [None, None])[:3]
            y = outputs[0]
            check_operands("depthwise_nhwc", g, dt, X, Wt, B, y, "NHWC", "NHWC")
            if pixels == 0:
                return  # an empty batch: nothing to write (a grid of no blocks is a launch error)
            wide_ok = g.C % vec == 0 and all(a.data.ptr % 16 == 0 for a in (X, Wt, y))  # W: the tile staging's vector loads
            wide_ok = wide_ok and (tiled is None or tiled[vec] is not None)
            kern, v = (wide, vec) if wide_ok else (narrow, 1)
            if tiled is not None:
                tcv, smem = tiled[v]
                grid = (g.N * -(-g.OH // th) * -(-g.OW // tw), -(-(g.C // v) // tcv))
                kern(grid, (THREADS,), (X, Wt, ptr(B), y) + geom + (i32(tcv), i32(th), i32(tw)) + tail, shared_mem=smem)
                return
            tcv, smem = tile(g, v)
            grid = (min(MAX_BLOCKS, -(-groups // (THREADS // tcv))), -(-(g.C // v) // tcv))
            kern(grid, (THREADS,), (X, Wt, ptr(B), y) + geom + (i32(tcv),) + divisors + tail, shared_mem=smem)

        return Lowering(launch=launch, layouts=LAYOUTS, capturable=True)


__all__ = ["DepthwiseNhwcConv", "TILES", "depthwise_reason", "tiled_tile"]
