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


def _pipe_epilogue_cases():
    for dtype in DTYPES:
        for ai, attrs in enumerate(ACTS):
            for with_bias in (True, False):
                for grid in (1, 3, None):  # None: the launcher's grid (the CTAs the GPU holds)
                    yield pytest.param(dtype, attrs, with_bias, grid, id=f"{dtype}-{ai}{attrs['activation']}-bias{int(with_bias)}-grid{grid}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,attrs,with_bias,grid", list(_pipe_epilogue_cases()))
def test_pipelined_epilogue(dtype, attrs, with_bias, grid):
    """``epilogue_gemm_pipe`` (each thread's next vector loaded before this one's arithmetic) against
    the float64 activation of alpha * y + beta * bias, and equal to ``epilogue_gemm_vec`` bit for bit;
    odd row counts, grids of 1 and 3 CTAs (every thread loops, prefetching) and the launcher's."""
    from graphopt.kernels import geometry as geo
    from graphopt.kernels.gemm_act import vector_epilogue_launcher
    from graphopt.kernels.mma_args import ptr
    from graphopt.kernels.source import VEC16, get_kernel, instance

    m, n = 1037, 8 * VEC16[dtype] * 3
    sig = Signature.make("GemmAct", [(m, 4), (4, n)], [dtype, dtype], {"mode": "matmul", **attrs})
    act = geo.act_args(sig)
    rng = np.random.default_rng(zlib.crc32(f"{dtype}{attrs}{with_bias}{grid}".encode()))
    y0 = (rng.standard_normal((m, n)) * 2).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype) if with_bias else None
    alpha, beta = 0.75, 1.5
    x = alpha * y0.astype(np.float64) + (beta * bias.astype(np.float64) if with_bias else 0.0)
    ref = R.activation(x, attrs["activation"], attrs.get("act_alpha"), attrs.get("act_beta"),
                       attrs.get("clip_min"), attrs.get("clip_max"))
    b_dev = cupy.asarray(bias) if with_bias else None
    outs = {}
    for pipe in (False, True):
        y = cupy.asarray(y0)
        if pipe and grid is not None:
            kern = get_kernel("elementwise.cu", instance("epilogue_gemm_pipe", dtype, VEC16[dtype]))
            f32 = np.float32
            kern((grid,), (256,), (y, ptr(b_dev), np.int32(m * n), np.int32(n), f32(alpha), f32(beta), np.int32(act.code),
                                   f32(act.alpha), f32(act.beta), f32(act.lo), f32(act.hi)))
        else:
            vector_epilogue_launcher(dtype, m * n, n, act, pipe=pipe)(y, b_dev, alpha, beta)
        outs[pipe] = cupy.asnumpy(y)
    assert np.array_equal(outs[True], outs[False], equal_nan=True), "the pipelined epilogue differs from the vector one"
    err = np.abs(outs[True].astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert err <= (2e-3 if dtype == "float16" else 1e-5), f"max error {err:.2e}"
