"""Attention lowering candidates (``graphopt.Attention``), two families (``attention.cu``):

- ``cublas_softmax`` (params ``warps``, or ``lanes`` for short rows, and ``vec`` for 16-byte loads
  of the scores where the key count allows; ``softmax_configs``): scores ``S = scale * Q . K^T`` by
  one cuBLAS batched GEMM (graphopt's own handle, so CUDA-graph capture works:
  graphopt/kernels/blas.py), then one fused mask / causal / softmax / nan_to_zero kernel in place on
  S (``attn_softmax``, one row per CTA of ``warps`` warps; ``attn_softmax_rows``, ``lanes`` lanes a
  row), then ``Y = P . V`` by a second batched GEMM. The scores are stored in the data's dtype (fp16
  for fp16 models; the GEMMs and the softmax accumulate in fp32).
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
layouts through pointer-array batched GEMMs (``cublasGemmBatchedEx``; one stride per (b, h) batch
cannot reach a head's rows), the pointers written on the stream by ``attn_batch_ptrs`` from
:func:`batch_offsets` before each call. The mask broadcasts to
``[B, H, Sq, Skv]`` (right-aligned, rank <= 4): additive masks have the data's dtype, bool masks
are NumPy/CuPy bool (one byte).

``launch(inputs, outputs)``: ``inputs = [Q, K, V, mask or None]``, ``outputs = [Y]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import blas
from graphopt.lowering.contract import Candidate, Signature
from graphopt.ops.attention import operands as attention_operands
from graphopt.ops.attention import swap_heads
from graphopt.kernels.mma_args import ptr
from graphopt.kernels.source import SHARED_DEFAULT_BYTES, VEC16, get_kernel, instance, source_hash

SUPPORTED_DTYPES = ("float16", "float32")
MASK_CODES = {"none": 0, "additive": 1, "bool": 2}
SOFTMAX_WARPS = (1, 2, 4, 8)
SOFTMAX_LANES = (8, 16, 32)  # attn_softmax_rows: lanes a row (256 / lanes rows a CTA)
SOFTMAX_LANES_MAX_LOADS = 8  # loads a lane (held in registers) beyond which a short-row configuration does not apply
FLASH_DMAX = (32, 64, 128)
FLASH_TILES = ((16, 4), (32, 4), (64, 4), (64, 8))  # (bm query rows per CTA, warps)
KEY_TILE = 32
GRID_ROWS_MAX = 132 * 64  # softmax CTAs; rows beyond this loop inside the kernel
GRID_Y_MAX = 65535


@dataclass(frozen=True)
class AttnPlan:
    B: int
    H: int
    Sq: int
    Skv: int
    D: int
    Dv: int
    kt: bool
    scale: float
    mask: int  # MASK_CODES value
    mask_shape: tuple[int, ...] | None
    mask_strides: tuple[int, int, int, int]  # elements over (b, h, i, j); 0 where it broadcasts
    mask_value: float
    causal: int
    nan_to_zero: int
    dtype: str
    out_shape: tuple[int, ...]
    bshd: int = 0  # Q, K, V given as [B, S, H, D] (qkv_bshd=1); the dims above are the logical ones
    ybshd: int = 0  # Y written as [B, Sq, H, Dv] (y_bshd=1)
    packed: int = 0  # Q, K, V the thirds of one [B, S, 3, H, D] input (qkv_packed=1, with bshd)

    @property
    def layout_flags(self) -> int:
        """The kernels' ``bshd`` argument: bit 0 Q/K/V as [B, S, H, D], bit 1 Y as [B, Sq, H, Dv], bit 2
        Q/K/V packed in one [B, S, 3, H, D] tensor."""
        return self.bshd | (self.ybshd << 1) | (self.packed << 2)

    @property
    def Z(self) -> int:
        return self.B * self.H


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _lead2(shape: tuple[int, ...]) -> tuple[int, int]:
    lead = (1, 1) + tuple(shape[:-2])
    return int(lead[-2]), int(lead[-1])


def _mask_strides(mshape: tuple[int, ...], full: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    if len(mshape) > 4:
        raise TuningError(f"Attention mask of rank {len(mshape)} (at most 4: [B, H, Sq, Skv])")
    m4 = (1,) * (4 - len(mshape)) + tuple(int(s) for s in mshape)
    strides, acc = [0, 0, 0, 0], 1
    for ax in range(3, -1, -1):
        if m4[ax] not in (1, full[ax]):
            raise TuningError(f"Attention mask {tuple(mshape)} does not broadcast to [B, H, Sq, Skv] = {list(full)}")
        strides[ax] = acc if m4[ax] != 1 else 0
        acc *= m4[ax]
    return tuple(strides)  # type: ignore[return-value]


def attention_plan(sig: Signature) -> AttnPlan:
    """The integers the kernels take, or ``TuningError`` saying why the signature is not supported."""
    q, k, v, m, dtypes = attention_operands(sig, "Attention", bshd_ok=True)
    if not (q[:-2] == k[:-2] == v[:-2]):
        raise TuningError(f"Attention Q {q}, K {k}, V {v} must share their leading (batch, head) dims "
                          "(K/V broadcast over heads is not supported)")
    dt = dtypes[0]
    if dt not in SUPPORTED_DTYPES or dtypes[1] != dt or dtypes[2] != dt:
        raise TuningError(f"Attention dtypes {dtypes[:3]} (Q, K, V of one of {', '.join(SUPPORTED_DTYPES)})")
    attrs = dict(sig.attrs)
    kt = bool(attrs.get("k_transposed", 0))
    Sq, D = int(q[-2]), int(q[-1])
    Skv, kd = (int(k[-1]), int(k[-2])) if kt else (int(k[-2]), int(k[-1]))
    if kd != D:
        raise TuningError(f"Attention K {k} (k_transposed={int(kt)}) and Q {q} disagree on the head dim")
    if int(v[-2]) != Skv:
        raise TuningError(f"Attention V {v} has {v[-2]} keys, K has {Skv}")
    Dv = int(v[-1])
    B, H = _lead2(q)
    kind = _text(attrs.get("mask_kind", "none"))
    if kind not in MASK_CODES:
        raise TuningError(f"Attention mask_kind={kind!r}")
    strides = (0, 0, 0, 0)
    if kind != "none":
        if m is None:
            raise TuningError(f"Attention mask_kind={kind!r} needs a known mask shape")
        want = dt if kind == "additive" else "bool"
        if dtypes[3] != want:
            raise TuningError(f"Attention {kind} mask of dtype {dtypes[3]} (the kernels read {want})")
        strides = _mask_strides(m, (B, H, Sq, Skv))
    if max(B * H * Sq * Skv, B * H * Sq * D, B * H * Skv * max(D, Dv)) > 2**62 or max(Sq, Skv, D, Dv) > 2**31 - 1:
        raise TuningError("Attention tensors too large for the kernels' indexing")
    scale = attrs.get("scale")
    scale = float(np.float32(scale)) if scale is not None else 1.0 / math.sqrt(D)
    mv = attrs.get("mask_value")
    return AttnPlan(B, H, Sq, Skv, D, Dv, kt, scale, MASK_CODES[kind], None if m is None else tuple(m), strides,
                    -math.inf if mv is None else float(np.float32(mv)), int(attrs.get("causal", 0)),
                    int(attrs.get("nan_to_zero", 0)), dt, _out_shape(q, Dv, attrs),
                    int(attrs.get("qkv_bshd", 0)), int(attrs.get("y_bshd", 0)), int(attrs.get("qkv_packed", 0)))


def _out_shape(q, Dv: int, attrs) -> tuple[int, ...]:
    y = tuple(int(s) for s in q[:-1]) + (Dv,)
    return swap_heads(y) if attrs.get("y_bshd", 0) else y


def _arrays(p: AttnPlan, inputs, outputs, what: str):
    ins = list(inputs) + [None] * (4 - len(inputs))
    Q, K, V, M = ins[:4]
    Y = outputs[0]
    if p.packed:  # one [B, S, 3, H, D] tensor: K and V start H * D and 2 * H * D elements after Q
        n = 3 * p.Z * p.Sq * p.D
        if Q is None or str(Q.dtype) != p.dtype or not Q.flags.c_contiguous or int(Q.size) != n:
            raise TuningError(f"{what}: packed Q, K, V must be a C-contiguous {p.dtype} array of {n} elements, "
                              f"got {None if Q is None else (Q.dtype, Q.shape)}")
        flat = Q.reshape(-1)
        Q, K, V = flat, flat[p.H * p.D:], flat[2 * p.H * p.D:]  # views: the kernels read 3 * H * D apart
        ins_sizes = (("Y", Y, p.Z * p.Sq * p.Dv),)
    else:
        ins_sizes = (("Q", Q, p.Z * p.Sq * p.D), ("K", K, p.Z * p.Skv * p.D), ("V", V, p.Z * p.Skv * p.Dv),
                     ("Y", Y, p.Z * p.Sq * p.Dv))
    for name, a, n in ins_sizes:
        if a is None or str(a.dtype) != p.dtype or not a.flags.c_contiguous or int(a.size) != n:
            raise TuningError(f"{what}: {name} must be a C-contiguous {p.dtype} array of {n} elements, "
                              f"got {None if a is None else (a.dtype, a.shape)}")
    if p.mask:
        want = p.dtype if p.mask == 1 else "bool"
        n = int(np.prod(p.mask_shape))
        if M is None or str(M.dtype) != want or not M.flags.c_contiguous or int(M.size) != n:
            raise TuningError(f"{what}: the mask must be a C-contiguous {want} array of {n} elements")
    return Q, K, V, (M if p.mask else None), Y


def _mask_args(p: AttnPlan, M):
    sb, sh, si, sj = p.mask_strides
    return (ptr(M), np.int64(sb), np.int64(sh), np.int64(si), np.int64(sj), np.float32(p.mask_value),
            np.int32(p.causal))


def score_gemm(p: AttnPlan) -> dict:
    """``blas.gemm`` arguments of ``S[z] = scale * Q[z] . K^T[z]`` ([Sq][Skv] per (b, h))."""
    return dict(M=p.Sq, N=p.Skv, K=p.D, trans_b=not p.kt, batch=p.Z, stride_a=p.Sq * p.D, stride_b=p.Skv * p.D,
                stride_c=p.Sq * p.Skv, alpha=p.scale)


def value_gemm(p: AttnPlan) -> dict:
    """``blas.gemm`` arguments of ``Y[z] = P[z] . V[z]``."""
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


def score_gemm_ptrs(p: AttnPlan) -> dict:
    """``blas.bound_gemm_batched`` arguments of ``S[z] = scale * Q[z] . K^T[z]`` over [B, S, H, D] operands."""
    rq, rk, _, _ = row_strides(p)
    return dict(M=p.Sq, N=p.Skv, K=p.D, lda=rq, ldb=rk, ldc=p.Skv, batch=p.Z, trans_b=True, alpha=p.scale)


def value_gemm_ptrs(p: AttnPlan) -> dict:
    """``blas.bound_gemm_batched`` arguments of ``Y[z] = P[z] . V[z]`` over [B, S, H, D] operands."""
    _, _, rv, ry = row_strides(p)
    return dict(M=p.Sq, N=p.Dv, K=p.Skv, lda=p.Skv, ldb=rv, ldc=ry, batch=p.Z)


class _AttentionKernels:
    """What the attention families share: their kernels live in ``attention.cu``, one template
    instance per signature (``_instance``), and ``build`` starts the same way (``_prologue``)."""

    def _instance(self, sig: Signature) -> str:
        raise NotImplementedError

    def source_hash(self) -> str:
        return source_hash("attention.cu")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        return [("attention.cu", self._instance(sig))]

    def _prologue(self, sig: Signature):
        """(the plan, the compiled kernel); ``TuningError`` when the candidate does not apply."""
        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        return attention_plan(sig), get_kernel("attention.cu", self._instance(sig))


def softmax_configs(dtype: str) -> list[tuple[tuple[str, Any], ...]]:
    """The in-place softmax kernel's configurations (``cublas_softmax``'s params): a row per CTA of
    ``warps`` warps (``attn_softmax``), or ``lanes`` lanes a row and 256 / lanes rows a CTA
    (``attn_softmax_rows``, for short rows); ``vec`` scores per load (16 bytes; absent: 1)."""
    vecs = sorted({VEC16[dtype]} if dtype in VEC16 else set(), reverse=True)
    out: list[tuple[tuple[str, Any], ...]] = [(("warps", w),) for w in SOFTMAX_WARPS]
    out += [(("warps", w), ("vec", v)) for v in vecs for w in SOFTMAX_WARPS]
    out += [(("lanes", n),) + ((("vec", v),) if v > 1 else ()) for v in vecs + [1] for n in SOFTMAX_LANES]
    return out


def softmax_reason(params: dict, dtype: str, skv: int) -> str | None:
    """Why the softmax configuration ``params`` does not take rows of ``skv`` scores (None: it does)."""
    vec = int(params.get("vec", 1))
    if vec > 1 and vec != VEC16.get(dtype):
        return f"vec={vec} is not a 16-byte load of {dtype}"
    if skv % vec:
        return f"{skv} keys are not a multiple of vec={vec}"
    loads = skv // vec
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
    if "lanes" in params:  # the kernel keeps a lane's loads in registers: at most SOFTMAX_LANES_MAX_LOADS
        return instance("attn_softmax_rows", dtype, int(params["lanes"]), mask, vec, SOFTMAX_LANES_MAX_LOADS)
    return instance("attn_softmax", dtype, int(params["warps"]), mask, vec)


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
        extra = [("attention.cu", instance("attn_batch_ptrs", p.dtype))] if p.layout_flags else []
        return [("attention.cu", self._instance(sig))] + extra

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        import cupy

        p, kern = self._prologue(sig)
        rows = p.Z * p.Sq
        grid, block = softmax_grid(rows, dict(self.params))
        # The scores buffer is allocated once, at build time, so a captured CUDA graph reuses it.
        scores = cupy.empty(p.Z * p.Sq * p.Skv, dtype=p.dtype)

        def softmax(M):
            kern(grid, block, (scores, np.int64(rows), np.int32(p.Sq), np.int32(p.Skv), np.int32(p.H))
                 + _mask_args(p, M) + (np.int32(p.nan_to_zero),))

        if not p.layout_flags:
            s_gemm, y_gemm = score_gemm(p), value_gemm(p)

            def launch(inputs, outputs):
                Q, K, V, M, Y = _arrays(p, inputs, outputs, self.key())
                blas.gemm(Q, K, scores, **s_gemm)
                softmax(M)
                blas.gemm(scores, V, Y, **y_gemm)

            return launch

        # [B, S, H, D] operands: pointer-array batched GEMMs (one stride per batch cannot reach the
        # heads), their Q / K / V / Y pointers written on the stream by attn_batch_ptrs before each call
        s_gemm = blas.bound_gemm_batched(p.dtype, **score_gemm_ptrs(p))
        y_gemm = blas.bound_gemm_batched(p.dtype, **value_gemm_ptrs(p))
        offsets = cupy.asarray(batch_offsets(p).reshape(-1))
        ptrs = cupy.empty(4 * p.Z, dtype=cupy.uint64)  # Q, K, V, Y pointers, Z each
        s_ptrs = cupy.asarray(scores.data.ptr + np.arange(p.Z, dtype=np.uint64) * np.uint64(p.Sq * p.Skv * scores.itemsize))
        fill = get_kernel("attention.cu", instance("attn_batch_ptrs", p.dtype))
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


def flash_smem_bytes(dmax: int, bm: int) -> int:
    return 4 * (bm * dmax + KEY_TILE * (dmax + 1) + KEY_TILE * dmax)


@dataclass(frozen=True)
class FlashAttention(_AttentionKernels, Candidate):
    """One fused kernel, online softmax over key tiles in shared memory; params dmax, bm, warps."""

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

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
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
    out = [("attention.cu", instance("attn_batch_ptrs", dt)) for dt in SUPPORTED_DTYPES]
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

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
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
