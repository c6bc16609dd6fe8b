"""graphopt.kernels.blas.gemm_args: the numpy.matmul -> strided batched GEMM mapping, checked on the
CPU by replaying the GEMM it describes with NumPy (the GPU call itself is in tests/gpu)."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt.kernels.blas import gemm_args


def _replay(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What gemm(a, b, y, M, N, K, batch, strides) computes, read straight from the flat buffers."""
    g = gemm_args(a.shape, b.shape)
    if g.broadcast_a is not None:
        a = np.broadcast_to(a.reshape(a.shape if a.ndim > 1 else (1,) + a.shape), g.broadcast_a)
    if g.broadcast_b is not None:
        b = np.broadcast_to(b.reshape(b.shape if b.ndim > 1 else b.shape + (1,)), g.broadcast_b)
    fa, fb = np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(b).reshape(-1)
    y = np.full(int(np.prod(g.out_shape, dtype=np.int64)), np.nan)
    for z in range(g.batch):
        am = fa[z * g.stride_a: z * g.stride_a + g.M * g.K].reshape(g.M, g.K)
        bm = fb[z * g.stride_b: z * g.stride_b + g.K * g.N].reshape(g.K, g.N)
        y[z * g.stride_c: z * g.stride_c + g.M * g.N] = (am @ bm).reshape(-1)
    return y.reshape(g.out_shape)


@pytest.mark.parametrize("sa, sb", [
    ((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((5, 7), (2, 7, 3)), ((2, 5, 7), (2, 7, 3)),
    ((4, 1, 5, 6), (3, 6, 2)), ((1, 3, 5, 6), (4, 1, 6, 2)), ((7,), (7, 4)), ((3, 7), (7,)), ((7,), (7,)),
    ((2, 3, 4, 8), (2, 3, 8, 5)),
])
def test_replayed_gemm_equals_numpy_matmul(sa, sb):
    rng = np.random.default_rng(len(sa) * 10 + len(sb))
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    want = np.matmul(a, b)
    got = _replay(a, b)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_shared_operands_get_stride_zero_and_mismatches_are_refused():
    g = gemm_args((8, 5, 7), (7, 3))
    assert (g.batch, g.stride_a, g.stride_b, g.broadcast_b) == (8, 35, 0, None)
    with pytest.raises(ValueError, match="inner dimensions"):
        gemm_args((5, 7), (6, 3))
