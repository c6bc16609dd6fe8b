"""The ``cublas_softmax`` Attention family: scores ``S = scale * Q . K^T`` by one cuBLAS batched GEMM
(graphopt's own handle, so CUDA-graph capture works: ``graphopt.kernels.blas``), one fused mask / causal /
softmax / nan_to_zero kernel in place on S (``attn_softmax``: a row per CTA of ``warps`` warps;
``attn_softmax_rows``: ``lanes`` lanes a row, for short rows; either with ``loads``: a row held in
registers), then ``Y = P . V`` by a second batched GEMM. Contiguous ``[B, H, S, D]`` operands go through strided-batched GEMMs; ``[B, S, H, D]`` ones
(``qkv_bshd`` / ``y_bshd`` / ``qkv_packed``) through pointer-array batched GEMMs, their pointers written
on the stream by ``attn_batch_ptrs`` from ``batch_offsets`` before each call (one stride per (b, h)
batch cannot reach a head's rows). The scores are stored in the data's dtype; the GEMMs and the softmax
accumulate in fp32."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import blas
from graphopt.kernels.attention_plan import AttnPlan, _AttentionKernels, _arrays, _mask_args, attention_plan
from graphopt.kernels.source import VEC16, get_kernel, instance, source_hash
from graphopt.lowering.contract import Candidate, Signature

SOFTMAX_WARPS = (1, 2, 4, 8)
SOFTMAX_LANES = (8, 16, 32)  # attn_softmax_rows: lanes a row (256 / lanes rows a CTA)
SOFTMAX_LANES_MAX_LOADS = 8  # loads a lane beyond which a short-row configuration does not apply
SOFTMAX_HELD_LOADS = (1, 2, 4, 8)  # the held forms: a thread's loads, exactly (rows of lanes or threads x loads vectors)
GRID_ROWS_MAX = 132 * 64  # softmax CTAs; rows beyond this loop inside the kernel


def score_gemm(p: AttnPlan) -> dict:
    """``blas.bound_gemm`` arguments of ``S[z] = scale * Q[z] . K^T[z]`` ([Sq][Skv] per (b, h))."""
    return dict(M=p.Sq, N=p.Skv, K=p.D, trans_b=not p.kt, batch=p.Z, stride_a=p.Sq * p.D, stride_b=p.Skv * p.D,
                stride_c=p.Sq * p.Skv, alpha=p.scale)


def value_gemm(p: AttnPlan) -> dict:
    """``blas.bound_gemm`` arguments of ``Y[z] = P[z] . V[z]``."""
    return dict(M=p.Sq, N=p.Dv, K=p.Skv, batch=p.Z, stride_a=p.Sq * p.Skv, stride_b=p.Skv * p.Dv,
                stride_c=p.Sq * p.Dv)


def row_strides(p: AttnPlan) -> tuple[int, int, int, int]:
    """Elements between consecutive rows of one (b, h) slice of Q, K, V and Y (``attn_rows`` in
    attention.cu is the kernels' copy of this and of :func:`batch_offsets`)."""
    hp = (3 if p.packed else 1) * p.H if p.bshd else 1  # heads a row holds
    return (hp * p.D, hp * p.D, hp * p.Dv, p.H * p.Dv if p.ybshd else p.Dv)


def batch_offsets(p: AttnPlan) -> np.ndarray:
    """[4, Z] int64: where the (b, h) slice of Q, K, V and Y starts, in elements from each operand's
    base (for ``qkv_packed`` K's and V's bases are Q's plus H * D and 2 * H * D), z = b * H + h."""
    z = np.arange(p.Z, dtype=np.int64)
    b, h = z // p.H, z % p.H
    rq, rk, rv, ry = row_strides(p)
    if p.bshd:
        q, k, v = b * p.Sq * rq + h * p.D, b * p.Skv * rk + h * p.D, b * p.Skv * rv + h * p.Dv
    else:
        q, k, v = z * p.Sq * p.D, z * p.Skv * p.D, z * p.Skv * p.Dv
    y = b * p.Sq * ry + h * p.Dv if p.ybshd else z * p.Sq * p.Dv
    return np.stack([q, k, v, y])


def batch_ptrs_instance(dtype: str) -> str:
    """The kernel that writes the pointer arrays (``attn_batch_ptrs`` in attention.cu)."""
    return instance("attn_batch_ptrs", dtype)


def score_gemm_ptrs(p: AttnPlan) -> dict:
    """``blas.bound_gemm_batched`` arguments of ``S[z] = scale * Q[z] . K^T[z]`` over [B, S, H, D] operands."""
    rq, rk, _, _ = row_strides(p)
    return dict(M=p.Sq, N=p.Skv, K=p.D, lda=rq, ldb=rk, ldc=p.Skv, batch=p.Z, trans_b=True, alpha=p.scale)


def value_gemm_ptrs(p: AttnPlan) -> dict:
    """``blas.bound_gemm_batched`` arguments of ``Y[z] = P[z] . V[z]`` over [B, S, H, D] operands."""
    _, _, rv, ry = row_strides(p)
    return dict(M=p.Sq, N=p.Dv, K=p.Skv, lda=p.Skv, ldb=rv, ldc=ry, batch=p.Z)


def softmax_configs(dtype: str) -> list[tuple[tuple[str, Any], ...]]:
    """The in-place softmax kernel's configurations (``cublas_softmax``'s params): a row per CTA of
    ``warps`` warps (``attn_softmax``), or ``lanes`` lanes a row and 256 / lanes rows a CTA
    (``attn_softmax_rows``, for short rows); ``vec`` scores per load (16 bytes; absent: 1); with
    ``loads``, a row of exactly lanes * loads (or warps * 32 * loads) 16-byte vectors held in registers."""
    vecs = sorted({VEC16[dtype]} if dtype in VEC16 else set(), reverse=True)
    out: list[tuple[tuple[str, Any], ...]] = [(("warps", w),) for w in SOFTMAX_WARPS]
    out += [(("warps", w), ("vec", v)) for v in vecs for w in SOFTMAX_WARPS]
    out += [(("lanes", n),) + ((("vec", v),) if v > 1 else ()) for v in vecs + [1] for n in SOFTMAX_LANES]
    out += [(("lanes", n), ("vec", v), ("loads", k)) for v in vecs for n in SOFTMAX_LANES for k in SOFTMAX_HELD_LOADS]
    out += [(("warps", w), ("vec", v), ("loads", k)) for v in vecs for w in SOFTMAX_WARPS for k in SOFTMAX_HELD_LOADS]
    return out


def softmax_reason(params: dict, dtype: str, skv: int) -> str | None:
    """Why the softmax configuration ``params`` does not take rows of ``skv`` scores (None: it does)."""
    vec = int(params.get("vec", 1))
    if vec > 1 and vec != VEC16.get(dtype):
        return f"vec={vec} is not a 16-byte load of {dtype}"
    if skv % vec:
        return f"{skv} keys are not a multiple of vec={vec}"
    loads = skv // vec
    if "loads" in params:  # held in registers: exactly one load of each vector per thread and trip
        k = int(params["loads"])
        width, what = (int(params["lanes"]), f"lanes={params['lanes']}") if "lanes" in params else \
            (32 * int(params["warps"]), f"warps={params['warps']} (x 32 threads)")
        if vec == 1 or loads != width * k:
            return f"a row of {skv} keys is not {what} x loads={k} 16-byte vectors"
        return None
    if "lanes" in params:
        n = int(params["lanes"])
        if n > SOFTMAX_LANES[0] and (n // 2) >= loads:
            return f"{n // 2} lanes already cover a row of {skv} keys"
        if loads > n * SOFTMAX_LANES_MAX_LOADS:
            return f"a row of {skv} keys is {loads // n} loads a lane for lanes={n} (a CTA a row suits it)"
        return None
    w = int(params["warps"])
    if w > 1 and (w // 2) * 32 >= loads:
        return f"{w // 2} warps already cover a row of {skv} keys"
    return None


def softmax_instance(dtype: str, mask: int, params: dict) -> str:
    vec = int(params.get("vec", 1))
    loads = int(params.get("loads", 0))  # rows held in registers (0: any length, strided)
    if "lanes" in params:
        return instance("attn_softmax_rows", dtype, int(params["lanes"]), mask, vec, loads)
    return instance("attn_softmax", dtype, int(params["warps"]), mask, vec, loads)


def softmax_grid(rows: int, params: dict) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) of the softmax kernel over ``rows`` rows; rows past the grid loop inside it."""
    if "lanes" in params:
        per_cta = 256 // int(params["lanes"])
        return (max(1, min(-(-rows // per_cta), GRID_ROWS_MAX)),), (256,)
    return (max(1, min(rows, GRID_ROWS_MAX)),), (int(params["warps"]) * 32,)


@dataclass(frozen=True)
class CublasSoftmaxAttention(_AttentionKernels, Candidate):
    """cuBLAS batched GEMM, the fused mask/softmax kernel in place, cuBLAS batched GEMM; params: the
    softmax configuration (``softmax_configs``)."""

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        try:
            p = attention_plan(sig)
        except TuningError as exc:
            return str(exc)
        if p.layout_flags and p.kt:
            return "k_transposed with qkv_bshd"
        reason = softmax_reason(dict(self.params), p.dtype, p.Skv)
        if reason:
            return reason
        if max(p.Sq, p.Skv, p.D, p.Dv) > 2**31 - 1 or p.Z > 2**31 - 1:
            return "dims over 2**31 (cuBLAS int dims)"
        return None

    def source_hash(self) -> str:
        return source_hash("attention.cu") + f"+blas{blas.VERSION}"

    def _instance(self, sig: Signature) -> str:
        p = attention_plan(sig)
        return softmax_instance(p.dtype, p.mask, dict(self.params))

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        p = attention_plan(sig)
        extra = [("attention.cu", batch_ptrs_instance(p.dtype))] if p.layout_flags else []
        return [("attention.cu", self._instance(sig))] + extra

    def _build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        import cupy

        p, kern = self._prologue(sig)
        rows = p.Z * p.Sq
        grid, block = softmax_grid(rows, dict(self.params))
        # The scores buffer is allocated once, at build time, so a captured CUDA graph reuses it.
        scores = cupy.empty(p.Z * p.Sq * p.Skv, dtype=p.dtype)

        def softmax(M):
            kern(grid, block, (scores, np.int64(rows), np.int32(p.Sq), np.int32(p.Skv), np.int32(p.H))
                 + _mask_args(p, M) + (np.int32(p.nan_to_zero),))

        if not p.layout_flags:  # the GEMMs bound once (_arrays checks each launch's dtypes and sizes)
            s_gemm = blas.bound_gemm(p.dtype, **score_gemm(p))
            y_gemm = blas.bound_gemm(p.dtype, **value_gemm(p))

            def launch(inputs, outputs):
                Q, K, V, M, Y = _arrays(p, inputs, outputs, self.key())
                s_gemm(Q, K, scores)
                softmax(M)
                y_gemm(scores, V, Y)

            return launch

        # [B, S, H, D] operands: pointer-array batched GEMMs (one stride per batch cannot reach the
        # heads), their Q / K / V / Y pointers written on the stream by attn_batch_ptrs before each call
        s_gemm = blas.bound_gemm_batched(p.dtype, **score_gemm_ptrs(p))
        y_gemm = blas.bound_gemm_batched(p.dtype, **value_gemm_ptrs(p))
        offsets = cupy.asarray(batch_offsets(p).reshape(-1))
        ptrs = cupy.empty(4 * p.Z, dtype=cupy.uint64)  # Q, K, V, Y pointers, Z each
        s_ptrs = cupy.asarray(scores.data.ptr + np.arange(p.Z, dtype=np.uint64) * np.uint64(p.Sq * p.Skv * scores.itemsize))
        fill = get_kernel("attention.cu", batch_ptrs_instance(p.dtype))
        fill_grid = (-(-4 * p.Z // 256),)
        at = [ptrs.data.ptr + i * p.Z * 8 for i in range(4)]  # the device addresses of the four arrays
        u64 = np.uint64

        def launch(inputs, outputs):
            Q, K, V, M, Y = _arrays(p, inputs, outputs, self.key())
            fill(fill_grid, (256,), (ptrs, offsets, np.int32(p.Z), u64(Q.data.ptr), u64(K.data.ptr), u64(V.data.ptr),
                                     u64(Y.data.ptr)))
            s_gemm(at[0], at[1], s_ptrs.data.ptr)
            softmax(M)
            y_gemm(s_ptrs.data.ptr, at[2], at[3])

        return launch
