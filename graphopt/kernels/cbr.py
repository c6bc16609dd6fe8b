"""CBR lowering candidates: y = act(Conv(X, W, B) + R), NCHW in and out.

- ``direct``         (a) direct convolution, one thread per ``opt`` output columns;
- ``implicit_gemm``  (b) tensor-core implicit GEMM (mma.sync fp16 / tf32), epilogue fused,
                         reading NCHW directly (no layout conversion, so none is counted);
- ``cublas``         (c) cuBLAS through ``cupy.matmul`` (1x1 stride-1 convs as a batched GEMM on
                         NCHW as it is, others after an im2col kernel), then one fused epilogue.

Every ``launch(inputs, outputs)`` takes ``inputs = [X, W, B or None, R or None]`` (CuPy arrays of the
signature's dtype) and ``outputs = [Y]`` (C-contiguous, the conv output shape) and enqueues on the
current CuPy stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import blas
from graphopt.kernels import geometry as geo
from graphopt.lowering.contract import Candidate, Lowering, Signature
from graphopt.kernels.mma_args import mma_args, ptr  # ptr: re-exported for the other kernel families
from graphopt.kernels.source import get_kernel, instance, source_hash

SUPPORTED_DTYPES = ("float16", "float32")


VEC = {"float16": 8, "float32": 4}
ELEM = {"float16": 2, "float32": 4}

# (bm, bn, warps_m, warps_n) for the mma kernels; bk is 32 throughout.
TILE_CONFIGS: tuple[tuple[int, int, int, int], ...] = (
    (128, 128, 2, 4),
    (128, 256, 2, 4),
    (128, 64, 2, 2),
    (64, 128, 2, 2),
    (64, 64, 2, 2),
    (64, 32, 2, 1),
)
# Each tile config with bk = 32, and the smaller ones also with bk = 64 (half the K steps: for the
# latency-bound batch-1 layers each step costs about one global-memory round trip).
TILE_CONFIGS_BK: tuple[tuple[int, int, int, int, int], ...] = tuple(
    [c + (32,) for c in TILE_CONFIGS] + [c + (64,) for c in TILE_CONFIGS if c[0] * c[1] <= 128 * 64]
)
# The cp.async multistage configs (STAGES >= 3; modes 0, 1, 3 and fp16 only, where both operands
# arrive in 16-byte chunks): (bm, bn, warps_m, warps_n, bk). 4-warp 128x128 tiles (64x64 per warp)
# are CUTLASS's usual Ampere choice; the smaller tiles keep enough CTAs for the 7x7 / 14x14 layers.
PIPE_TILES: tuple[tuple[int, int, int, int, int], ...] = (
    (128, 128, 2, 2, 32), (128, 128, 2, 4, 32), (128, 256, 2, 4, 32), (256, 128, 4, 2, 32),
    (128, 64, 2, 2, 32), (64, 128, 2, 2, 32), (64, 64, 2, 2, 32),
    (128, 128, 2, 2, 64), (128, 64, 2, 2, 64), (64, 128, 2, 2, 64), (64, 64, 2, 2, 64),
)
PIPE_STAGES = (3, 4)
PIPE_DTYPES = ("float16",)
SPLITS = (1, 2, 4, 8, 16)
BK = 32
# A split-K config is only worth trying when the unsplit grid leaves most of a large GPU idle.
SPLIT_MAX_BASE_CTAS = 256


def mma_smem_bytes(dtype: str, mode: int, bm: int, bn: int, bk: int = BK, stages: int = 2) -> int:
    """Dynamic shared memory of one mma_gemm instance (mirrors the constants in mma_gemm.cu)."""
    pada = 8 if dtype == "float16" else 4
    lda = bk + pada
    if mode in (1, 3):
        b = bn * (bk + pada)
    else:
        b = bk * (bn + 8)
    return max(2, stages) * (bm * lda + b) * ELEM[dtype]


def epi_smem_bytes(bm: int, bn: int, sepi: int) -> int:
    """Shared memory the staged epilogue needs (an fp32 [bm][bn + 4] tile), 0 without it."""
    return bm * (bn + 4) * 4 if sepi else 0


def mma_family(cls, name: str, pipelined: bool = True) -> list:
    """Every config of one mma family: each tile, each split, plus the staged-epilogue variant of
    the unsplit configs; then (``pipelined``) the cp.async multistage tiles, split only where the
    tile is small enough for split-K to matter."""
    out = []
    for bm, bn, wm, wn, bk in TILE_CONFIGS_BK:
        base = (("bm", bm), ("bn", bn), ("bk", bk), ("wm", wm), ("wn", wn))
        for sk in SPLITS:
            out.append(cls(name, base + (("splitk", sk),)))
        out.append(cls(name, base + (("splitk", 1), ("sepi", 1))))
    if pipelined:
        for st in PIPE_STAGES:
            for bm, bn, wm, wn, bk in PIPE_TILES:
                base = (("bm", bm), ("bn", bn), ("bk", bk), ("wm", wm), ("wn", wn))
                for sk in (SPLITS if bm * bn <= 128 * 64 else (1,)):
                    out.append(cls(name, base + (("splitk", sk), ("st", st))))
                out.append(cls(name, base + (("splitk", 1), ("sepi", 1), ("st", st))))
    return out


def _check_common(sig: Signature) -> str | None:
    if sig.op != "CBR":
        return f"op {sig.op} is not CBR"
    if sig.layout != "NCHW":
        return f"layout {sig.layout} (the kernels take NCHW)"
    try:
        dt = geo.dtype_of(sig)
        geo.conv_geom(sig)
        geo.act_args(sig)
    except TuningError as exc:
        return str(exc)
    if dt not in SUPPORTED_DTYPES:
        return f"dtype {dt} (supported: {', '.join(SUPPORTED_DTYPES)})"
    if len(sig.input_shapes) > 2 and sig.input_shapes[2] is not None:
        g = geo.conv_geom(sig)
        if tuple(sig.input_shapes[2]) != (g.M,):
            return f"bias shape {sig.input_shapes[2]} is not [{g.M}]"
    return None


def _res_plan(sig: Signature, g: geo.ConvGeom):
    """(strides or None, needs_materialise) for the residual input."""
    rshape = sig.input_shapes[3] if len(sig.input_shapes) > 3 else None
    if rshape is None:
        return None, False
    st = geo.residual_strides(rshape, g)
    return st, st is None


def _prepare_residual(R, g: geo.ConvGeom, materialise: bool):
    if R is None:
        return None
    import cupy

    if materialise:
        R4 = R.reshape(geo.residual_shape_4d(R.shape, g))
        full = cupy.broadcast_to(R4, (g.N, g.M, g.OH, g.OW))
        return cupy.ascontiguousarray(full).reshape(g.out_shape)
    return cupy.ascontiguousarray(R)


def _applied(cand: Candidate, sig: Signature) -> tuple[geo.ConvGeom, str]:
    """(geometry, dtype) for ``cand.build(sig)``; ``TuningError`` when the candidate does not apply."""
    reason = cand.applies(sig)
    if reason:
        raise TuningError(f"candidate {cand.key()} does not apply: {reason}")
    return geo.conv_geom(sig), geo.dtype_of(sig)


def _check_out(outputs, g: geo.ConvGeom, dt: str):
    y = outputs[0]
    if tuple(y.shape) != g.out_shape or str(y.dtype) != dt or not y.flags.c_contiguous:
        raise TuningError(f"CBR output must be a C-contiguous {dt} array of shape {g.out_shape}, got {y.dtype} {y.shape}")
    return y


class TiledMmaParams:
    """What the tensor-core families (mma_gemm.cu) share: the tile-configuration accessors and
    checks, the template instance, shared memory, the split-K workspace and the launch flags."""

    def _cfg(self):
        return tuple(int(self.param(k)) for k in ("bm", "bn", "bk", "wm", "wn", "splitk"))

    def _sepi(self) -> int:
        """1: the shared-memory staged (coalesced) epilogue variant."""
        return int(self.param("sepi", 0))

    def _stages(self) -> int:
        """2: register-staged double buffering; 3 or 4: the cp.async multistage pipeline."""
        return int(self.param("st", 2))

    def _config_error(self, dtype: str, mode: int, vec_ok: bool = True) -> str | None:
        """Why this config cannot run ``mode`` at ``dtype`` (None when it can)."""
        bm, bn, bk, wm, wn, sk = self._cfg()
        st = self._stages()
        tiles = TILE_CONFIGS_BK if st == 2 else PIPE_TILES
        if (bm, bn, wm, wn, bk) not in tiles or sk not in SPLITS or st not in (2,) + PIPE_STAGES:
            return f"unknown tile config {self.params_str()}"
        if st > 2:
            if mode == 2:
                return "the NCHW gather mode has no cp.async pipeline"
            if dtype not in PIPE_DTYPES:
                return f"the cp.async pipeline is built for {', '.join(PIPE_DTYPES)} only"
            if not vec_ok:
                return "the cp.async pipeline needs 16-byte aligned operand rows"
        return None

    def _split_error(self, base_ctas: int, k_tiles: int) -> str | None:
        sk = self._cfg()[5]
        if sk > 1 and (base_ctas >= SPLIT_MAX_BASE_CTAS or k_tiles < 2 * sk):
            return f"split-K {sk} not useful ({base_ctas} CTAs, {k_tiles} K tiles)"
        return None

    def _mma_instance(self, dtype: str, mode: int) -> str:
        bm, bn, bk, wm, wn, _ = self._cfg()
        return instance("mma_gemm", dtype, mode, bm, bn, bk, wm, wn, self._sepi(), self._stages())

    def _mma_kernel(self, dtype: str, mode: int, extra_smem: int = 0):
        """(kernel, dynamic shared memory bytes), the kernel allowed that much shared memory."""
        bm, bn, bk, _, _, _ = self._cfg()
        kern = get_kernel("mma_gemm.cu", self._mma_instance(dtype, mode))
        smem = max(mma_smem_bytes(dtype, mode, bm, bn, bk, self._stages()) + extra_smem,
                   epi_smem_bytes(bm, bn, self._sepi()))
        kern.max_dynamic_shared_size_bytes = smem
        return kern, smem

    def _split_workspace(self, tiles: int):
        """(fp32 partial-tile workspace, per-tile counters) for split-K, else (None, None)."""
        import cupy

        bm, bn, _, _, _, sk = self._cfg()
        if sk == 1:
            return None, None
        return cupy.empty(tiles * sk * bm * bn, dtype=cupy.float32), cupy.zeros(tiles, dtype=cupy.int32)

    def _launch_flags(self, avec: bool, bvec: bool):
        """The kernel's (avec, bvec) arguments; the pipelined configs cannot fall back to scalar loads."""
        if self._stages() > 2 and not (avec and bvec):
            raise TuningError(f"{self.key()}: operands are not 16-byte aligned (the cp.async pipeline needs them)")
        return np.int32(avec), np.int32(bvec)


@dataclass(frozen=True)
class DirectConv(Candidate):
    """(a) Direct convolution; ``opt`` consecutive output columns per thread."""

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        reason = _check_common(sig)
        if reason:
            return reason
        g = geo.conv_geom(sig)
        opt = self.param("opt", 1)
        if opt > 1 and g.OW < opt:
            return f"output width {g.OW} < opt={opt}"
        if self.name == "direct_k3" and not (g.KW == 3 and g.dw == 1 and g.sw in (1, 2)):
            return "direct_k3 needs a 3-wide window, W dilation 1 and W stride 1 or 2"
        if g.C // g.G * g.KH * g.KW > 4608 and g.C // g.G > 64:
            return "reduction too long for a direct convolution (use a GEMM lowering)"
        return None

    def source_hash(self) -> str:
        return source_hash("direct_conv.cu")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        """(source, template instance) pairs ``build`` compiles (for parallel prebuilding)."""
        return [("direct_conv.cu", instance("direct_conv", geo.dtype_of(sig), *self._tmpl(sig)))]

    def _tmpl(self, sig: Signature) -> tuple[int, int, int]:
        opt = int(self.param("opt", 1))
        if self.name == "direct_k3":
            return opt, 3, geo.conv_geom(sig).sw
        return opt, 0, 0

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        g, dt = _applied(self, sig)
        opt = int(self.param("opt", 1))
        kern = get_kernel("direct_conv.cu", instance("direct_conv", dt, *self._tmpl(sig)))
        rst, mat = _res_plan(sig, g)
        act = geo.act_args(sig)
        owt = -(-g.OW // opt)
        total = g.N * g.M * g.OH * owt
        grid = (-(-total // 256),)
        i32, f32 = np.int32, np.float32
        geom = tuple(i32(v) for v in (g.N, g.C, g.H, g.W, g.M, g.OH, g.OW, g.KH, g.KW, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.G))
        tail_act = (i32(act.code), f32(act.alpha), f32(act.beta), f32(act.lo), f32(act.hi))

        def launch(inputs, outputs):
            X, Wt, B, R = (list(inputs) + [None, None])[:4]
            y = _check_out(outputs, g, dt)
            R = _prepare_residual(R, g, mat)
            rs = (0, 0, 0) if R is None else ((0, 0, 0) if mat else rst)
            if mat and R is not None:
                rs = (g.M * g.OH * g.OW, g.OH * g.OW, 1)
            kern(grid, (256,), (X, Wt, ptr(B), ptr(R), y) + geom + tuple(i32(v) for v in rs) + tail_act)

        return launch


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
        reason = _check_common(sig)
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
        g, dt = _applied(self, sig)
        bm, bn, bk, wm, wn, sk = self._cfg()
        M, N, K, Z = self._gemm(g)
        kern, smem = self._mma_kernel(dt, self.MODE, self._extra_smem(g, K))
        static, operands = self._setup(g, dt, K)
        grid = (-(-N // bn), -(-M // bm), Z * sk)
        ws, counters = self._split_workspace(grid[0] * grid[1] * Z)
        rst, mat = _res_plan(sig, g)
        act = geo.act_args(sig)
        OHW = g.OH * g.OW

        def launch(inputs, outputs):
            X, Wt, B, R = (list(inputs) + [None, None])[:4]
            y = _check_out(outputs, g, dt)
            if not Wt.flags.c_contiguous or not X.flags.c_contiguous:
                raise TuningError(f"{self.key()}: X and W must be C-contiguous")
            ops = operands(X, Wt)
            R = _prepare_residual(R, g, mat)
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
        reason = self._mma_reason(sig, compute_capability)
        if reason:
            return reason
        bm, bn, bk, wm, wn, sk = self._cfg()
        dt = geo.dtype_of(sig)
        bad = self._config_error(dt, self.MODE)
        if bad:
            return bad
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
        reason = self._mma_reason(sig, compute_capability)
        if reason:
            return reason
        bm, bn, bk, wm, wn, sk = self._cfg()
        bad = self._config_error(geo.dtype_of(sig), self.MODE)
        if bad:
            return bad
        g = geo.conv_geom(sig)
        Cg, Mg = g.C // g.G, g.M // g.G
        if Cg % bk:
            return f"channels per group {Cg} not a multiple of bk={bk}"
        if _is_pointwise(g):
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
        if not _is_pointwise(g):
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


@dataclass(frozen=True)
class CublasConv(Candidate):
    """(c) cuBLAS on NCHW: 1x1 stride-1 directly, other convs after im2col. ``cublas`` calls it
    through ``cupy.matmul``, ``cublas_ws`` through graphopt's own handle and workspace
    (graphopt.kernels.blas: capturable in a CUDA graph)."""

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        reason = _check_common(sig)
        if reason:
            return reason
        g = geo.conv_geom(sig)
        if g.C // g.G == 1 and g.M // g.G == 1:
            return "depthwise convolution: a GEMM per channel is pointless"
        cols = g.N * g.C * g.KH * g.KW * g.OH * g.OW
        if not _is_pointwise(g) and cols * 4 > 4 * 2**30:
            return "im2col buffer over 4 GiB"
        if cols > geo.INT32_MAX and not _is_pointwise(g):
            return "im2col buffer over 2**31 elements"
        return None

    def source_hash(self) -> str:
        return source_hash("elementwise.cu") + (f"+blas{blas.VERSION}" if self.name == "cublas_ws" else "")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        dt = geo.dtype_of(sig)
        out = [("elementwise.cu", instance("epilogue_nchw", dt))]
        if not _is_pointwise(geo.conv_geom(sig)):
            out.append(("elementwise.cu", instance("im2col", dt)))
        return out

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        import cupy

        g, dt = _applied(self, sig)
        epi = get_kernel("elementwise.cu", instance("epilogue_nchw", dt))
        pointwise = _is_pointwise(g)
        OHW = g.OH * g.OW
        Mg, K = g.M // g.G, (g.C // g.G) * g.KH * g.KW
        cols = None
        if not pointwise:
            i2c = get_kernel("elementwise.cu", instance("im2col", dt))
            cols = cupy.empty((g.N, g.G, K, OHW), dtype=dt)
            i2c_total = g.N * g.C * g.KH * g.KW * OHW
            i2c_args = tuple(np.int32(v) for v in (g.N, g.C, g.H, g.W, g.KH, g.KW, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.OH, g.OW))
        rst, mat = _res_plan(sig, g)
        act = geo.act_args(sig)
        total = g.N * g.M * OHW
        egrid = (min(-(-total // 256), 132 * 32),)
        i32, i64, f32 = np.int32, np.int64, np.float32
        tail_act = (i32(act.code), f32(act.alpha), f32(act.beta), f32(act.lo), f32(act.hi))

        own = self.name == "cublas_ws"

        def launch(inputs, outputs):
            X, Wt, B, R = (list(inputs) + [None, None])[:4]
            y = _check_out(outputs, g, dt)
            if own:
                Wc, Xc = cupy.ascontiguousarray(Wt), cupy.ascontiguousarray(X)
                if pointwise:
                    blas.gemm(Wc, Xc, y, g.M, OHW, g.C, batch=g.N, stride_b=g.C * OHW, stride_c=g.M * OHW)
                else:
                    i2c((min(-(-i2c_total // 256), 132 * 32),), (256,), (Xc, cols) + i2c_args)
                    for gi in range(g.G):
                        blas.gemm(Wc, cols, y, Mg, OHW, K, batch=g.N, stride_b=g.G * K * OHW, stride_c=g.M * OHW,
                                  a_offset=gi * Mg * K, b_offset=gi * K * OHW, c_offset=gi * Mg * OHW)
            elif pointwise:
                cupy.matmul(Wt.reshape(g.M, g.C), X.reshape(g.N, g.C, OHW), out=y.reshape(g.N, g.M, OHW))
            else:
                i2c((min(-(-i2c_total // 256), 132 * 32),), (256,), (X, cols) + i2c_args)
                cupy.matmul(Wt.reshape(g.G, Mg, K), cols, out=y.reshape(g.N, g.G, Mg, OHW))
            if B is None and R is None and act.code == 0:
                return
            R = _prepare_residual(R, g, mat)
            rs = (0, 0, 0)
            if R is not None:
                rs = (g.M * OHW, OHW, 1) if mat else rst
            epi(egrid, (256,), (y, ptr(B), ptr(R), i64(total), i32(g.M), i32(OHW), i32(rs[0]), i32(rs[1]), i32(rs[2])) + tail_act)

        # cupy.matmul refuses stream capture; the runtime's own cuBLAS handle does not
        return Lowering(launch=lambda ins, outs, ws: launch(ins, outs), capturable=own)


def _is_pointwise(g: geo.ConvGeom) -> bool:
    return g.KH == 1 and g.KW == 1 and g.sh == 1 and g.sw == 1 and g.ph == 0 and g.pw == 0 and g.G == 1


def cbr_candidates() -> list[Candidate]:
    """Every CBR candidate, in a fixed order (applies() prunes per signature)."""
    out: list[Candidate] = [DirectConv("direct", (("opt", o),)) for o in (1, 2, 4)]
    out += [DirectConv("direct_k3", (("opt", o),)) for o in (4, 8)]
    out += mma_family(ImplicitGemmConv, "implicit_gemm", pipelined=False)
    out += mma_family(ImplicitGemmNhwcConv, "implicit_gemm_nhwc")
    out += mma_family(PointwiseGemmConv, "pointwise_gemm")
    out.append(CublasConv("cublas", ()))
    out.append(CublasConv("cublas_ws", ()))
    return out
