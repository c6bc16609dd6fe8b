"""The cuBLASLt provider's CPU side, against a fake libcublasLt (a Python object with the library's
function names that records every call): the C table and struct sizes, the row-major -> cuBLASLt
mapping per epilogue / dtype / transpose / batch, descriptor set-up, algorithm keys that parse back,
cache entries, the built Lowering, and absence as a reason."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from graphopt.errors import TuningError
from graphopt.kernels import registry
from graphopt.lowering import Lowering, Signature
from graphopt.providers import cublaslt as prov
from graphopt.providers import cublaslt_lib as lt
from graphopt.providers import provider_reasons
from graphopt.tune.cache import TuningCache
from graphopt.tune.cache_record import TimingRecord

from _fake_cublaslt import E, FakeLt, conv, gemm  # noqa: E402


@pytest.fixture()
def fake(monkeypatch):
    lib = FakeLt()
    monkeypatch.setattr(lt, "_STATE", {"api": lt.Api(lib), "reason": None})
    monkeypatch.setattr(prov, "_SETUPS", {})
    return lib


def test_c_table_and_struct_layouts_match_the_header():
    assert ctypes.sizeof(lt.Algo) == 64 and ctypes.sizeof(lt.HeuristicResult) == 96
    assert lt.HeuristicResult.workspaceSize.offset == 64 and lt.HeuristicResult.state.offset == 72
    assert lt.HeuristicResult.wavesCount.offset == 76
    assert (E["CUBLASLT_EPILOGUE_BIAS"], E["CUBLASLT_EPILOGUE_RELU_BIAS"], E["CUBLASLT_EPILOGUE_GELU_BIAS"]) == (4, 6, 36)
    assert E["CUBLASLT_EPILOGUE_RELU_BIAS"] == E["CUBLASLT_EPILOGUE_RELU"] | E["CUBLASLT_EPILOGUE_BIAS"]
    assert E["CUBLASLT_EPILOGUE_GELU_BIAS"] == E["CUBLASLT_EPILOGUE_GELU"] | E["CUBLASLT_EPILOGUE_BIAS"]
    assert set(prov.EPILOGUES.values()) <= set(E)


def test_absent_library_is_a_reason_not_an_error(monkeypatch):
    monkeypatch.setattr(lt, "_STATE", {"api": None, "reason": "libcublasLt not found (x)"})
    sig = gemm((8, 64), (64, 32), activation="Relu")
    cands = prov.candidates("GemmAct", sig)
    assert [c.key() for c in cands] == ["cublaslt"]
    assert "libcublasLt not found" in cands[0].applies(sig, (9, 0))
    with pytest.raises(TuningError, match="does not apply"):
        cands[0].build(sig, "sm_90")
    assert prov.versions() == () and prov.candidates("LayerNorm", sig) == []
    assert "libcublasLt not found" in provider_reasons()["cublaslt"]
    keys = [c.key() for c in registry.candidates_for(sig)]
    assert "cublaslt" in keys and "cublas_ws" in keys  # the own kernels stay


def test_no_library_on_this_machine_reports_why(monkeypatch):
    monkeypatch.setattr(lt, "_STATE", {})
    monkeypatch.setattr(lt, "library_candidates", lambda stem, sonames: ["/nonexistent/libcublasLt.so.99"])
    assert lt.api() is None and "libcublasLt not found" in lt.unavailable()


@pytest.mark.parametrize("sig, want", [
    # 2-D + bias + GeluTanh: cuBLASLt's A is our B (N x K col-major, ld N), its B our A (K x M, ld K)
    (gemm((8, 64), (64, 32), activation="GeluTanh"),
     dict(m=32, n=8, k=64, transa=0, transb=0, a=(32, 64, 32), b=(64, 8, 64), batch=1, epilogue="CUBLASLT_EPILOGUE_GELU_BIAS",
          a_input=1, b_input=0, bias_input=2)),
    (gemm((8, 64), (64, 32), None, activation="Relu"), dict(epilogue="CUBLASLT_EPILOGUE_RELU", bias_input=None)),
    (gemm((8, 64), (64, 32), None), dict(epilogue="CUBLASLT_EPILOGUE_DEFAULT")),
    (gemm((8, 64), (64, 32), (1, 32)), dict(epilogue="CUBLASLT_EPILOGUE_BIAS")),
    # Gemm transA / transB: transposes, not copies
    (gemm((64, 8), (32, 64), (32,), mode="gemm", transA=1, transB=1, activation="Relu"),
     dict(m=32, n=8, k=64, transa=1, transb=1, a=(64, 32, 64), b=(8, 64, 8), epilogue="CUBLASLT_EPILOGUE_RELU_BIAS")),
    (gemm((8, 64), (64, 32), None, mode="gemm", alpha=0.5), dict(alpha=0.5)),
    # batched, both operands batched: a strided batch
    (gemm((3, 5, 7, 16), (3, 5, 16, 9)), dict(m=9, n=7, k=16, batch=15, stride_a=16 * 9, stride_b=7 * 16)),
    # B shared by every batch: folded into the rows
    (gemm((3, 7, 16), (16, 9)), dict(m=9, n=21, k=16, batch=1)),
    # A shared: stride 0
    (gemm((7, 16), (4, 16, 9)), dict(m=9, n=7, batch=4, stride_a=16 * 9, stride_b=0)),
    (gemm((16,), (16, 9), dtype="bfloat16"), dict(m=9, n=1, k=16, dtype="CUDA_R_16BF")),
    (gemm((8, 64), (64, 32), dtype="float32"), dict(dtype="CUDA_R_32F")),
    # 1x1 CBR in NHWC: Y[N*H*W, M] = X[N*H*W, C] W[M, C]^T
    (conv((2, 24, 5, 7), (40, 24, 1, 1), activation="Relu"),
     dict(m=40, n=70, k=24, transa=1, transb=0, a=(24, 40, 24), b=(24, 70, 24), epilogue="CUBLASLT_EPILOGUE_RELU_BIAS",
          a_input=1, b_input=0, bias_input=2)),
    (conv((2, 24, 9), (40, 24, 1), bias=False), dict(m=40, n=18, k=24, epilogue="CUBLASLT_EPILOGUE_DEFAULT")),
])
def test_problem_mapping(sig, want):
    p = prov.problem(sig)
    for k, v in want.items():
        assert getattr(p, k) == v, (k, getattr(p, k), v)


@pytest.mark.parametrize("sig, reason", [
    (gemm((8, 64), (64, 32), activation="Gelu"), "tanh approximation"),
    (gemm((8, 64), (64, 32), activation="Sigmoid"), "no cuBLASLt epilogue"),
    (gemm((8, 64), (64, 32), (8, 32)), "not a bias over the last dimension"),
    (gemm((8, 64), (64, 32), (8, 1)), "not a bias over the last dimension"),
    (gemm((8, 64), (64, 32), mode="gemm", beta=2.0), "alpha or beta"),
    (gemm((8, 64), (64, 32), mode="gemm", alpha=2.0), "alpha or beta"),
    (gemm((2, 3, 8, 64), (3, 64, 32)), "partial batch broadcast"),
    (gemm((8, 64), (64, 32), dtype="float64"), "dtype float64"),
    (conv((2, 24, 5, 7), (40, 24, 3, 3), pads=[1, 1, 1, 1]), "only 1x1"),
    (conv((2, 24, 5, 7), (40, 24, 1, 1), strides=[2, 2]), "only 1x1"),
    (conv((2, 24, 5, 7), (40, 12, 1, 1), group=2), "only 1x1"),
    (conv((2, 24, 5, 7), (40, 24, 1, 1), pads=[0, 0, 1, 1]), "only 1x1"),
    (conv((2, 24, 5, 7), (40, 24, 1, 1), res=True), "residual"),
    (Signature.make("LayerNorm", [(4, 8)], ["float16"], {}), "GemmAct, CBR"),
])
def test_unsupported_shapes_are_reasons(sig, reason):
    assert reason in prov.shape_reason(sig)


def _calls(log, name):
    return [e for e in log if e[0] == name]


@pytest.mark.parametrize("act, bias, epi", [("none", False, 1), ("none", True, 4), ("Relu", False, 2), ("Relu", True, 6),
                                            ("GeluTanh", False, 32), ("GeluTanh", True, 36)])
def test_descriptor_setup_per_epilogue(fake, act, bias, epi):
    sig = gemm((8, 64), (64, 32), (32,) if bias else None, activation=act)
    prov.candidates("GemmAct", sig)
    desc = _calls(fake.log, "desc")
    assert len(desc) == 1 and desc[0][2:] == (E["CUBLAS_COMPUTE_32F"], E["CUDA_R_32F"])  # fp32 compute and scale
    sets = {e[2]: e[3] for e in _calls(fake.log, "desc_set")}
    assert sets[E["CUBLASLT_MATMUL_DESC_EPILOGUE"]] == epi
    assert (E["CUBLASLT_MATMUL_DESC_BIAS_POINTER"] in sets) == bias
    if bias:  # the heuristic sees a 16-byte (not more) aligned bias pointer
        assert sets[E["CUBLASLT_MATMUL_DESC_BIAS_POINTER"]] % 32 == prov.ALIGNMENT
    prefs = {e[2]: e[3] for e in _calls(fake.log, "pref_set")}
    assert prefs[E["CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES"]] == prov.MAX_WORKSPACE
    assert prefs[E["CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES"]] == prov.ALIGNMENT
    assert _calls(fake.log, "heuristic") == [("heuristic", prov.REQUEST)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_descriptor_setup_transposes_dtypes_and_batches(fake, dtype):
    sig = gemm((64, 8), (32, 64), None, dtype=dtype, mode="gemm", transA=1, transB=1)
    prov.candidates("GemmAct", sig)
    sets = {e[2]: e[3] for e in _calls(fake.log, "desc_set")}
    assert sets[E["CUBLASLT_MATMUL_DESC_TRANSA"]] == 1 and sets[E["CUBLASLT_MATMUL_DESC_TRANSB"]] == 1
    lays = [e[2:] for e in _calls(fake.log, "layout")]
    assert lays == [(E[prov.DTYPES[dtype]], 64, 32, 64), (E[prov.DTYPES[dtype]], 8, 64, 8), (E[prov.DTYPES[dtype]], 32, 8, 32)]
    assert not _calls(fake.log, "layout_set")  # batch 1: no batch attributes
    fake.log.clear()
    prov.candidates("GemmAct", gemm((3, 7, 16), (3, 16, 9), dtype=dtype))
    batch = [(e[2], e[3]) for e in _calls(fake.log, "layout_set")]
    bc, so = E["CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT"], E["CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET"]
    assert batch == [(bc, 3), (so, 16 * 9), (bc, 3), (so, 7 * 16), (bc, 3), (so, 7 * 9)]


def test_algorithms_are_candidates_keyed_by_configuration_and_parse_back(fake):
    sig = gemm((8, 64), (64, 32), activation="Relu")
    keys = [c.key() for c in prov.candidates("GemmAct", sig)]
    assert keys == ["cublaslt",
                    "cublaslt:algo=21,tile=20,stages=8,splitk=1,red=0,swizzle=1,custom=0",
                    "cublaslt:algo=6,tile=18,stages=10,splitk=4,red=2,swizzle=0,custom=0",
                    "cublaslt:algo=21,tile=24,stages=8,splitk=1,red=0,swizzle=0,custom=1"]
    assert set(keys) <= {c.key() for c in registry.candidates_for(sig)}
    for k in keys:
        assert registry.candidate_from_key("GemmAct", k).key() == k
        assert registry.candidate_from_key("CBR", k).key() == k
    for bad in ("cublaslt:tile=3", "cublaslt:algo=x", "cublaslt:algo=1,warp=2", "cublasltx"):
        assert prov.from_key("GemmAct", bad) is None
    # the same algorithms listed in another order keep their keys (not list positions)
    prov._SETUPS.clear()
    fake.algos.reverse()
    assert sorted(c.key() for c in prov.candidates("GemmAct", sig)) == sorted(keys)


def test_cache_entries_of_algorithm_candidates(fake, tmp_path):
    sig = gemm((8, 64), (64, 32), activation="Relu")
    cand = prov.candidates("GemmAct", sig)[2]
    assert cand.source_hash() == "cublaslt:cublaslt=130100" and cand.versions() == (("cublaslt", "130100"),)
    rec = TimingRecord(gpu="h200", compute_capability="9.0", driver="13.0", cuda="13.0", cupy="14.2.0",
                       source_hash=cand.source_hash(), candidate=cand.key(), signature=sig.key(), op="GemmAct",
                       lowering=cand.name, params=cand.params_str(), ms=0.01)
    with TuningCache(tmp_path / "c.sqlite") as cache:
        cache.put(rec)
        found = cache.lookup(rec.fingerprint, sig.key(), {cand.key(): cand.source_hash()})
    assert found[cand.key()].params == "algo=6,tile=18,stages=10,splitk=4,red=2,swizzle=0,custom=0"
    assert registry.candidate_from_key("GemmAct", found[cand.key()].candidate) == cand


def test_build_declares_workspace_capture_and_launches_one_matmul(fake, monkeypatch):
    monkeypatch.setattr(prov, "_stream", lambda: 4242)
    sig = gemm((8, 64), (64, 32), activation="GeluTanh")
    cands = prov.candidates("GemmAct", sig)
    low = cands[3].build(sig, "sm_90")
    assert isinstance(low, Lowering) and low.capturable and low.barrier and low.outputs == 1 and low.layouts == ()
    assert low.workspace_bytes == 1 << 20 and low.versions == (("cublaslt", "130100"),)
    assert cands[0].build(sig, "sm_90").workspace_bytes == 0  # the heuristic's first algorithm
    # the signature's descriptor (for the heuristic), plus one per lowering with a bias: the bias
    # pointer is a descriptor attribute, and two nodes of one signature must not share it
    assert len(_calls(fake.log, "desc")) == 3
    a, b, c = np.zeros((8, 64), np.float16), np.zeros((64, 32), np.float16), np.zeros(32, np.float16)
    y, ws = np.zeros((8, 32), np.float16), np.zeros(1 << 20, np.uint8)
    fake.log.clear()
    low.launch([a, b, c], [y], ws)
    bias_set = [e for e in _calls(fake.log, "desc_set") if e[2] == E["CUBLASLT_MATMUL_DESC_BIAS_POINTER"]]
    assert [e[3] for e in bias_set] == [c.ctypes.data]
    (call,) = _calls(fake.log, "matmul")
    assert call[1:] == (1.0, b.ctypes.data, a.ctypes.data, 0.0, y.ctypes.data, y.ctypes.data, 2, ws.ctypes.data, 1 << 20)
    with pytest.raises(TuningError, match="aligned"):
        low.launch([a[:, 1:], b, c], [y], ws)


def test_two_nodes_of_one_signature_never_share_a_bias_pointer(fake, monkeypatch):
    """Each lowering with a bias sets its pointer on its own descriptor: a descriptor shared by the
    nodes of one signature could hand one node's bias to the other in a captured CUDA graph."""
    monkeypatch.setattr(prov, "_stream", lambda: 4242)
    sig = gemm((8, 64), (64, 32), activation="Relu")
    first, second = (prov.candidates("GemmAct", sig)[0].build(sig, "sm_90") for _ in range(2))
    a, b = np.zeros((8, 64), np.float16), np.zeros((64, 32), np.float16)
    c1, c2, y = np.zeros(32, np.float16), np.ones(32, np.float16), np.zeros((8, 32), np.float16)
    fake.log.clear()
    first.launch([a, b, c1], [y], None)
    second.launch([a, b, c2], [y], None)
    first.launch([a, b, c1], [y], None)
    bias = [(e[1], e[3]) for e in _calls(fake.log, "desc_set") if e[2] == E["CUBLASLT_MATMUL_DESC_BIAS_POINTER"]]
    descs = [call[2] if len(call) > 2 else None for call in _calls(fake.log, "matmul")]
    assert len({d for d, _ in bias}) == 2 and bias[0] == bias[2] and bias[0][1] == c1.ctypes.data
    assert bias[1][1] == c2.ctypes.data and len(descs) == 3


def test_a_key_from_elsewhere_is_rebuilt_from_its_configuration(fake):
    sig = conv((2, 24, 5, 7), (40, 24, 1, 1), activation="Relu")
    cand = prov.from_key("CBR", "cublaslt:algo=31,tile=5,stages=3,splitk=1,red=0,swizzle=0,custom=0,inner=2,cluster=1")
    low = cand.build(sig, "sm_90")
    assert low.workspace_bytes == 777 and low.layouts == ("NHWC", "", "NHWC", "NHWC", "NHWC")
    assert low.output_layout(3, 0) == low.output_layout(4, 0) == "NHWC"  # a CBR node with or without R
    assert ("algo_init", 31, E["CUDA_R_16F"]) in fake.log and ("algo_check",) in fake.log
    assert [e[1:] for e in _calls(fake.log, "algo_set")] == [
        (E["CUBLASLT_ALGO_CONFIG_TILE_ID"], 5), (E["CUBLASLT_ALGO_CONFIG_STAGES_ID"], 3),
        (E["CUBLASLT_ALGO_CONFIG_SPLITK_NUM"], 1), (E["CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME"], 0),
        (E["CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING"], 0), (E["CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION"], 0),
        (E["CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID"], 2), (E["CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID"], 1)]


def test_no_algorithm_is_an_error_at_build_and_only_the_heuristic_candidate(monkeypatch):
    lib = FakeLt(algos=[])
    monkeypatch.setattr(lt, "_STATE", {"api": lt.Api(lib), "reason": None})
    monkeypatch.setattr(prov, "_SETUPS", {})
    sig = gemm((8, 64), (64, 32))
    assert [c.key() for c in prov.candidates("GemmAct", sig)] == ["cublaslt"]
    with pytest.raises(TuningError, match="no algorithm"):
        prov.CublasLtGemm("cublaslt").build(sig, "sm_90")


def test_the_providers_package_imports_first():
    import subprocess
    import sys

    code = "from graphopt.providers import provider_reasons; print(sorted(provider_reasons()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-500:]
    assert "cublaslt" in done.stdout and "cudnn" in done.stdout


def test_every_cublaslt_function_called_has_a_declared_signature():
    """As for libcublas (test_blas_bound_calls): an undeclared ctypes call hands a Python int to C as a
    32-bit int. Every ``cublasLt*`` function the binding names is in its signature table."""
    import inspect
    import re

    from graphopt.providers import cublaslt_lib

    names = set(re.findall(r"\b(cublasLt[A-Z]\w*)\b", inspect.getsource(cublaslt_lib)))
    functions = {n for n in names if not n.endswith("_t")} - {"cublasLtGetVersion"}  # (declared on its own: no args)
    assert {"cublasLtMatmul", "cublasLtMatmulAlgoGetHeuristic"} <= functions
    assert functions <= set(cublaslt_lib._SIGNATURES), sorted(functions - set(cublaslt_lib._SIGNATURES))
