"""GemmAct lowering candidates: y = act(alpha * A.B + beta * C), MatMul (numpy batched) or Gemm mode.

- ``cublas``   : ``cupy.matmul`` (cuBLAS) then one fused in-place epilogue kernel;
- ``mma_gemm`` : the tiled tensor-core GEMM of ``mma_gemm.cu`` with the epilogue fused.

``launch(inputs, outputs)`` takes ``inputs = [A, B, C or None]`` and ``outputs = [Y]``
(C-contiguous, the numpy result shape).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import blas
from graphopt.kernels import geometry as geo
from graphopt.lowering.contract import Candidate, Lowering, Signature
from graphopt.kernels.mma_args import mma_args, ptr
from graphopt.kernels.mma_tiles import VEC, TiledMmaParams, mma_family
from graphopt.kernels.source import VEC16, get_kernel, instance, source_hash

SUPPORTED_DTYPES = ("float16", "float32")


@dataclass(frozen=True)
class GemmPlan:
    """A GemmAct signature as one (possibly batched) GEMM: Y[z] = A[z] (M x K) . B[z] (K x N)."""

    out_shape: tuple[int, ...]
    Z: int
    M: int
    N: int
    K: int
    a_batch: int  # elements between batches of A (0: shared)
    b_batch: int
    trans_a: bool
    trans_b: bool
    broadcast_a: bool  # A must be materialised to the output batch first
    broadcast_b: bool
    fold: bool  # batch folded into M (B shared, bias independent of the row)
    bias: tuple[int, int, int] | None  # (sb, sr, sc) over the unfolded (Z, M, N) view
    bias_full: bool  # C must be materialised to (Z, M, N) first
    alpha: float
    beta: float
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]


def gemm_plan(sig: Signature) -> GemmPlan:
    if sig.op != "GemmAct":
        raise TuningError(f"op {sig.op} is not GemmAct")
    ash, bsh = sig.input_shapes[0], sig.input_shapes[1]
    csh = sig.input_shapes[2] if len(sig.input_shapes) > 2 else None
    if ash is None or bsh is None:
        raise TuningError("GemmAct needs A and B shapes")
    mode = sig.attr("mode", "matmul")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode == "gemm":
        if len(ash) != 2 or len(bsh) != 2:
            raise TuningError(f"GemmAct mode=gemm needs 2-D A and B, got {ash} and {bsh}")
        ta, tb = bool(sig.attr("transA", 0)), bool(sig.attr("transB", 0))
        M, K = (ash[1], ash[0]) if ta else ash
        K2, N = (bsh[1], bsh[0]) if tb else bsh
        if K != K2:
            raise TuningError(f"GemmAct inner dims differ: A {ash} B {bsh} transA={int(ta)} transB={int(tb)}")
        out_b: tuple[int, ...] = ()
        a_b, b_b = (), ()
        alpha, beta = float(sig.attr("alpha", 1.0)), float(sig.attr("beta", 1.0))
        out_shape = (M, N)
    elif mode == "matmul":
        ta = tb = False
        a2 = (1,) + tuple(ash) if len(ash) == 1 else tuple(ash)
        b2 = tuple(bsh) + (1,) if len(bsh) == 1 else tuple(bsh)
        M, K = a2[-2:]
        K2, N = b2[-2:]
        if K != K2:
            raise TuningError(f"GemmAct MatMul inner dims differ: A {ash} B {bsh}")
        a_b, b_b = a2[:-2], b2[:-2]
        try:
            out_b = tuple(np.broadcast_shapes(a_b, b_b))
        except ValueError:
            raise TuningError(f"GemmAct MatMul batch dims do not broadcast: A {ash} B {bsh}") from None
        alpha, beta = 1.0, 1.0
        out_shape = out_b + ((M,) if len(ash) > 1 else ()) + ((N,) if len(bsh) > 1 else ())
    else:
        raise TuningError(f"GemmAct mode={mode!r} is not 'matmul' or 'gemm'")
    Z = int(np.prod(out_b)) if out_b else 1
    za, zb_ = (int(np.prod(a_b)) if a_b else 1), (int(np.prod(b_b)) if b_b else 1)
    # An operand is either shared by every batch (stride 0), laid out exactly as the output batch,
    # or it is materialised to the output batch first (rare partial broadcasts).
    broadcast_a = za != 1 and tuple(a_b) != out_b
    broadcast_b = zb_ != 1 and tuple(b_b) != out_b
    a_batch = 0 if (za == 1 and Z > 1) else M * K
    b_batch = 0 if (zb_ == 1 and Z > 1) else K * N
    bias = None
    bias_full = False
    if csh is not None:
        st = geo.broadcast_strides(csh, out_b + (M, N))
        if st is None:
            raise TuningError(f"GemmAct bias shape {tuple(csh)} does not broadcast to {out_b + (M, N)}")
        bst, sr, sc = st[:-2], st[-2], st[-1]
        if all(s == 0 for s in bst):
            sb = 0
        else:
            contiguous = all(bst[i] == bst[i + 1] * out_b[i + 1] for i in range(len(bst) - 1)) and bst[-1] == M * N
            sb = M * N if contiguous and sr == N and sc == 1 else -1
        if sb < 0:
            bias_full, bias = True, (M * N, N, 1)
        else:
            bias = (sb, sr, sc)
    fold = Z > 1 and b_batch == 0 and a_batch == M * K and not broadcast_a and (bias is None or (bias[0] == 0 and bias[1] == 0))
    if max(Z * M * K, Z * K * N, Z * M * N) > geo.INT32_MAX:
        raise TuningError("GemmAct tensors over 2**31 elements are not supported by the kernels")
    return GemmPlan(tuple(out_shape), Z, M, N, K, a_batch, b_batch, ta, tb, broadcast_a, broadcast_b, fold,
                    bias, bias_full, alpha, beta, tuple(ash), tuple(bsh))


def _check(sig: Signature) -> str | None:
    p, reason = geo.plan_or_reason(sig, gemm_plan, SUPPORTED_DTYPES)
    if reason:
        return reason
    if min(p.M, p.N, p.K) < 1:
        return "empty GEMM"
    return None


def _vector_epilogue(p: GemmPlan, dt: str) -> bool:
    """Whether ``epilogue_gemm_vec`` takes this GEMM's epilogue: a bias of one row of N values (or
    none), N a multiple of the 16-byte vector (``gemm_plan`` already bounds the output below 2**31)."""
    return (p.bias is None or (p.bias[0] == 0 and p.bias[1] == 0 and p.bias[2] == 1)) and p.N % VEC16[dt] == 0


# 16-byte vectors a thread of ``epilogue_gemm_vec`` loads before it computes any (its LOADS). 1: the
# measured form; 2 is timed beside it in bench/transformer_kernels.py (48 registers against 32, so 5 CTAs
# an SM instead of 8, for 40 KB in flight an SM against 32) and launched by no lowering until it wins.
VECTOR_EPILOGUE_LOADS = 1


def vector_epilogue_kernel(dt: str, loads: int = VECTOR_EPILOGUE_LOADS) -> tuple[str, str]:
    """(source, instance) of the 16-byte vector epilogue kernel for ``dt``: its one home, for the
    launchers and for every candidate's prebuild list."""
    return ("elementwise.cu", instance("epilogue_gemm_vec", dt, VEC16[dt], loads))


def vector_epilogue_grid(dt: str, total: int, loads: int = VECTOR_EPILOGUE_LOADS) -> tuple[int]:
    """The grid of ``epilogue_gemm_vec`` over ``total`` elements: a thread per ``loads`` vectors, at most
    32 CTAs of 256 an SM of a 132-SM GPU (the rest by the grid-stride loop)."""
    return (max(1, min(-(-(total // VEC16[dt]) // (256 * loads)), 132 * 32)),)


def vector_epilogue_launcher(dt: str, total: int, n: int, act, loads: int = VECTOR_EPILOGUE_LOADS):
    """``run(y, c, alpha, beta)``: ``y = act(alpha * y + beta * c)`` in place (``c``: one row of ``n``
    values, or None for ``act(alpha * y)``) over ``total`` elements, 16 bytes per load
    (``epilogue_gemm_vec``; the caller checks alignment and that ``n`` is whole vectors)."""
    kern = get_kernel(*vector_epilogue_kernel(dt, loads))
    grid = vector_epilogue_grid(dt, total, loads)
    i32, f32 = np.int32, np.float32
    head = (i32(total), i32(n))
    tail = (i32(act.code), f32(act.alpha), f32(act.beta), f32(act.lo), f32(act.hi))

    def run(y, c, alpha: float, beta: float) -> None:
        kern(grid, (256,), (y, ptr(c)) + head + (f32(alpha), f32(beta)) + tail)

    return run


def epilogue_launcher(dt: str, total: int, m: int, n: int, act, bias_strides: tuple = (0, 0, 1), vector: bool = True,
                      arch: str | None = None):
    """``run(y, c, alpha, beta)``: ``y = act(alpha * y + beta * c)`` in place over ``y`` as [batch][m][n]
    (``total`` elements), ``c`` addressed through ``bias_strides`` (batch, row, column; or None for no
    bias). The 16-byte vector kernel where ``vector`` (the caller's promise: ``c`` is one row of ``n``
    values or absent, ``n`` whole vectors) and both pointers are 16-byte aligned at the call, else the
    strided scalar kernel (``epilogue_gemm``)."""
    scalar = get_kernel("elementwise.cu", instance("epilogue_gemm", dt), arch)
    vec_run = vector_epilogue_launcher(dt, total, n, act) if vector else None
    grid = (min(-(-total // 256), 132 * 32),)
    i32, i64, f32 = np.int32, np.int64, np.float32
    head = (i64(total), i32(m), i32(n), i64(bias_strides[0]), i32(bias_strides[1]), i32(bias_strides[2]))
    tail = (i32(act.code), f32(act.alpha), f32(act.beta), f32(act.lo), f32(act.hi))

    def run(y, c, alpha: float, beta: float) -> None:
        if vec_run is not None and y.data.ptr % 16 == 0 and (c is None or c.data.ptr % 16 == 0):
            vec_run(y, c, alpha, beta)
        else:
            scalar(grid, (256,), (y, ptr(c)) + head + (f32(alpha), f32(beta)) + tail)

    return run


def _bias_array(C, p: GemmPlan):
    import cupy

    if C is None:
        return None
    if p.bias_full:
        out_b = p.out_shape[:-2] if len(p.out_shape) >= 2 else ()
        return cupy.ascontiguousarray(cupy.broadcast_to(C, tuple(out_b) + (p.M, p.N)))
    return cupy.ascontiguousarray(C)


def _check_out(outputs, p: GemmPlan, dt: str):
    y = outputs[0]
    if tuple(y.shape) != p.out_shape or str(y.dtype) != dt or not y.flags.c_contiguous:
        raise TuningError(f"GemmAct output must be a C-contiguous {dt} array of shape {p.out_shape}, got {y.dtype} {y.shape}")
    return y


@dataclass(frozen=True)
class CublasGemm(Candidate):
    """cuBLAS (fp32 accumulation) followed by one in-place epilogue kernel: ``cublas`` calls it
    through ``cupy.matmul``; ``cublas_ws`` through graphopt's own handle with a workspace
    (graphopt.kernels.blas), which CUDA-graph capture accepts."""

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        return _check(sig)

    def source_hash(self) -> str:
        return source_hash("elementwise.cu") + (f"+blas{blas.VERSION}" if self.name == "cublas_ws" else "")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        dt = geo.dtype_of(sig)
        out = [("elementwise.cu", instance("epilogue_gemm", dt))]
        if _check(sig) is None and _vector_epilogue(gemm_plan(sig), dt):
            out.append(vector_epilogue_kernel(dt))
        return out

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        import cupy

        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        p = gemm_plan(sig)
        dt = geo.dtype_of(sig)
        act = geo.act_args(sig)
        # the vector epilogue where the bias is one row of N values (or absent) and rows are 16-byte
        # multiples; each launch still checks the pointers' alignment and else takes the scalar one
        epilogue = epilogue_launcher(dt, p.Z * p.M * p.N, p.M, p.N, act, p.bias or (0, 0, 0), _vector_epilogue(p, dt))
        needs_epi = p.bias is not None or act.code != 0 or p.alpha != 1.0

        own = self.name == "cublas_ws"
        out_b = tuple(p.out_shape[:-2]) if len(p.out_shape) >= 2 else ()

        def launch(inputs, outputs):
            A, B, C = (list(inputs) + [None])[:3]
            y = _check_out(outputs, p, dt)
            if own:
                a, b = cupy.ascontiguousarray(A), cupy.ascontiguousarray(B)
                if p.fold:  # B shared by every batch: one 2-D GEMM instead of a batched one
                    blas.gemm(a, b, y, p.Z * p.M, p.N, p.K)
                else:
                    sa, sb_ = p.a_batch, p.b_batch
                    if p.broadcast_a:
                        a, sa = cupy.ascontiguousarray(cupy.broadcast_to(a, out_b + (p.M, p.K))), p.M * p.K
                    if p.broadcast_b:
                        b, sb_ = cupy.ascontiguousarray(cupy.broadcast_to(b, out_b + (p.K, p.N))), p.K * p.N
                    blas.gemm(a, b, y, p.M, p.N, p.K, trans_a=p.trans_a, trans_b=p.trans_b,
                              batch=p.Z, stride_a=sa, stride_b=sb_, stride_c=p.M * p.N)
            else:
                a = A.T if p.trans_a else A
                b = B.T if p.trans_b else B
                if p.fold:  # B shared by every batch: one 2-D GEMM instead of a batched one
                    cupy.matmul(a.reshape(p.Z * p.M, p.K), b, out=y.reshape(p.Z * p.M, p.N))
                else:
                    cupy.matmul(a, b, out=y)
            if not needs_epi:
                return
            epilogue(y, _bias_array(C, p), p.alpha, p.beta)

        # cupy.matmul refuses stream capture; the runtime's own cuBLAS handle does not
        return Lowering(launch=lambda ins, outs, ws: launch(ins, outs), capturable=own)


@dataclass(frozen=True)
class MmaGemm(TiledMmaParams, Candidate):
    """Tiled tensor-core GEMM (mma.sync fp16 / tf32) with bias, alpha/beta and activation fused."""
    ordinary_launch = True  # its launch is one own kernel (Candidate.ordinary_launch)

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        reason = _check(sig)
        if reason:
            return reason
        if tuple(compute_capability) < (8, 0):
            return "mma.sync fp16/tf32 needs sm_80+"
        bm, bn, bk, wm, wn, sk = self._cfg()
        p = gemm_plan(sig)
        bad = self._config_error(geo.dtype_of(sig), 1 if p.trans_b else 0, vec_ok=all(self._vec_flags(sig)))
        if bad:
            return bad
        Mf = p.M * p.Z if p.fold else p.M
        Zf = 1 if p.fold else p.Z
        bad = self._split_error(-(-p.N // bn) * -(-Mf // bm) * Zf, -(-p.K // bk))
        if bad:
            return bad
        if Zf * sk > 65535:
            return "batch x split over the grid's z limit"
        return None

    def source_hash(self) -> str:
        return source_hash("mma_gemm.cu")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        return [("mma_gemm.cu", self._mma_instance(geo.dtype_of(sig), self._mode(sig)))]

    @staticmethod
    def _mode(sig: Signature) -> int:
        return 1 if gemm_plan(sig).trans_b else 0

    def _vec_flags(self, sig: Signature) -> tuple[int, int]:
        """16-byte loads for A rows / B rows when their lengths keep every row 16-byte aligned."""
        p = gemm_plan(sig)
        v = VEC[geo.dtype_of(sig)]
        return int(p.K % v == 0), int((p.K if p.trans_b else p.N) % v == 0)

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        import cupy

        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        p = gemm_plan(sig)
        dt = geo.dtype_of(sig)
        act = geo.act_args(sig)
        bm, bn, bk, wm, wn, sk = self._cfg()
        mode = self._mode(sig)
        kern, smem = self._mma_kernel(dt, mode)
        Mf = p.M * p.Z if p.fold else p.M
        Zf = 1 if p.fold else p.Z
        grid = (-(-p.N // bn), -(-Mf // bm), Zf * sk)
        ws, counters = self._split_workspace(grid[0] * grid[1] * Zf)
        avec, bvec = self._vec_flags(sig)
        named = dict(M=Mf, N=p.N, K=p.K, splits=sk, act=act, sA=0 if p.fold else p.a_batch, sB=p.b_batch,
                     sY=p.M * p.N, ldb=p.K if mode == 1 else p.N, alpha=p.alpha, beta=p.beta,
                     bias_strides=p.bias or (0, 0, 0), ws=ws, counters=counters)
        out_b = p.out_shape[:-2] if len(p.out_shape) >= 2 else ()

        def launch(inputs, outputs):
            A, B, C = (list(inputs) + [None])[:3]
            y = _check_out(outputs, p, dt)
            a = cupy.ascontiguousarray(A.T) if p.trans_a else A
            if p.broadcast_a:
                a = cupy.ascontiguousarray(cupy.broadcast_to(a, tuple(out_b) + (p.M, p.K)))
            b = B
            if p.broadcast_b:
                b = cupy.ascontiguousarray(cupy.broadcast_to(b, tuple(out_b) + (p.K, p.N)))
            if not a.flags.c_contiguous:
                a = cupy.ascontiguousarray(a)
            if not b.flags.c_contiguous:
                b = cupy.ascontiguousarray(b)
            c = _bias_array(C, p)
            fa, fb = self._launch_flags(bool(avec and a.data.ptr % 16 == 0), bool(bvec and b.data.ptr % 16 == 0))
            kern(grid, (wm * wn * 32,), mma_args(a, b, y, bias=c, avec=fa, bvec=fb, **named), shared_mem=smem)

        return launch


def gemm_act_candidates() -> list[Candidate]:
    out: list[Candidate] = [CublasGemm("cublas", ()), CublasGemm("cublas_ws", ())]
    out += mma_family(MmaGemm, "mma_gemm")
    return out
