"""Attention lowering candidates (``graphopt.Attention``), three families (kernels in ``attention.cu``;
the plan every one starts from in ``graphopt.kernels.attention_plan``):

- ``cublas_softmax``: cuBLAS GEMMs around one fused softmax kernel (``graphopt.kernels.attention_cublas``).
- ``flash`` (params ``dmax``, ``bm``, ``warps``): one fused kernel with an online softmax over key
  tiles held in shared memory, never writing the scores (``flash_attn``). SIMT fp32 arithmetic (no
  tensor cores); ``dmax`` is the head-dim capacity (the smallest of 32/64/128 that holds D and
  Dv applies), ``bm`` the query rows per CTA. It runs every head dim and fp32.
- ``flash_mma`` (params ``hd``, ``bn``; fp16 only): the tensor-core flash attention
  (FlashAttention-2 style forward: mma.sync m16n8k16 with fp32 accumulation, ldmatrix from padded
  shared-memory tiles, the online softmax on the accumulator fragments, P reused in registers as
  the A operand of P . V). 64 query rows per CTA of 4 warps, ``bn`` keys per tile; D = Dv = ``hd``
  (16, 32, 64 or 128); ``stages`` 1 (load, then compute) or 2 (two K / V buffers, the next tile
  loaded by cp.async while the current one is consumed).

Layout: Q ``[B, H, Sq, D]`` (rank 2-4: missing leading dims are 1), K ``[B, H, Skv, D]`` or, with
``k_transposed=1``, ``[B, H, D, Skv]``, V ``[B, H, Skv, Dv]``, Y ``[B, H, Sq, Dv]``, all
C-contiguous and sharing the leading dims (no broadcast of K/V over heads). With ``qkv_bshd=1`` Q, K
and V are ``[B, S, H, D]`` (rank 4): ``flash`` and ``flash_mma`` read the heads' rows ``H * D`` apart
(``attn_rows`` in the kernel source), and with ``y_bshd=1`` write Y as ``[B, Sq, H, Dv]``; with
``qkv_packed=1`` Q, K and V are the thirds of one ``[B, S, 3, H, D]`` input (rows ``3 * H * D``
apart; ``launch`` passes views of it at offsets 0, H*D and 2*H*D); ``cublas_softmax`` reads these
layouts too (pointer-array batched GEMMs). The mask broadcasts to
``[B, H, Sq, Skv]`` (right-aligned, rank <= 4): additive masks have the data's dtype, bool masks
are NumPy/CuPy bool (one byte).

``launch(inputs, outputs)``: ``inputs = [Q, K, V, mask or None]``, ``outputs = [Y]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels.attention_cublas import CublasSoftmaxAttention, batch_ptrs_instance, softmax_configs, softmax_instance
from graphopt.kernels.attention_plan import (MASK_CODES, SUPPORTED_DTYPES, _AttentionKernels, _arrays, _mask_args,
                                             attention_plan)
from graphopt.kernels.source import SHARED_DEFAULT_BYTES, instance
from graphopt.lowering.contract import Candidate, Signature

FLASH_DMAX = (32, 64, 128)
FLASH_TILES = ((16, 4), (32, 4), (64, 4), (64, 8))  # (bm query rows per CTA, warps)
KEY_TILE = 32
GRID_Y_MAX = 65535


def flash_smem_bytes(dmax: int, bm: int) -> int:
    return 4 * (bm * dmax + KEY_TILE * (dmax + 1) + KEY_TILE * dmax)


@dataclass(frozen=True)
class FlashAttention(_AttentionKernels, Candidate):
    """One fused kernel, online softmax over key tiles in shared memory; params dmax, bm, warps."""
    ordinary_launch = True  # its launch is one own kernel (Candidate.ordinary_launch)

    def _cfg(self) -> tuple[int, int, int]:
        return int(self.param("dmax")), int(self.param("bm")), int(self.param("warps"))

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        try:
            p = attention_plan(sig)
        except TuningError as exc:
            return str(exc)
        dmax, bm, w = self._cfg()
        hd = max(p.D, p.Dv)
        if hd > dmax:
            return f"head dim {hd} > dmax={dmax}"
        smaller = [d for d in FLASH_DMAX if hd <= d < dmax]
        if smaller:
            return f"dmax={smaller[0]} already holds head dim {hd}"
        if p.Z > GRID_Y_MAX:
            return f"{p.Z} batch x heads > {GRID_Y_MAX} (grid y)"
        limit = 227 * 1024 if compute_capability >= (9, 0) else 163 * 1024 if compute_capability >= (8, 0) else SHARED_DEFAULT_BYTES
        if flash_smem_bytes(dmax, bm) > limit:
            return f"{flash_smem_bytes(dmax, bm)} bytes of shared memory > {limit} on sm {compute_capability}"
        return None

    def _instance(self, sig: Signature) -> str:
        dmax, bm, w = self._cfg()
        return instance("flash_attn", attention_plan(sig).dtype, dmax, bm, w, attention_plan(sig).mask)

    def _build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        p, kern = self._prologue(sig)
        dmax, bm, w = self._cfg()
        smem = flash_smem_bytes(dmax, bm)
        kern.max_dynamic_shared_size_bytes = smem
        grid, block = (-(-p.Sq // bm), p.Z), (w * 32,)
        i32 = np.int32

        def launch(inputs, outputs):
            Q, K, V, M, Y = _arrays(p, inputs, outputs, self.key())
            kern(grid, block, (Q, K, V, Y, i32(p.Sq), i32(p.Skv), i32(p.D), i32(p.Dv), i32(p.H), i32(p.kt),
                               np.float32(p.scale)) + _mask_args(p, M) + (i32(p.nan_to_zero), i32(p.layout_flags)),
                 shared_mem=smem)

        return launch


def attention_candidates() -> list[Candidate]:
    configs = {c: None for dt in SUPPORTED_DTYPES for c in softmax_configs(dt)}  # ordered, each once
    out: list[Candidate] = [CublasSoftmaxAttention("cublas_softmax", c) for c in configs]
    for dmax in FLASH_DMAX:
        for bm, w in FLASH_TILES:
            out.append(FlashAttention("flash", (("dmax", dmax), ("bm", bm), ("warps", w))))
    for hd in FLASH_MMA_HD:
        for bn in FLASH_MMA_BN:
            for st in FLASH_MMA_STAGES:
                out.append(FlashMmaAttention("flash_mma", (("hd", hd), ("bn", bn), ("stages", st))))
    return out


def attention_kernel_instances() -> list[tuple[str, str]]:
    """Every (source, instance) a candidate can compile: both dtypes, every mask kind."""
    out = [("attention.cu", batch_ptrs_instance(dt)) for dt in SUPPORTED_DTYPES]
    for dt in SUPPORTED_DTYPES:
        for mask in MASK_CODES.values():
            for c in softmax_configs(dt):
                out.append(("attention.cu", softmax_instance(dt, mask, dict(c))))
            for dmax in FLASH_DMAX:
                for bm, w in FLASH_TILES:
                    out.append(("attention.cu", instance("flash_attn", dt, dmax, bm, w, mask)))
    for mask in MASK_CODES.values():
        for hd in FLASH_MMA_HD:
            for bn in FLASH_MMA_BN:
                for kt in (0, 1):
                    for st in FLASH_MMA_STAGES:
                        out.append(("attention.cu", instance("flash_mma", "float16", hd, bn, mask, kt, st)))
    return out


FLASH_MMA_HD = (16, 32, 64, 128)
FLASH_MMA_BN = (64, 128)
FLASH_MMA_STAGES = (1, 2)  # K / V buffers: 2 keeps the next tile in flight (cp.async)
FLASH_MMA_BM = 64  # query rows per CTA of 4 warps (fixed in the kernel)


def flash_mma_smem_bytes(hd: int, bn: int, kt: bool, stages: int = 1) -> int:
    lq = hd + 8
    return 2 * (FLASH_MMA_BM * lq + stages * ((hd * (bn + 8) if kt else bn * lq) + bn * lq))


@dataclass(frozen=True)
class FlashMmaAttention(_AttentionKernels, Candidate):
    """fp16 tensor-core flash attention (mma.sync m16n8k16, ldmatrix); params hd (= D = Dv), bn (keys
    per tile), stages (K / V buffers)."""
    ordinary_launch = True  # its launch is one own kernel (Candidate.ordinary_launch)

    def _cfg(self) -> tuple[int, int, int]:
        return int(self.param("hd")), int(self.param("bn")), int(self.param("stages", 1))

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        try:
            p = attention_plan(sig)
        except TuningError as exc:
            return str(exc)
        hd, bn, st = self._cfg()
        if p.dtype != "float16":
            return f"dtype {p.dtype} (the tensor-core kernel is fp16)"
        if compute_capability < (8, 0):
            return f"sm {compute_capability[0]}.{compute_capability[1]} has no mma.sync m16n8k16 (needs 8.0)"
        if p.D != hd or p.Dv != hd:
            return f"head dims D={p.D}, Dv={p.Dv} are not both hd={hd}"
        if p.Z > GRID_Y_MAX:
            return f"{p.Z} batch x heads > {GRID_Y_MAX} (grid y)"
        limit = 227 * 1024 if compute_capability >= (9, 0) else 163 * 1024
        if flash_mma_smem_bytes(hd, bn, p.kt, st) > limit:
            return f"{flash_mma_smem_bytes(hd, bn, p.kt, st)} bytes of shared memory > {limit}"
        return None

    def _instance(self, sig: Signature) -> str:
        hd, bn, st = self._cfg()
        p = attention_plan(sig)
        return instance("flash_mma", "float16", hd, bn, p.mask, int(p.kt), st)

    def _build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        p, kern = self._prologue(sig)
        hd, bn, st = self._cfg()
        smem = flash_mma_smem_bytes(hd, bn, p.kt, st)
        kern.max_dynamic_shared_size_bytes = smem
        grid, block = (-(-p.Sq // FLASH_MMA_BM), p.Z), (128,)
        i32 = np.int32

        def launch(inputs, outputs):
            Q, K, V, M, Y = _arrays(p, inputs, outputs, self.key())
            for name, a in (("Q", Q), ("K", K), ("V", V), ("Y", Y)):
                if a.data.ptr % 16:
                    raise TuningError(f"{self.key()}: {name} is not 16-byte aligned")
            kern(grid, block, (Q, K, V, Y, i32(p.Sq), i32(p.Skv), i32(p.H), np.float32(p.scale)) + _mask_args(p, M)
                 + (i32(p.nan_to_zero), i32(p.layout_flags)), shared_mem=smem)

        return launch
