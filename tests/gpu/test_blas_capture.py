"""graphopt.kernels.blas: cuBLAS through graphopt's own handle, eager and inside a CUDA graph."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

from graphopt.kernels import blas  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False)])
def test_gemm_matches_numpy(dtype, ta, tb):
    rng = np.random.default_rng(7)
    M, N, K, Z = 37, 53, 70, 3
    a = rng.standard_normal((Z, K, M) if ta else (Z, M, K)).astype(dtype)
    b = rng.standard_normal((Z, N, K) if tb else (Z, K, N)).astype(dtype)
    c = cupy.full((Z, M, N), cupy.nan, dtype=dtype)
    blas.gemm(cupy.asarray(a), cupy.asarray(b), c, M, N, K, trans_a=ta, trans_b=tb, batch=Z,
              stride_a=M * K, stride_b=K * N, stride_c=M * N, alpha=0.5)
    a64 = a.astype(np.float64).transpose(0, 2, 1) if ta else a.astype(np.float64)
    b64 = b.astype(np.float64).transpose(0, 2, 1) if tb else b.astype(np.float64)
    ref = 0.5 * a64 @ b64
    got = cupy.asnumpy(c).astype(np.float64)
    tol = 1e-2 if dtype == "float16" else 1e-5
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < tol


@pytest.mark.gpu
def test_gemm_captures_and_replays():
    rng = np.random.default_rng(3)
    M, N, K = 64, 96, 128
    a = cupy.asarray(rng.standard_normal((M, K)).astype("float16"))
    b = cupy.asarray(rng.standard_normal((K, N)).astype("float16"))
    c = cupy.zeros((M, N), dtype="float16")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        blas.gemm(a, b, c, M, N, K)  # handle and workspace exist before the capture
        stream.synchronize()
        c.fill(0)
        stream.begin_capture()
        try:
            blas.gemm(a, b, c, M, N, K)
        finally:
            graph = stream.end_capture()
        c.fill(cupy.nan)
        graph.launch(stream)
        stream.synchronize()
    ref = cupy.asnumpy(a).astype(np.float64) @ cupy.asnumpy(b).astype(np.float64)
    got = cupy.asnumpy(c).astype(np.float64)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2
