"""CBR's tensor-core families: ``implicit_gemm`` (NCHW gathered through a k table),
``implicit_gemm_nhwc`` (an NHWC copy of X) and ``pointwise_gemm`` (1x1 convs as a batched GEMM),
all one ``mma_gemm`` launch with the epilogue fused (:class:`_MmaConv`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.kernels.cbr_common import applied, check_common, check_out, is_pointwise, prepare_residual, res_plan
from graphopt.kernels.mma_args import mma_args
from graphopt.kernels.mma_tiles import BK, VEC, TiledMmaParams, mma_smem_bytes
from graphopt.kernels.source import get_kernel, instance, source_hash
from graphopt.lowering.contract import Candidate, Signature


def _mma_conv_dims(g: geo.ConvGeom):
    """GEMM view of one conv group: M = out channels, N = output pixels, K = (c, r, s)."""
    Mg = g.M // g.G
    K = (g.C // g.G) * g.KH * g.KW
    Npix = g.N * g.OH * g.OW
    return Mg, Npix, K


KTAB_PAD_ROW = 0x4000  # r*dh of a padding row: never in bounds (H < 0x4000 is required)


def make_ktab(g: geo.ConvGeom, bk: int = BK):
    """Per-k gather offsets, int32 pairs: (c*H*W + r*dh*W + s*dw, r*dh | s*dw << 16)."""
    K = (g.C // g.G) * g.KH * g.KW
    kpad = -(-K // bk) * bk
    k = np.arange(K)
    c, r, s = k // (g.KH * g.KW), (k // g.KW) % g.KH, k % g.KW
    tab = np.zeros((kpad, 2), dtype=np.int32)
    tab[:K, 0] = c * g.H * g.W + r * g.dh * g.W + s * g.dw
    tab[:K, 1] = (r * g.dh) | ((s * g.dw) << 16)
    tab[K:, 1] = KTAB_PAD_ROW   # padding rows load zeros
    return tab


def ktab_smem_bytes(K: int, bk: int, splits: int) -> int:
    nkt = -(-K // bk)
    return -(-nkt // splits) * bk * 8


def _conv_fields(g: geo.ConvGeom) -> dict:
    """The conv geometry ``mma_gemm`` reads in its implicit-GEMM modes (2 and 3)."""
    return dict(C=g.C, H=g.H, W=g.W, OHW=g.OH * g.OW, OW=g.OW, sh=g.sh, sw=g.sw, ph=g.ph, pw=g.pw, Mtot=g.M)


class _MmaConv(TiledMmaParams):
    """The build/launch the tensor-core conv families share: one ``mma_gemm`` launch (``MODE``) per
    call, the epilogue (bias, residual, activation) fused, split-K through ``_split_workspace``.
    A family says its GEMM view (``_gemm``), extra shared memory (``_extra_smem``) and, in
    ``_setup``, its named kernel arguments and how ``launch`` makes the A/B operands of X and W."""
    ordinary_launch = True  # its launch is one own kernel (Candidate.ordinary_launch)

    MODE = 2

    def _gemm(self, g: geo.ConvGeom) -> tuple[int, int, int, int]:
        """(M, N, K, Z): Z GEMMs of M x N over K (one per conv group)."""
        Mg, Npix, K = _mma_conv_dims(g)
        return Mg, Npix, K, g.G

    def _extra_smem(self, g: geo.ConvGeom, K: int) -> int:
        return 0

    @staticmethod
    def _mma_reason(sig: Signature, compute_capability) -> str | None:
        """What every tensor-core family refuses first: a signature CBR kernels do not take, or a GPU
        without mma.sync fp16/tf32 (before sm_80)."""
        reason = check_common(sig)
        if reason:
            return reason
        if tuple(compute_capability) < (8, 0):
            return f"mma.sync fp16/tf32 needs sm_80+, device is sm_{compute_capability[0]}{compute_capability[1]}"
        return None

    def source_hash(self) -> str:
        return source_hash("mma_gemm.cu")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        return [("mma_gemm.cu", self._mma_instance(geo.dtype_of(sig), self.MODE))]

    def _setup(self, g: geo.ConvGeom, dt: str, K: int):
        """(named ``mma_args`` fixed at build time, ``operands(X, W) -> named A/B/flags``)."""
        raise NotImplementedError

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        g, dt = applied(self, sig)
        bm, bn, bk, wm, wn, sk = self._cfg()
        M, N, K, Z = self._gemm(g)
        kern, smem = self._mma_kernel(dt, self.MODE, self._extra_smem(g, K))
        static, operands = self._setup(g, dt, K)
        grid = (-(-N // bn), -(-M // bm), Z * sk)
        ws, counters = self._split_workspace(grid[0] * grid[1] * Z)
        rst, mat = res_plan(sig, g)
        act = geo.act_args(sig)
        OHW = g.OH * g.OW

        def launch(inputs, outputs):
            X, Wt, B, R = (list(inputs) + [None, None])[:4]
            y = check_out(outputs, g, dt)
            if not Wt.flags.c_contiguous or not X.flags.c_contiguous:
                raise TuningError(f"{self.key()}: X and W must be C-contiguous")
            ops = operands(X, Wt)
            R = prepare_residual(R, g, mat)
            rs = (0, 0, 0)
            if R is not None:
                rs = (g.M * OHW, OHW, 1) if mat else rst
            args = mma_args(ops.pop("A"), ops.pop("B"), y, bias=B, R=R, ws=ws, counters=counters, M=M, N=N, K=K,
                            splits=sk, act=act, res_strides=rs, **static, **ops)
            kern(grid, (wm * wn * 32,), args, shared_mem=smem)

        return launch


@dataclass(frozen=True)
class ImplicitGemmConv(_MmaConv, Candidate):
    """(b) Tensor-core implicit GEMM; params bm, bn, bk, wm, wn (warps), splitk."""

    MODE = 2

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        reason = self._mma_reason(sig, compute_capability) or self._config_error(geo.dtype_of(sig), self.MODE)
        if reason:
            return reason
        bm, bn, bk, wm, wn, sk = self._cfg()
        dt = geo.dtype_of(sig)
        g = geo.conv_geom(sig)
        Mg, Npix, K = _mma_conv_dims(g)
        if max(g.H, g.W) >= KTAB_PAD_ROW or (g.KH - 1) * g.dh >= KTAB_PAD_ROW or (g.KW - 1) * g.dw >= 0x8000:
            return "spatial size or dilated window over 16383"
        if g.C // g.G == 1 and Mg == 1:
            return "depthwise convolution (one channel per group): use direct"
        if Mg < 16 and bm > 64:
            return f"{Mg} output channels per group is far below bm={bm}"
        bad = self._split_error(-(-Npix // bn) * -(-Mg // bm) * g.G, -(-K // bk))
        if bad:
            return bad
        if mma_smem_bytes(dt, 2, bm, bn, bk) + ktab_smem_bytes(K, bk, sk) > 200 * 1024:
            return "shared memory over 200 KiB"
        return None

    def _extra_smem(self, g: geo.ConvGeom, K: int) -> int:
        return ktab_smem_bytes(K, self._cfg()[2], self._cfg()[5])

    def _setup(self, g: geo.ConvGeom, dt: str, K: int):
        import cupy

        ktab = cupy.asarray(make_ktab(g, self._cfg()[2]))
        avec = int(K % VEC[dt] == 0)
        static = dict(ktab=ktab, sA=(g.M // g.G) * K, sB=(g.C // g.G) * g.H * g.W, **_conv_fields(g))

        def operands(X, Wt):
            return dict(A=Wt, B=X, avec=avec and Wt.data.ptr % 16 == 0)

        return static, operands


@dataclass(frozen=True)
class ImplicitGemmNhwcConv(_MmaConv, Candidate):
    """(b'') Tensor-core implicit GEMM on an NHWC copy of the input, K ordered (r, s, c): each B
    chunk is one 16-byte load. Needs C/G a multiple of bk. The NCHW -> NHWC transpose of X and the
    weight reorder to [M][KH][KW][C/G] run inside ``launch`` and are counted in its time; the
    output is written NCHW directly by the fused epilogue."""

    MODE = 3

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        reason = self._mma_reason(sig, compute_capability) or self._config_error(geo.dtype_of(sig), self.MODE)
        if reason:
            return reason
        bm, bn, bk, wm, wn, sk = self._cfg()
        g = geo.conv_geom(sig)
        Cg, Mg = g.C // g.G, g.M // g.G
        if Cg % bk:
            return f"channels per group {Cg} not a multiple of bk={bk}"
        if is_pointwise(g):
            return "1x1 stride-1 conv: pointwise_gemm reads NCHW without a transpose"
        if Mg < 16 and bm > 64:
            return f"{Mg} output channels per group is far below bm={bm}"
        Npix = g.N * g.OH * g.OW
        K = Cg * g.KH * g.KW
        bad = self._split_error(-(-Npix // bn) * -(-Mg // bm) * g.G, -(-K // bk))
        if bad:
            return bad
        if g.N * g.C * g.H * g.W > geo.INT32_MAX // 2:
            return "input too large for 32-bit NHWC offsets"
        return None

    def source_hash(self) -> str:
        return source_hash("mma_gemm.cu") + source_hash("elementwise.cu")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        dt = geo.dtype_of(sig)
        return [("mma_gemm.cu", self._mma_instance(dt, self.MODE)),
                ("elementwise.cu", instance("nchw_to_nhwc", dt)), ("elementwise.cu", instance("weight_to_rsc", dt))]

    def _setup(self, g: geo.ConvGeom, dt: str, K: int):
        import cupy

        Cg = g.C // g.G
        tr = get_kernel("elementwise.cu", instance("nchw_to_nhwc", dt))
        wr = get_kernel("elementwise.cu", instance("weight_to_rsc", dt))
        xn = cupy.empty((g.N, g.H, g.W, g.C), dtype=dt)
        wrs = cupy.empty((g.M, g.KH, g.KW, Cg), dtype=dt)
        HW = g.H * g.W
        tgrid = (-(-HW // 32), -(-g.C // 32), g.N)
        wgrid = (min(-(-(g.M * K) // 256), 132 * 16),)
        targs = (np.int32(g.C), np.int32(HW))
        wargs = (np.int32(g.M), np.int32(Cg), np.int32(g.KH * g.KW))
        static = dict(avec=1, bvec=1, sA=(g.M // g.G) * K, sB=Cg, KWd=g.KW, dh=g.dh, dw=g.dw, Cg=Cg,
                      **_conv_fields(g))

        def operands(X, Wt):  # the NHWC copy of X and the (r, s, c) weights, counted in the launch
            tr(tgrid, (32, 8), (X, xn) + targs)
            wr(wgrid, (256,), (Wt, wrs) + wargs)
            return dict(A=wrs, B=xn)

        return static, operands


@dataclass(frozen=True)
class PointwiseGemmConv(_MmaConv, Candidate):
    """(b') 1x1 stride-1 convs on the tensor cores as a batched GEMM on NCHW as it is:
    Y[n] (M x HW) = W (M x C) . X[n] (C x HW), with 16-byte loads of both operands (HW % 8 == 0
    for fp16) and the epilogue fused; same kernel and tile family as ``implicit_gemm``."""

    MODE = 0

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        reason = self._mma_reason(sig, compute_capability)
        if reason:
            return reason
        g = geo.conv_geom(sig)
        if not is_pointwise(g):
            return "not a 1x1, stride-1, unpadded, ungrouped convolution"
        bm, bn, bk, wm, wn, sk = self._cfg()
        HW = g.OH * g.OW
        dt = geo.dtype_of(sig)
        bad = self._config_error(dt, self.MODE, vec_ok=g.C % VEC[dt] == 0 and HW % VEC[dt] == 0)
        if bad:
            return bad
        if g.M < 16 and bm > 64:
            return f"{g.M} output channels is far below bm={bm}"
        bad = self._split_error(-(-HW // bn) * -(-g.M // bm) * g.N, -(-g.C // bk))
        if bad:
            return bad
        if g.N * sk > 65535:
            return "batch x split over the grid's z limit"
        return None

    def _gemm(self, g: geo.ConvGeom) -> tuple[int, int, int, int]:
        return g.M, g.OH * g.OW, g.C, g.N  # one GEMM per image

    def _setup(self, g: geo.ConvGeom, dt: str, K: int):
        HW = g.OH * g.OW
        v = VEC[dt]
        avec, bvec = int(g.C % v == 0), int(HW % v == 0)
        static = dict(sB=g.C * HW, sY=g.M * HW, ldb=HW)

        def operands(X, Wt):
            fa, fb = self._launch_flags(bool(avec and Wt.data.ptr % 16 == 0), bool(bvec and X.data.ptr % 16 == 0))
            return dict(A=Wt, B=X, avec=fa, bvec=fb)

        return static, operands


__all__ = ["KTAB_PAD_ROW", "ImplicitGemmConv", "ImplicitGemmNhwcConv", "PointwiseGemmConv", "ktab_smem_bytes", "make_ktab"]
