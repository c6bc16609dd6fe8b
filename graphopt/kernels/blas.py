"""cuBLAS through its own handle (ctypes), for GEMMs that must be CUDA-graph capturable.

Why by hand: CuPy refuses every cuBLAS call while a stream is being captured (``cupy.matmul`` and
``cupy_backends.cuda.libs.cublas`` alike raise ``NotImplementedError``), but cuBLAS itself captures
fine when it is given a stream and a workspace of its own (measured on the H200, see
../shared/design.md). No maintained Python package exposes that; this module is the few calls it
takes: one handle per device, ``cublasSetStream_v2`` / ``cublasSetWorkspace_v2`` before each call,
and ``cublasGemmStridedBatchedEx`` (``cublasGemmBatchedEx`` for matrices at arbitrary places) with fp32
accumulation.

Arrays are row-major (C order); :func:`gemm` maps them onto cuBLAS's column-major convention by
computing ``C^T = op(B)^T op(A)^T``. :func:`matmul` is ``numpy.matmul`` on top of it (batch
broadcasting through stride 0; the shape arithmetic, :func:`gemm_args`, is tested on the CPU); the
runtime (graphopt.runtime) runs every MatMul/Gemm through it so that whole models capture.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from dataclasses import dataclass

from graphopt.errors import TuningError

VERSION = "1"  # part of the candidates' source hash: bump when the call sequence changes

_CUDA_R_16F, _CUDA_R_32F = 2, 0
_COMPUTE_32F = 68
_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1
_WORKSPACE_BYTES = 32 << 20

_lock = threading.Lock()
# The argument types of every libcublas function this module calls, declared before the first call:
# ctypes passes an undeclared Python int as a 32-bit C int, silently dropping the upper half of a host
# pointer (cublasGemmBatchedEx went undeclared until 2026-12-06: alpha's address truncated, a segfault in
# libcublas on BERT fp32 once the heap had grown, or a wrong scale read from whatever lay there).
_P, _I, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
SIGNATURES: dict[str, list] = {
    "cublasCreate_v2": [ctypes.POINTER(ctypes.c_void_p)],
    "cublasSetStream_v2": [_P, _P],
    "cublasSetWorkspace_v2": [_P, _P, ctypes.c_size_t],
    # handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta,
    # C, Ctype, ldc, strideC, batchCount, computeType, algo
    "cublasGemmStridedBatchedEx": [_P, _I, _I, _I, _I, _I, _P, _P, _I, _I, _I64, _P, _I, _I, _I64,
                                   _P, _P, _I, _I, _I64, _I, _I, _I],
    # handle, transa, transb, m, n, k, alpha, Aarray, Atype, lda, Barray, Btype, ldb, beta,
    # Carray, Ctype, ldc, batchCount, computeType, algo
    "cublasGemmBatchedEx": [_P, _I, _I, _I, _I, _I, _P, _P, _I, _I, _P, _I, _I, _P, _P, _I, _I, _I, _I, _I],
}
_lib = None
_handles: dict[int, tuple[ctypes.c_void_p, object]] = {}


def library_candidates(stem: str, sonames: tuple[str, ...]) -> list[str]:
    """Where to look for a CUDA math library ``stem`` (``libcublas``, ``libcublasLt``): its sonames
    first (dlopen finds the copy already loaded), then the ``nvidia`` pip packages' ``lib`` folders,
    then ``$CUDA_PATH/lib64``. The one place both cuBLAS and cuBLASLt are found."""
    paths = []
    try:
        import nvidia  # the pip CUDA packages' namespace

        for base in getattr(nvidia, "__path__", []):
            paths += sorted(glob.glob(os.path.join(base, "*", "lib", stem + ".so*")))
            paths += sorted(glob.glob(os.path.join(base, "cu*", "lib", stem + ".so*")))
    except ImportError:
        pass
    cuda = os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    paths += sorted(glob.glob(os.path.join(cuda, "lib64", stem + ".so*")))
    # libcublas.so* also matches nothing else; libcublasLt.so* is a different library
    return list(sonames) + [p for p in paths if os.path.basename(p).startswith(stem + ".so")]


def _candidates() -> list[str]:
    return library_candidates("libcublas", ("libcublas.so.13", "libcublas.so.12", "libcublas.so"))


def library():
    """The loaded libcublas (the one CuPy already loaded when there is one)."""
    global _lib
    if _lib is None:
        try:  # make CuPy load its libcublas first, so dlopen by soname finds the same copy
            import cupy_backends.cuda.libs.cublas  # noqa: F401
        except Exception:
            pass
        errors = []
        for name in _candidates():
            try:
                lib = ctypes.CDLL(name)
                for fn, args in SIGNATURES.items():  # every function called, declared before any call
                    getattr(lib, fn).argtypes = args  # (an AttributeError: a symbol missing)
                    getattr(lib, fn).restype = ctypes.c_int
                _lib = lib
                break
            except (OSError, AttributeError) as exc:
                errors.append(f"{name}: {exc}")
        if _lib is None:
            raise TuningError("cuBLAS library not found (install the nvidia-cublas pip package or set CUDA_PATH): "
                              + "; ".join(errors[:3]))
    return _lib


def _handle():
    """(handle, workspace) of the current device; created once per device."""
    import cupy

    dev = cupy.cuda.Device().id
    with _lock:
        h = _handles.get(dev)
        if h is None:
            lib = library()
            handle = ctypes.c_void_p()
            st = lib.cublasCreate_v2(ctypes.byref(handle))
            if st != 0:
                raise TuningError(f"cublasCreate failed with status {st}")
            ws = cupy.empty(_WORKSPACE_BYTES, dtype=cupy.uint8)
            h = _handles[dev] = (handle, ws)
    return h


def gemm(a, b, c, M: int, N: int, K: int, *, trans_a: bool = False, trans_b: bool = False,
         batch: int = 1, stride_a: int = 0, stride_b: int = 0, stride_c: int = 0, alpha: float = 1.0,
         a_offset: int = 0, b_offset: int = 0, c_offset: int = 0) -> None:
    """``C[z] = alpha * op(A[z]) . op(B[z])`` on the current CuPy stream, row-major operands.

    ``a``, ``b``, ``c`` are CuPy arrays of one dtype (float16 or float32), C-contiguous; A is
    [M][K] ([K][M] with ``trans_a``), B is [K][N] ([N][K] with ``trans_b``), C is [M][N]; strides
    and offsets are in elements (stride 0: shared by every batch). fp32 accumulation; fp32 inputs
    are computed in true fp32 (no TF32).
    """
    dt = str(c.dtype)
    if dt not in ("float16", "float32") or str(a.dtype) != dt or str(b.dtype) != dt:
        raise TuningError(f"cuBLAS gemm: dtypes {a.dtype}, {b.dtype}, {c.dtype} (one of float16 / float32 needed)")
    bound_gemm(dt, M, N, K, trans_a=trans_a, trans_b=trans_b, batch=batch, stride_a=stride_a, stride_b=stride_b,
               stride_c=stride_c, alpha=alpha, a_offset=a_offset, b_offset=b_offset, c_offset=c_offset)(a, b, c)


def _bound_call(dtype: str, alpha: float):
    """What every bound call shares: (the library, the handle, the cuBLAS data type, alpha and beta as
    fp32 host scalars (cuBLAS reads them at each call: the caller keeps the arrays alive), ``bind()``:
    the handle on the current CuPy stream with graphopt's workspace)."""
    import cupy
    import numpy as np

    lib = library()
    handle, ws = _handle()
    ctype = _CUDA_R_16F if dtype == "float16" else _CUDA_R_32F
    scalars = (np.array([alpha], dtype=np.float32), np.array([0.0], dtype=np.float32))
    set_stream, set_ws = lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2
    ws_p, ws_n = ctypes.c_void_p(ws.data.ptr), ctypes.c_size_t(ws.nbytes)
    current = cupy.cuda.get_current_stream
    void = ctypes.c_void_p

    def bind() -> None:
        st = set_stream(handle, void(current().ptr))
        if st == 0:
            st = set_ws(handle, ws_p, ws_n)
        if st != 0:
            raise TuningError(f"cuBLAS stream/workspace setup failed with status {st}")

    return lib, handle, ctype, scalars, bind


def bound_gemm(dtype: str, M: int, N: int, K: int, *, trans_a: bool = False, trans_b: bool = False,
               batch: int = 1, stride_a: int = 0, stride_b: int = 0, stride_c: int = 0, alpha: float = 1.0,
               a_offset: int = 0, b_offset: int = 0, c_offset: int = 0):
    """:func:`gemm` with every argument but the three pointers prepared once: ``run(a, b, c)``.

    The runtime's compiled plans bind each MatMul / Gemm step once and call ``run`` per run (the
    arrays must have the dtype and shapes given here; nothing is checked per call)."""
    lib, handle, ctype, scalars, bind = _bound_call(dtype, alpha)
    esz = 2 if dtype == "float16" else 4
    al_p, be_p = scalars[0].ctypes.data, scalars[1].ctypes.data
    # Column-major view: C^T (N x M) = op_x(X) (N x K) . op_y(Y) (K x M), X from B, Y from A.
    opx, ldx = (_OP_T, K) if trans_b else (_OP_N, N)
    opy, ldy = (_OP_T, M) if trans_a else (_OP_N, K)
    ao, bo, co = a_offset * esz, b_offset * esz, c_offset * esz
    call = lib.cublasGemmStridedBatchedEx
    void = ctypes.c_void_p

    def run(a, b, c) -> None:
        bind()
        st = call(handle, opx, opy, N, M, K, al_p, void(b.data.ptr + bo), ctype, ldx, stride_b,
                  void(a.data.ptr + ao), ctype, ldy, stride_a, be_p, void(c.data.ptr + co), ctype, N, stride_c,
                  batch, _COMPUTE_32F, _GEMM_DEFAULT)
        if st != 0:
            raise TuningError(f"cublasGemmStridedBatchedEx failed with status {st} (M={M} N={N} K={K} batch={batch})")

    run.keep = scalars  # the scalars cuBLAS reads live as long as the function
    return run


def bound_gemm_batched(dtype: str, M: int, N: int, K: int, *, lda: int, ldb: int, ldc: int, batch: int,
                       trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0):
    """``C[z] = alpha * op(A[z]) . op(B[z])`` for ``batch`` matrices anywhere in memory:
    ``run(a_ptrs, b_ptrs, c_ptrs)`` takes the device addresses of three device arrays of ``batch``
    pointers each (``cublasGemmBatchedEx``). Row-major like :func:`bound_gemm`, with each operand's
    row stride in elements (``lda``: of A as stored, [M][K] or [K][M] with ``trans_a``), so that a
    head's rows of a [B, S, H, D] tensor (``H * D`` apart) are read in place."""
    lib, handle, ctype, scalars, bind = _bound_call(dtype, alpha)
    al_p, be_p = scalars[0].ctypes.data, scalars[1].ctypes.data
    # Column-major view as in bound_gemm, X from B, Y from A; a row-major operand's row stride is its
    # column-major leading dimension.
    opx, opy = (_OP_T if trans_b else _OP_N), (_OP_T if trans_a else _OP_N)
    call = lib.cublasGemmBatchedEx
    void = ctypes.c_void_p

    def run(a_ptrs: int, b_ptrs: int, c_ptrs: int) -> None:
        bind()
        st = call(handle, opx, opy, N, M, K, al_p, void(b_ptrs), ctype, ldb, void(a_ptrs), ctype, lda, be_p,
                  void(c_ptrs), ctype, ldc, batch, _COMPUTE_32F, _GEMM_DEFAULT)
        if st != 0:
            raise TuningError(f"cublasGemmBatchedEx failed with status {st} (M={M} N={N} K={K} batch={batch})")

    run.keep = scalars
    return run


@dataclass(frozen=True)
class GemmArgs:
    """The strided batched GEMM computing row-major ``Y[z] = A[z] @ B[z]`` (``numpy.matmul``)."""

    out_shape: tuple[int, ...]
    M: int
    N: int
    K: int
    stride_a: int  # elements; 0: one matrix shared by every batch
    stride_b: int
    stride_c: int
    batch: int
    broadcast_a: tuple[int, ...] | None  # materialise A to this shape first (a partial batch broadcast)
    broadcast_b: tuple[int, ...] | None


def gemm_args(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> GemmArgs:
    """The :func:`gemm` call for ``numpy.matmul`` of C-contiguous operands of these shapes."""
    import numpy as np

    if len(a_shape) == 0 or len(b_shape) == 0:
        raise ValueError("matmul operands must be at least 1-D")
    a2 = (1,) + tuple(a_shape) if len(a_shape) == 1 else tuple(a_shape)
    b2 = tuple(b_shape) + (1,) if len(b_shape) == 1 else tuple(b_shape)
    M, K = a2[-2:]
    K2, N = b2[-2:]
    if K != K2:
        raise ValueError(f"matmul inner dimensions differ: {tuple(a_shape)} and {tuple(b_shape)}")
    ab, bb = a2[:-2], b2[:-2]
    out_b = tuple(np.broadcast_shapes(ab, bb))
    Z = int(np.prod(out_b, dtype=np.int64)) if out_b else 1
    za = int(np.prod(ab, dtype=np.int64)) if ab else 1
    zb = int(np.prod(bb, dtype=np.int64)) if bb else 1
    bc_a = bc_b = None
    if za == 1:
        sa = 0
    elif tuple(ab) == out_b:
        sa = M * K
    else:
        bc_a, sa = out_b + (M, K), M * K
    if zb == 1:
        sb = 0
    elif tuple(bb) == out_b:
        sb = K * N
    else:
        bc_b, sb = out_b + (K, N), K * N
    out = out_b + ((M,) if len(a_shape) > 1 else ()) + ((N,) if len(b_shape) > 1 else ())
    return GemmArgs(tuple(out), M, N, K, sa, sb, M * N, Z, bc_a, bc_b)


def matmul(a, b):
    """``numpy.matmul`` of two float16 / float32 CuPy arrays on the current stream (capture-safe)."""
    import cupy

    g = gemm_args(tuple(a.shape), tuple(b.shape))
    if g.broadcast_a is not None:
        a = cupy.broadcast_to(a.reshape(a.shape if a.ndim > 1 else (1,) + a.shape), g.broadcast_a)
    if g.broadcast_b is not None:
        b = cupy.broadcast_to(b.reshape(b.shape if b.ndim > 1 else b.shape + (1,)), g.broadcast_b)
    a = cupy.ascontiguousarray(a)
    b = cupy.ascontiguousarray(b)
    y = cupy.empty(g.out_shape, dtype=a.dtype)
    if y.size == 0:
        return y
    if g.K == 0:
        y.fill(0)
        return y
    gemm(a, b, y, g.M, g.N, g.K, batch=g.batch, stride_a=g.stride_a, stride_b=g.stride_b, stride_c=g.stride_c)
    return y


def self_test() -> str | None:
    """None when a few GEMMs (2-D, batched, broadcast, 1-D, fp16) match ``cupy.matmul``, else what failed.

    Run eagerly (never during a capture) before a caller relies on :func:`matmul`.
    """
    import cupy
    import numpy as np

    rng = np.random.default_rng(0)
    cases = [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((4, 1, 5, 6), (3, 6, 2)), ((7,), (7, 4)), ((3, 7), (7,))]
    try:
        for dt in (np.float32, np.float16):
            for sa, sb in cases:
                a = cupy.asarray(rng.standard_normal(sa).astype(dt))
                b = cupy.asarray(rng.standard_normal(sb).astype(dt))
                got = matmul(a, b)
                want = cupy.matmul(a.astype(np.float32), b.astype(np.float32))
                cupy.cuda.get_current_stream().synchronize()
                err = float(cupy.abs(got.astype(np.float32) - want).max())
                tol = (1e-2 if dt == np.float16 else 1e-4) * (1 + float(cupy.abs(want).max()))
                if got.shape != want.shape or not err <= tol:
                    return f"matmul {sa} x {sb} {np.dtype(dt).name}: shape {got.shape}, max error {err:.3g}"
    except Exception as e:  # noqa: BLE001 - any failure means: do not use this path
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None
