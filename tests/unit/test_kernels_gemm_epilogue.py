"""The cuBLAS GemmAct lowerings' epilogue choice on the CPU: the 16-byte vector kernel
(``epilogue_gemm_vec``) exactly where the bias is one row of N values or absent and N is a multiple
of the vector; the strided scalar kernel elsewhere. Both compile in test_kernels_compile.py; both run
against the float64 reference in tests/gpu/test_gemm_act_gpu.py (its cases cover each side)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graphopt.kernels.gemm_act import CublasGemm, _vector_epilogue, gemm_plan
from graphopt.kernels.registry import all_kernel_instances
from graphopt.lowering.contract import Signature


def _sig(a, b, c, dtype="float16", **attrs):
    return Signature.make("GemmAct", [a, b, c], [dtype] * 3, dict({"mode": "matmul", "activation": "Gelu"}, **attrs))


@pytest.mark.parametrize("a,b,c,dtype,attrs,vector", [
    ((4096, 768), (768, 3072), (3072,), "float16", {}, True),             # BERT's MLP: bias of N values
    ((2, 128, 768), (768, 3072), (3072,), "float16", {}, True),           # batched, bias shared by every row
    ((48, 32), (4, 32, 40), None, "float16", {}, True),                   # no bias, 40 = 5 vectors of 8
    ((37, 70), (70, 53), (53,), "float16", {}, False),                    # odd N
    ((37, 70), (70, 52), (52,), "float32", {}, True),                     # fp32: vectors of 4
    ((37, 70), (70, 52), (52,), "float16", {}, False),                    # 52 is no multiple of 8
    ((72, 50), (72, 88), (50, 1), "float16", {"mode": "gemm", "transA": 1}, False),  # one bias per row
    ((2, 3, 17, 40), (2, 3, 40, 24), (3, 1, 24), "float16", {}, False),  # bias differs per batch
    ((40, 24), (24, 56), (1,), "float16", {"mode": "gemm", "beta": -1.0}, False),    # a scalar bias
])
def test_vector_epilogue_only_for_a_row_bias_and_whole_vectors(a, b, c, dtype, attrs, vector):
    sig = _sig(a, b, c, dtype, **attrs)
    assert _vector_epilogue(gemm_plan(sig), dtype) is vector
    kernels = CublasGemm("cublas_ws").kernels(sig)
    assert [k for _, k in kernels] == [f"epilogue_gemm<{'half_t' if dtype == 'float16' else 'float'}>"] + (
        [f"epilogue_gemm_vec<{'half_t,8' if dtype == 'float16' else 'float,4'},1>"] if vector else [])
    assert set(kernels) <= set(all_kernel_instances())


def test_kernels_of_a_signature_no_plan_takes_lists_the_scalar_kernel_only():
    sig = Signature.make("GemmAct", [(4, 8), (9, 3), None], ["float16"] * 3, {"mode": "matmul"})
    assert CublasGemm("cublas").kernels(sig) == [("elementwise.cu", "epilogue_gemm<half_t>")]


# gelu_erf_16bit (elementwise.cu) as written there: its constants (1/sqrt2, the clamp, P's coefficients from
# z^7 down, log2 e), then its operations in float32
GELU16_CONSTANTS = ("0.70710678118654752f", "4.5f", "-2.04339559e-05f", "0.000487860044f", "-0.00523426097f",
                    "0.0339423096f", "-0.15248035f", "0.52565324f", "-1.62807639f", "-0.999998866f",
                    "1.4426950408889634f")


def _gelu_erf_16bit(x: np.ndarray) -> np.ndarray:
    f = np.float32
    coef = [f(float(c.rstrip("f"))) for c in GELU16_CONSTANTS[2:10]]
    z = np.abs(x) * f(0.70710678118654752)
    zc = np.minimum(z, f(4.5))
    p = coef[0]
    for c in coef[1:]:
        p = (p * zc + c).astype(f)
    with np.errstate(over="ignore", invalid="ignore"):
        h = np.exp2((-(z * z)).astype(f) * f(1.4426950408889634) + p).astype(f)  # erfc(z) / 2
        return (x * np.where(x >= 0, f(1) - h, h)).astype(f)


def test_the_16bit_erf_gelu_is_as_close_in_fp16_as_erff():
    """The vector pass's erf-GELU for fp16 outputs (one ex2 of a degree-7 fit, no erff) rounds to within one
    fp16 ulp of the exact GELU everywhere on [-12, 12] (erff's form: one ulp where |GELU| >= 1e-3, two in the
    tail), with an absolute error under 7e-7; +inf, -inf, NaN and -0 give what x Phi(x) gives."""
    from graphopt.kernels.source import read_source

    src = read_source("elementwise.cu")
    body = src[src.index("float gelu_erf_16bit"):src.index("float epilogue_act")]
    assert all(c in body for c in GELU16_CONSTANTS)
    x = np.linspace(-12, 12, 240_001).astype(np.float32)
    exact = 0.5 * x.astype(np.float64) * (1 + np.vectorize(math.erf)(x.astype(np.float64) / math.sqrt(2)))
    got = _gelu_erf_16bit(x).astype(np.float64)
    assert np.abs(got - exact).max() <= 7e-7
    ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    off = np.abs(got.astype(np.float16).astype(np.float64) - exact.astype(np.float16).astype(np.float64)) / ulp
    assert off.max() <= 1
    special = _gelu_erf_16bit(np.array([np.inf, -np.inf, np.nan, -0.0, 65504, -65504], np.float32))
    assert special[0] == np.inf and np.isnan(special[1]) and np.isnan(special[2])
    assert special[3] == 0 and np.signbit(special[3]) and special[4] == 65504 and special[5] == 0


def _gelu_tanh_16bit(x: np.ndarray) -> np.ndarray:
    """gelu_tanh_16bit (elementwise.cu) in float32: x / (1 + exp(-2u))."""
    f = np.float32
    with np.errstate(over="ignore"):
        minus_2u = x * (f(-0.0713548162726) * (x * x) + f(-1.5957691216057308))
        return (x / (f(1) + np.exp(minus_2u))).astype(f)


def test_the_16bit_tanh_gelu_is_the_tanh_form():
    """The vector pass's tanh-GELU for fp16 outputs, x * sigmoid(2u), rounds to within one fp16 ulp of
    0.5 x (1 + tanh(u)) computed in float64 wherever |GELU| >= 1e-3 and within two in the tail; its
    constants are 2 sqrt(2 / pi) and 2 sqrt(2 / pi) 0.044715."""
    from graphopt.kernels.source import read_source

    src = read_source("elementwise.cu")
    body = src[src.index("float gelu_tanh_16bit"):src.index("float epilogue_act")]
    assert "-0.0713548162726f" in body and "-1.5957691216057308f" in body
    c = math.sqrt(2 / math.pi)
    assert abs(2 * c - 1.5957691216057308) < 1e-15 and abs(2 * c * 0.044715 - 0.0713548162726) < 1e-12
    x = np.linspace(-12, 12, 240_001).astype(np.float32)
    x64 = x.astype(np.float64)
    exact = 0.5 * x64 * (1 + np.tanh(c * (x64 + 0.044715 * x64 ** 3)))
    got = _gelu_tanh_16bit(x).astype(np.float64)
    assert np.abs(got - exact).max() <= 4e-7 * max(1.0, float(np.abs(x).max()))
    ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    off = np.abs(got.astype(np.float16).astype(np.float64) - exact.astype(np.float16).astype(np.float64)) / ulp
    assert off[np.abs(exact) >= 1e-3].max() <= 1 and off.max() <= 2


@pytest.mark.parametrize("grid, block, nv, row_v", [
    (1, 256, 1000, 7), (3, 256, 5000, 96), (2, 64, 777, 1), (132 * 4, 256, 100_000, 384), (5, 32, 4096, 4096),
    (2, 32, 50, 0),  # no bias: row_v 0 (the column is never read)
])
def test_the_vector_pass_bias_column_follows_j_mod_row_v(grid, block, nv, row_v):
    """epilogue_vec_pass advances each thread's bias vector by the grid step's remainder instead of taking
    ``j % row_v`` a vector: the column it reads is ``j % row_v`` on every trip, for any grid and row."""
    from graphopt.kernels.source import read_source

    body = read_source("elementwise.cu")
    body = body[body.index("void epilogue_vec_pass"):body.index("epilogue_gemm_vec(")]
    for line in ("const int rv = row_v > 0 ? row_v : 1;", "const int step_col = step % rv;",
                 "int col = (blockIdx.x * blockDim.x + threadIdx.x) % rv;", "col += step_col;",
                 "if (col >= rv) col -= rv;"):
        assert line in body, line
    step = grid * block
    rv = row_v if row_v > 0 else 1
    step_col = step % rv
    for t in range(step):
        col = t % rv
        for j in range(t, nv, step):
            if row_v:
                assert col == j % row_v
            col += step_col
            if col >= rv:
                col -= rv
