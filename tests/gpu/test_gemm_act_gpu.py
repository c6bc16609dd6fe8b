"""Every GemmAct candidate and config against the float64 reference on the GPU (marker ``gpu``)."""

from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

from graphopt.lowering.contract import Signature
from graphopt.kernels.gemm_act import gemm_act_candidates, gemm_plan

import reference as R
from _harness import ACTS, run_and_check

# name: (A shape, B shape, C shape or None, attrs)
CASES = {
    "odd_2d": ((37, 70), (70, 53), (53,), {"mode": "matmul"}),
    "batched_shared_b": ((3, 33, 64), (64, 96), (96,), {"mode": "matmul"}),
    "batched_both_bias_bcast": ((2, 3, 17, 40), (2, 3, 40, 24), (3, 1, 24), {"mode": "matmul"}),
    "shared_a": ((48, 32), (4, 32, 40), None, {"mode": "matmul"}),
    "partial_bcast": ((2, 1, 9, 16), (3, 16, 8), (8,), {"mode": "matmul"}),
    "vec_b": ((5, 16, 32), (32,), None, {"mode": "matmul"}),
    "gemm_transb_alpha_beta": ((50, 72), (88, 72), (88,), {"mode": "gemm", "transB": 1, "alpha": 0.5, "beta": 2.0}),
    "gemm_transa_rowbias": ((72, 50), (72, 88), (50, 1), {"mode": "gemm", "transA": 1}),
    "gemm_scalar_c": ((40, 24), (24, 56), (1,), {"mode": "gemm", "beta": -1.0}),
    "mlp_splitk": ((256, 768), (768, 1024), (1024,), {"mode": "matmul"}),
    "pipe_transb_tails": ((200, 136), (264, 136), (264,), {"mode": "gemm", "transB": 1}),
}
DTYPES = ("float16", "float32")


@lru_cache(maxsize=None)
def _data(name: str, dtype: str, act_idx: int = 1):
    ash, bsh, csh, attrs = CASES[name]
    rng = np.random.default_rng(zlib.crc32(f"{name}|{dtype}".encode()))
    k = ash[-1] if not attrs.get("transA") else ash[0]
    a = rng.standard_normal(ash).astype(dtype)
    b = (rng.standard_normal(bsh) / np.sqrt(k)).astype(dtype)
    c = None if csh is None else rng.standard_normal(csh).astype(dtype)
    at = dict(attrs, **ACTS[act_idx])
    return [a, b, c], at, R.reference("GemmAct", [a, b, c], at)


def _cases():
    for name, (ash, bsh, csh, attrs) in CASES.items():
        for dtype in DTYPES:
            shapes = [ash, bsh, csh]
            sig = Signature.make("GemmAct", shapes, [dtype] * 3, dict(attrs, activation="Relu"))
            for cand in gemm_act_candidates():
                if cand.applies(sig, (9, 0)) is None:
                    yield pytest.param(name, dtype, cand, shapes, id=f"{name}-{dtype}-{cand.key()}")


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype,cand,shapes", list(_cases()))
def test_gemm_candidate(name, dtype, cand, shapes):
    inputs, attrs, ref = _data(name, dtype)
    assert gemm_plan(Signature.make("GemmAct", shapes, [dtype] * 3, attrs)).out_shape == ref.shape
    run_and_check(cand, "GemmAct", shapes, dtype, attrs, inputs, ref)


def _act_cases():
    picks = {"cublas", "cublas_ws", "mma_gemm:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1", "mma_gemm:bm=128,bn=128,bk=32,wm=2,wn=4,splitk=1",
             "mma_gemm:bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1,sepi=1",
             "mma_gemm:bm=128,bn=128,bk=32,wm=2,wn=2,splitk=1,sepi=1,st=3", "mma_gemm:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1,st=4"}
    for ai in range(len(ACTS)):
        for dtype in DTYPES:
            for name in ("odd_2d", "gemm_transb_alpha_beta", "pipe_transb_tails"):
                for cand in gemm_act_candidates():
                    # the cp.async configs exist for fp16 with 16-byte aligned rows (pipe_transb_tails) only
                    if "st=" in cand.key() and (dtype != "float16" or name != "pipe_transb_tails"):
                        continue
                    if cand.key() in picks:
                        yield pytest.param(ai, dtype, name, cand, id=f"act{ai}-{ACTS[ai]['activation']}-{name}-{dtype}-{cand.key()}")


@pytest.mark.gpu
@pytest.mark.parametrize("ai,dtype,name,cand", list(_act_cases()))
def test_gemm_activation(ai, dtype, name, cand):
    ash, bsh, csh, _ = CASES[name]
    inputs, attrs, ref = _data(name, dtype, ai)
    run_and_check(cand, "GemmAct", [ash, bsh, csh], dtype, attrs, inputs, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", [8, 9], ids=["erf", "tanh"])
def test_the_vector_pass_gelu_per_element(dtype, act):
    """``epilogue_gemm_vec``'s GELUs (fp16: the erf form as one ex2 of a fitted erfc and the x * sigmoid(2u) tanh form;
    fp32: erff and tanhf) on every value of a dense grid over [-12, 12] plus a bias row, against float64:
    fp16 within one ulp of the exact value's rounding where |GELU| >= 1e-3 and three in the tail; fp32
    within 1e-6 relative of the largest value."""
    import math

    from graphopt.kernels.gemm_act import vector_epilogue_launcher
    from graphopt.kernels.geometry import ActArgs

    n = 1024
    rows = 480
    x = np.linspace(-12, 12, rows * n).reshape(rows, n).astype(dtype)
    bias = (np.random.default_rng(0).standard_normal(n) * 0.25).astype(dtype)
    run = vector_epilogue_launcher(dtype, rows * n, n, ActArgs(act, 0.2, 0.5, -math.inf, math.inf))
    y = cupy.asarray(x)
    run(y, cupy.asarray(bias), 1.0, 1.0)
    got = cupy.asnumpy(y).astype(np.float64)
    v = (x.astype(np.float32) + bias.astype(np.float32)).astype(np.float64)  # the pass adds in fp32
    if act == 8:
        exact = 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))
    else:
        exact = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    if dtype == "float16":
        ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
        off = np.abs(got - exact.astype(np.float16).astype(np.float64)) / ulp
        assert off[np.abs(exact) >= 1e-3].max() <= 1 and off.max() <= 3, off.max()
    else:
        assert np.abs(got - exact).max() <= 1e-6 * np.abs(exact).max()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", [0, 1, 8, 9, 5, 3, 10], ids=["none", "relu", "erf", "tanh", "silu", "leakyrelu", "hardsigmoid"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("grid", [1, 3, None], ids=["grid1", "grid3", "launcher"])
def test_two_loads_a_thread_match_one(dtype, act, with_bias, grid):
    """``epilogue_gemm_vec`` with LOADS=2 (timed by bench/transformer_kernels.py) writes what LOADS=1 does
    (fp16 bit for bit, fp32 within 4 eps of the largest value): every activation pass, bias or none, grids that make a thread loop over
    several pairs, end on a half pair (an odd number of vectors) and the launcher's grid; the bias row
    (7 vectors) does not divide the grid step."""
    import math

    from graphopt.kernels.gemm_act import vector_epilogue_grid, vector_epilogue_kernel
    from graphopt.kernels.source import VEC16, get_kernel

    vec = VEC16[dtype]
    n = 7 * vec
    rows = 1001  # 7,007 vectors: odd
    rng = np.random.default_rng(act)
    x = (rng.standard_normal((rows, n)) * 3).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype) if with_bias else None
    outs = []
    for loads in (1, 2):
        kern = get_kernel(*vector_epilogue_kernel(dtype, loads))
        y = cupy.asarray(x)
        b = cupy.asarray(bias) if with_bias else None
        g = (grid,) if grid else vector_epilogue_grid(dtype, rows * n, loads)
        kern(g, (256,), (y, b, np.int32(rows * n), np.int32(n), np.float32(1.25), np.float32(0.75), np.int32(act),
                         np.float32(0.2), np.float32(0.5), np.float32(-math.inf), np.float32(math.inf)))
        outs.append(cupy.asnumpy(y))
    assert not np.array_equal(outs[0], x)  # the pass ran (alpha 1.25 moves every value)
    if dtype == "float16":
        np.testing.assert_array_equal(outs[1].view(np.uint8), outs[0].view(np.uint8))
    else:  # fp32's tanhf, inlined in two places, contracts into FMAs a little differently: a 1-ulp change of
        # tanh(u) near -1 moves 0.5 * v * (1 + tanh(u)) by |v| * 2**-24, thousands of ulp of a result near 0
        # (H100: 3,651), so the bound is normwise: a few fp32 eps of the pass's largest value.
        diff = np.abs(outs[1].astype(np.float64) - outs[0].astype(np.float64)).max()
        assert diff <= 4 * np.finfo(np.float32).eps * np.abs(outs[0]).max(), diff
