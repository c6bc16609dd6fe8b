"""The tensor-core tile configurations and what every ``mma_gemm`` family shares (``mma_gemm.cu``).

CBR's ``implicit_gemm``, ``implicit_gemm_nhwc`` and ``pointwise_gemm`` and GemmAct's ``mma_gemm`` take
their configs from :func:`mma_family` and their config checks, template instance, shared memory,
split-K workspace and launch flags from :class:`TiledMmaParams`.
"""

from __future__ import annotations

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels.source import VEC16, get_kernel, instance

VEC = VEC16  # elements per 16-byte load of A / B
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


__all__ = [
    "BK", "ELEM", "PIPE_DTYPES", "PIPE_STAGES", "PIPE_TILES", "SPLITS", "SPLIT_MAX_BASE_CTAS", "TILE_CONFIGS",
    "TILE_CONFIGS_BK", "VEC", "TiledMmaParams", "epi_smem_bytes", "mma_family", "mma_smem_bytes",
]
