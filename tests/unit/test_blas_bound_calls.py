"""graphopt.kernels.blas on the CPU: the argument lists ``bound_gemm`` and ``bound_gemm_batched`` hand to
cuBLAS through a recording stand-in for the library (row-major operands mapped onto cuBLAS's column-major
``C^T = op(B)^T op(A)^T``), the stream and workspace bound before every call, and a failing status
raised as a TuningError naming the call."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest

from graphopt.errors import TuningError
from graphopt.kernels import blas


class _Lib:
    def __init__(self, status=0):
        self.calls: list = []
        self.status = status

    def _record(self, name):
        def call(*args):
            self.calls.append((name, args))
            return self.status if name.startswith("cublasGemm") else 0
        return call

    def __getattr__(self, name):
        if name.startswith("cublas"):
            return self._record(name)
        raise AttributeError(name)


@pytest.fixture
def lib(monkeypatch):
    cupy = pytest.importorskip("cupy")

    fake = _Lib()
    monkeypatch.setattr(blas, "library", lambda: fake)
    workspace = SimpleNamespace(data=SimpleNamespace(ptr=4096), nbytes=64)
    monkeypatch.setattr(blas, "_handle", lambda: (ctypes.c_void_p(7), workspace))
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: SimpleNamespace(ptr=99))
    return fake


def _ints(args):
    return [a.value if isinstance(a, ctypes.c_void_p) else a for a in args]


def test_strided_gemm_arguments(lib):
    run = blas.bound_gemm("float16", 5, 7, 3, trans_b=True, batch=4, stride_a=15, stride_b=21, stride_c=35,
                          alpha=0.5, a_offset=1, b_offset=2, c_offset=3)
    a, b, c = (SimpleNamespace(data=SimpleNamespace(ptr=p)) for p in (1000, 2000, 3000))
    run(a, b, c)
    names = [n for n, _ in lib.calls]
    assert names == ["cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasGemmStridedBatchedEx"]
    args = _ints(lib.calls[2][1])
    # handle, op(X = B) transposed, op(Y = A) not, N, M, K, alpha, B (+2 halfs), type, ldb = K, stride_b, A, lda = K, ...
    assert args[0] == 7 and args[1:6] == [1, 0, 7, 5, 3] and args[7:11] == [2004, blas._CUDA_R_16F, 3, 21]
    assert args[11:14] == [1002, blas._CUDA_R_16F, 3] and args[14] == 15
    assert args[16:20] == [3006, blas._CUDA_R_16F, 7, 35]
    assert args[20:] == [4, blas._COMPUTE_32F, blas._GEMM_DEFAULT]
    assert ctypes.c_float.from_address(args[6]).value == 0.5 and ctypes.c_float.from_address(args[15]).value == 0.0


def test_pointer_array_gemm_arguments(lib):
    run = blas.bound_gemm_batched("float32", 5, 7, 3, lda=48, ldb=96, ldc=7, batch=6, trans_b=True, alpha=0.25)
    run(111, 222, 333)
    assert [n for n, _ in lib.calls] == ["cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasGemmBatchedEx"]
    args = _ints(lib.calls[2][1])
    assert args[0] == 7 and args[1:6] == [1, 0, 7, 5, 3]
    assert args[7:10] == [222, blas._CUDA_R_32F, 96] and args[10:13] == [111, blas._CUDA_R_32F, 48]
    assert args[14:17] == [333, blas._CUDA_R_32F, 7] and args[17:] == [6, blas._COMPUTE_32F, blas._GEMM_DEFAULT]
    assert ctypes.c_float.from_address(args[6]).value == 0.25


def test_a_failing_status_names_the_call(lib):
    lib.status = 13
    with pytest.raises(TuningError, match="cublasGemmBatchedEx failed with status 13"):
        blas.bound_gemm_batched("float16", 2, 2, 2, lda=2, ldb=2, ldc=2, batch=1)(1, 2, 3)
    with pytest.raises(TuningError, match="cublasGemmStridedBatchedEx failed with status 13"):
        blas.bound_gemm("float16", 2, 2, 2)(*(SimpleNamespace(data=SimpleNamespace(ptr=8)),) * 3)


def test_every_cublas_function_called_has_a_declared_signature():
    """ctypes hands an undeclared Python int to C as a 32-bit int: a host pointer (alpha, beta) loses its
    upper half. Every ``lib.cublas*`` the module calls is in SIGNATURES, its pointers pointer-sized."""
    import inspect
    import re

    called = set(re.findall(r"\.(cublas[A-Za-z_0-9]+)\b", inspect.getsource(blas)))  # lib.cublas...
    assert {"cublasGemmBatchedEx", "cublasGemmStridedBatchedEx"} <= called
    assert called <= set(blas.SIGNATURES), sorted(called - set(blas.SIGNATURES))
    for name in ("cublasGemmStridedBatchedEx", "cublasGemmBatchedEx"):
        args = blas.SIGNATURES[name]
        pointers = [6, 7, 11, 15, 16] if "Strided" in name else [6, 7, 10, 13, 14]  # alpha, A, B, beta, C
        assert all(args[i] is ctypes.c_void_p for i in [0] + pointers), name
        assert len(args) == (23 if "Strided" in name else 20), name


def test_the_library_declares_every_signature_before_handing_it_out(monkeypatch):
    """library() declares argtypes and restype of every function in SIGNATURES on the loaded library."""
    declared: dict = {}

    class _Fn:
        def __init__(self, name):
            self.name = name

        def __setattr__(self, key, value):
            if key in ("argtypes", "restype"):
                declared.setdefault(self.__dict__["name"], {})[key] = value
            object.__setattr__(self, key, value)

    class _Dll:
        def __init__(self, name):
            self.fns = {}

        def __getattr__(self, fn):
            if not fn.startswith("cublas"):
                raise AttributeError(fn)
            return self.fns.setdefault(fn, _Fn(fn))

    monkeypatch.setattr(blas, "_lib", None)
    monkeypatch.setattr(blas.ctypes, "CDLL", _Dll)
    lib = blas.library()
    assert isinstance(lib, _Dll)
    assert set(declared) == set(blas.SIGNATURES)
    assert all(d["argtypes"] == blas.SIGNATURES[n] and d["restype"] is ctypes.c_int for n, d in declared.items())
