"""Float Mod (fmod=0) is built from ``fmod`` so that every array module gives NumPy's answer at the
edges: CuPy's own ``mod`` failed ONNX's edge-case tests on the H100 (signed zeros, infinite
and zero divisors, NaN; bench/results/conformance_h100_9c52c8a.md), which the NumPy runtime and the
fake CuPy, both NumPy underneath, could not show."""

from __future__ import annotations

import types

import numpy as np
import pytest

from graphopt.runtime.onnx_ops.elementwise import _float_mod

X = [0.0, -0.0, 0.0, -0.0, -3.0, 3.0, -1.0, 1.0, np.inf, -np.inf, 1.0, 1.0, np.nan, 1.0, 5.5, -5.5, 5.5, -5.5, 7.0]
Y = [-2.0, 2.0, 2.0, -2.0, np.inf, np.inf, -np.inf, -np.inf, 2.0, 2.0, 0.0, -0.0, 2.0, np.nan, 2.0, 2.0, -2.0, -2.0, 3.5]


def _no_mod_numpy():
    """NumPy without ``mod``/``remainder``: the float path must not lean on them."""
    def refuse(*a, **k):
        raise AssertionError("float Mod must not call xp.mod")
    ns = types.SimpleNamespace(**{k: getattr(np, k) for k in ("fmod", "where", "copysign", "zeros_like")})
    ns.mod = ns.remainder = refuse
    return ns


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_mod_matches_numpy_mod_at_the_edges(dtype):
    a, b = np.array(X, dtype), np.array(Y, dtype)
    with np.errstate(all="ignore"):
        got, want = _float_mod(_no_mod_numpy(), a, b), np.mod(a, b)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))  # -0.0 vs 0.0 too


def test_float_mod_random_against_float64_reference():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=997) * 10, rng.normal(size=997) * 3
    want = np.mod(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(_float_mod(np, a, b), want, rtol=1e-12, atol=1e-12)
