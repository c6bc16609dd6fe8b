"""A capture-safe GEMM: cuBLAS through ctypes with our own handle, stream and workspace.

Written by hand because CuPy refuses every cuBLAS call during CUDA stream capture
(``NotImplementedError: calling cuBLAS API during stream capture is currently unsupported``),
including ``cupy.matmul``, while cuBLAS itself captures fine when its handle has a stream and a
user workspace (measured on the H200; see /work/shared/design.md). No library offers that from
Python without torch. Only ``cublasGemmStridedBatchedEx`` is used.

``matmul(a, b)`` has ``numpy.matmul`` semantics for C-contiguous operands: batch dimensions
broadcast (an operand whose batch is a single matrix gets stride 0, any other partial broadcast is
materialised first), 1-D operands are promoted and squeezed back. fp16 multiplies accumulate in
fp32; fp32 uses full fp32 (no TF32) so results match onnxruntime to 1e-5.

The row-major/column-major mapping is pure arithmetic (``gemm_args``), tested on the CPU.
"""

from __future__ import annotations

import ctypes
import glob
import os
from dataclasses import dataclass

import numpy as np

CUBLAS_OP_N = 0
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F = 0, 1, 2
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F = 68, 70
CUBLAS_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20

_TYPES = {
    np.dtype(np.float32): (CUDA_R_32F, CUBLAS_COMPUTE_32F, ctypes.c_float),
    np.dtype(np.float16): (CUDA_R_16F, CUBLAS_COMPUTE_32F, ctypes.c_float),
    np.dtype(np.float64): (CUDA_R_64F, CUBLAS_COMPUTE_64F, ctypes.c_double),
}


@dataclass(frozen=True)
class GemmArgs:
    """One strided batched column-major GEMM computing the row-major ``Y[z] = A[z] @ B[z]``.

    Row-major ``Y = A B`` is column-major ``Y^T = B^T A^T``: cuBLAS gets ``m = N``, ``n = M``,
    ``k = K``, its first operand is B (ld N) and its second A (ld K); Y has ld N.
    """

    out_shape: tuple[int, ...]
    m: int
    n: int
    k: int
    stride_b: int  # cuBLAS "A" = our B
    stride_a: int  # cuBLAS "B" = our A
    stride_y: int
    batch: int
    broadcast_a: tuple[int, ...] | None  # materialise A to this shape first
    broadcast_b: tuple[int, ...] | None


def gemm_args(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> GemmArgs:
    """The cuBLAS call for ``numpy.matmul`` of C-contiguous operands of these shapes."""
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
    return GemmArgs(tuple(out), N, M, K, sb, sa, M * N, Z, bc_a, bc_b)


def find_libcublas() -> str | None:
    """The libcublas CuPy uses: already mapped in this process, else the nvidia pip package, else CUDA_PATH."""
    try:
        import cupy_backends.cuda.libs.cublas  # noqa: F401 - loads libcublas into the process

        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                if "libcublas.so" in path and "Lt" not in os.path.basename(path):
                    return path
    except Exception:  # noqa: BLE001 - not Linux, or CuPy built without cuBLAS
        pass
    candidates: list[str] = []
    try:
        import nvidia  # the CUDA pip wheels

        for base in getattr(nvidia, "__path__", []):
            candidates += glob.glob(os.path.join(base, "**", "libcublas.so*"), recursive=True)
    except ImportError:
        pass
    cuda = os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME")
    if cuda:
        candidates += glob.glob(os.path.join(cuda, "lib64", "libcublas.so*"))
    candidates = [c for c in candidates if "Lt" not in os.path.basename(c)]
    return sorted(candidates)[0] if candidates else None


class CublasGemm:
    """Our own cuBLAS handle bound to one CuPy stream, with a workspace; ``matmul`` enqueues on it."""

    capture_safe = True

    def __init__(self, stream, path: str | None = None):
        import cupy

        self._cupy = cupy
        path = path or find_libcublas()
        if not path:
            raise OSError("libcublas not found (install the nvidia-cublas wheel or set CUDA_PATH)")
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate_v2")
        self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=cupy.uint8)
        self.set_stream(stream)
        f = self.lib.cublasGemmStridedBatchedEx
        f.restype = ctypes.c_int
        vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        f.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll, i, i, i]
        self._gemm = f
        self._scalars = {dt: (ctype(1.0), ctype(0.0)) for dt, (_, _, ctype) in _TYPES.items()}

    def set_stream(self, stream) -> None:
        self.stream = stream
        self._check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream.ptr)), "cublasSetStream_v2")
        self._check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(self.workspace.data.ptr),
                                                   ctypes.c_size_t(WORKSPACE_BYTES)), "cublasSetWorkspace_v2")

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} returned cuBLAS status {status}")

    def matmul(self, a, b):
        cupy = self._cupy
        dt = np.dtype(a.dtype)
        if dt not in _TYPES or b.dtype != a.dtype:
            return cupy.matmul(a, b)  # integer or mixed GEMMs: rare in models; CuPy's path (not capturable)
        g = gemm_args(tuple(a.shape), tuple(b.shape))
        if g.broadcast_a is not None:
            a = cupy.broadcast_to(a.reshape(a.shape if a.ndim > 1 else (1,) + a.shape), g.broadcast_a)
        if g.broadcast_b is not None:
            b = cupy.broadcast_to(b.reshape(b.shape if b.ndim > 1 else b.shape + (1,)), g.broadcast_b)
        a = cupy.ascontiguousarray(a)
        b = cupy.ascontiguousarray(b)
        y = cupy.empty(g.out_shape, dtype=dt)
        if y.size == 0:
            return y
        if g.k == 0:
            y.fill(0)
            return y
        cuda_t, compute, _ = _TYPES[dt]
        one, zero = self._scalars[dt]
        status = self._gemm(self.handle, CUBLAS_OP_N, CUBLAS_OP_N, g.m, g.n, g.k, ctypes.byref(one),
                            b.data.ptr, cuda_t, g.m, g.stride_b, a.data.ptr, cuda_t, g.k, g.stride_a,
                            ctypes.byref(zero), y.data.ptr, cuda_t, g.m, g.stride_y, g.batch, compute,
                            CUBLAS_GEMM_DEFAULT)
        self._check(status, "cublasGemmStridedBatchedEx")
        return y

    def self_test(self) -> str | None:
        """None when a few GEMMs (2-D, batched, broadcast, fp16) match cupy.matmul, else what failed."""
        cupy = self._cupy
        rng = np.random.default_rng(0)
        cases = [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((4, 1, 5, 6), (3, 6, 2)), ((7,), (7, 4)), ((3, 7), (7,))]
        try:
            for dt in (np.float32, np.float16):
                for sa, sb in cases:
                    a = cupy.asarray(rng.standard_normal(sa).astype(dt))
                    b = cupy.asarray(rng.standard_normal(sb).astype(dt))
                    with self.stream:
                        got = self.matmul(a, b)
                    self.stream.synchronize()
                    want = cupy.matmul(a.astype(np.float32), b.astype(np.float32))
                    err = float(cupy.abs(got.astype(np.float32) - want).max())
                    if got.shape != want.shape or not err <= (1e-2 if dt == np.float16 else 1e-4) * (1 + float(cupy.abs(want).max())):
                        return f"matmul {sa} x {sb} {np.dtype(dt).name}: shape {got.shape}, max error {err:.3g}"
        except Exception as e:  # noqa: BLE001 - any failure means: do not use this path
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return None
