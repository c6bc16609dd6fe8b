"""cuBLAS through its own handle (ctypes), for GEMMs that must be CUDA-graph capturable.

Why by hand: CuPy refuses every cuBLAS call while a stream is being captured (``cupy.matmul`` and
``cupy_backends.cuda.libs.cublas`` alike raise ``NotImplementedError``), but cuBLAS itself captures
fine when it is given a stream and a workspace of its own (measured on the H200, see
../shared/design.md). No maintained Python package exposes that; this module is the few calls it
takes: one handle per device, ``cublasSetStream_v2`` / ``cublasSetWorkspace_v2`` before each call,
and ``cublasGemmStridedBatchedEx`` with fp32 accumulation.

Arrays are row-major (C order); :func:`gemm` maps them onto cuBLAS's column-major convention by
computing ``C^T = op(B)^T op(A)^T``.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

from graphopt.errors import TuningError

VERSION = "1"  # part of the candidates' source hash: bump when the call sequence changes

_CUDA_R_16F, _CUDA_R_32F = 2, 0
_COMPUTE_32F = 68
_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1
_WORKSPACE_BYTES = 32 << 20

_lock = threading.Lock()
_lib = None
_handles: dict[int, tuple[ctypes.c_void_p, object]] = {}


def _candidates() -> list[str]:
    names = ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    paths = []
    try:
        import nvidia  # the pip CUDA packages' namespace

        for base in getattr(nvidia, "__path__", []):
            paths += sorted(glob.glob(os.path.join(base, "*", "lib", "libcublas.so*")))
            paths += sorted(glob.glob(os.path.join(base, "cu*", "lib", "libcublas.so*")))
    except ImportError:
        pass
    cuda = os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    paths += sorted(glob.glob(os.path.join(cuda, "lib64", "libcublas.so*")))
    return names + [p for p in paths if "Lt" not in os.path.basename(p)]


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
                lib.cublasGemmStridedBatchedEx  # noqa: B018 (the symbol must exist)
                _lib = lib
                break
            except (OSError, AttributeError) as exc:
                errors.append(f"{name}: {exc}")
        if _lib is None:
            raise TuningError("cuBLAS library not found (install the nvidia-cublas pip package or set CUDA_PATH): "
                              + "; ".join(errors[:3]))
        _lib.cublasCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        _lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        _lib.cublasSetWorkspace_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        _lib.cublasGemmStridedBatchedEx.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
            ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
            ctypes.c_int, ctypes.c_int, ctypes.c_int]
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
    import cupy
    import numpy as np

    dt = str(c.dtype)
    if dt not in ("float16", "float32") or str(a.dtype) != dt or str(b.dtype) != dt:
        raise TuningError(f"cuBLAS gemm: dtypes {a.dtype}, {b.dtype}, {c.dtype} (one of float16 / float32 needed)")
    lib = library()
    handle, ws = _handle()
    st = lib.cublasSetStream_v2(handle, ctypes.c_void_p(cupy.cuda.get_current_stream().ptr))
    if st == 0:
        st = lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(ws.data.ptr), ctypes.c_size_t(ws.nbytes))
    if st != 0:
        raise TuningError(f"cuBLAS stream/workspace setup failed with status {st}")
    esz = c.itemsize
    ctype = _CUDA_R_16F if dt == "float16" else _CUDA_R_32F
    al = np.array([alpha], dtype=np.float32)
    be = np.array([0.0], dtype=np.float32)
    # Column-major view: C^T (N x M) = op_x(X) (N x K) . op_y(Y) (K x M), X from B, Y from A.
    opx, ldx = (_OP_T, K) if trans_b else (_OP_N, N)
    opy, ldy = (_OP_T, M) if trans_a else (_OP_N, K)
    st = lib.cublasGemmStridedBatchedEx(
        handle, opx, opy, N, M, K, al.ctypes.data,
        ctypes.c_void_p(b.data.ptr + b_offset * esz), ctype, ldx, stride_b,
        ctypes.c_void_p(a.data.ptr + a_offset * esz), ctype, ldy, stride_a,
        be.ctypes.data, ctypes.c_void_p(c.data.ptr + c_offset * esz), ctype, N, stride_c,
        batch, _COMPUTE_32F, _GEMM_DEFAULT)
    if st != 0:
        raise TuningError(f"cublasGemmStridedBatchedEx failed with status {st} (M={M} N={N} K={K} batch={batch})")
