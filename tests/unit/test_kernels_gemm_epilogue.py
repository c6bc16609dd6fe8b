"""The cuBLAS GemmAct lowerings' epilogue choice on the CPU: the 16-byte vector kernel
(``epilogue_gemm_vec``) exactly where the bias is one row of N values or absent and N is a multiple
of the vector; the strided scalar kernel elsewhere. Both compile in test_kernels_compile.py; both run
against the float64 reference in tests/gpu/test_gemm_act_gpu.py (its cases cover each side)."""

from __future__ import annotations

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
        [f"epilogue_gemm_vec<{'half_t,8' if dtype == 'float16' else 'float,4'}>"] if vector else [])
    assert set(kernels) <= set(all_kernel_instances())


def test_kernels_of_a_signature_no_plan_takes_lists_the_scalar_kernel_only():
    sig = Signature.make("GemmAct", [(4, 8), (9, 3), None], ["float16"] * 3, {"mode": "matmul"})
    assert CublasGemm("cublas").kernels(sig) == [("elementwise.cu", "epilogue_gemm<half_t>")]
