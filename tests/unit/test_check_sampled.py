"""The checker's sampled references (CPU): a large GemmAct is checked on a few output columns computed
exactly by the op's own reference on B and C cut to those columns."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt.kernels import check
from graphopt.lowering.contract import Signature


@pytest.mark.parametrize("shapes, attrs", [
    ([(3, 40, 96), (96, 333), (333,)], {"mode": "matmul", "activation": "Gelu"}),          # batched, bias
    ([(2, 4, 50, 64), (2, 4, 64, 70), None], {"mode": "matmul", "activation": "none"}),    # both batched
    ([(96, 48), (75, 96), (75,)], {"mode": "gemm", "transA": 1, "transB": 1, "alpha": 0.5, "activation": "Relu"}),
    ([(48, 96), (96, 75), (1, 75)], {"mode": "gemm", "activation": "SiLU"}),
])
def test_sampled_gemm_reference_matches_full_reference(shapes, attrs):
    """The columns-cut GemmAct reference gives exactly the full reference at its indices."""
    from graphopt.ops import get_schema

    sig = Signature.make("GemmAct", shapes, ["float32" if s is not None else "" for s in shapes], attrs)
    rng = np.random.default_rng(5)
    inputs = check.random_inputs(sig, rng)
    idx, sampled = check._sampled_gemm_reference(sig, inputs, rng)
    full = np.asarray(get_schema("GemmAct").reference([None if a is None else a.astype(np.float64) for a in inputs],
                                                        dict(sig.attrs))[0]).reshape(-1)
    assert len(idx) == full.size // check.output_shape(sig)[-1] * min(check.SAMPLED_COLUMNS, check.output_shape(sig)[-1])
    np.testing.assert_allclose(sampled, full[idx], rtol=1e-12, atol=1e-12)


def test_only_large_gemms_with_a_column_axis_are_sampled():
    big = Signature.make("GemmAct", [(4096, 768), (768, 50257), (50257,)], ["float16"] * 3, {"mode": "matmul"})
    assert check._samples_gemm(big)  # GPT-2's lm_head at bs32: 316 GFLOP in full
    small = Signature.make("GemmAct", [(8, 64), (64, 32), (32,)], ["float16"] * 3, {"mode": "matmul"})
    vec = Signature.make("GemmAct", [(4096, 50257), (50257,), None], ["float16", "float16", ""], {"mode": "matmul"})
    assert not check._samples_gemm(small) and not check._samples_gemm(vec)
