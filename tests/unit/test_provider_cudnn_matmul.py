"""The cuDNN matmul provider's CPU side (GemmAct as matmul + bias + activation): graph construction
for every variant (transposes as strides, batch, fold, bias broadcasts, activations) against a fake
``cudnn`` module that records the calls; plan keys parse back; absence is a reason."""

from __future__ import annotations

import types

import numpy as np
import pytest

from graphopt.kernels import registry
from graphopt.lowering import Lowering, Signature
from graphopt.providers import cudnn
from graphopt.providers import cudnn_matmul as prov

from _fake_cudnn import FakeGraph, fake_module


class _Graph(FakeGraph):
    OPS = ("matmul", "add", "relu", "leaky_relu", "sigmoid", "swish", "gelu", "gelu_approx_tanh")
    WORKSPACE_UNIT = 512
    NAMED_BY_OP = True


@pytest.fixture()
def fake(monkeypatch):
    mod, log = fake_module(["eng7_k24=24", "eng4_k24=23"], graph=_Graph)
    monkeypatch.setattr(cudnn, "_STATE", {"module": mod, "reason": None})
    monkeypatch.setattr(cudnn, "_GRAPHS", {})  # graphs are cached in cudnn.listed, one home for every cuDNN op
    return mod, log


def gemm(a, b, c=(), dtype="float16", **attrs):
    c = (b[-1],) if c == () else c
    attrs.setdefault("mode", "matmul")
    return Signature.make("GemmAct", [a, b, c], [dtype, dtype, dtype if c is not None else ""], attrs, layout="rowmajor")


def _tensors(log):
    return {e[1]: (e[2], e[3], e[4]) for e in log if e[0] == "tensor"}


def test_absent_frontend_is_a_reason_not_an_error(monkeypatch):
    monkeypatch.setattr(cudnn, "_STATE", {"module": None, "reason": "nvidia-cudnn-frontend is not importable (x)"})
    sig = gemm((8, 64), (64, 32), activation="Gelu")
    cands = prov.candidates("GemmAct", sig)
    assert [c.key() for c in cands] == ["cudnn"]
    assert "not importable" in cands[0].applies(sig, (9, 0))
    assert prov.candidates("CBR", sig) == []
    assert "cudnn" in [c.key() for c in registry.candidates_for(sig)]


@pytest.mark.parametrize("act, call", [("none", None), ("Relu", "relu"), ("Gelu", "gelu"), ("GeluTanh", "gelu_approx_tanh"),
                                       ("SiLU", "swish"), ("Sigmoid", "sigmoid"), ("LeakyRelu", "leaky_relu")])
def test_graph_matmul_bias_activation(fake, act, call):
    mod, log = fake
    sig = gemm((8, 64), (64, 32), activation=act)
    assert prov.CudnnMatmul("cudnn").applies(sig, (9, 0)) is None
    prov.matmul_graph(mod, "h", sig)
    ops = [e[0] for e in log]
    assert ops[:5] == ["pygraph", "tensor", "tensor", "matmul", "tensor"]
    assert log[0][1] == {"io_data_type": "HALF", "intermediate_data_type": "FLOAT", "compute_data_type": "FLOAT",
                         "handle": "h"}
    t = _tensors(log)
    assert t["A"] == ([1, 8, 64], [512, 64, 1], "HALF") and t["B"] == ([1, 64, 32], [2048, 32, 1], "HALF")
    assert t["C"][:2] == ([1, 1, 32], [32, 32, 1])  # a bias: broadcast over batch and rows
    assert next(e for e in log if e[0] == "add")[1]["b"] == "C"
    assert (call in ops) if call else not set(_Graph.OPS[2:]) & set(ops)
    assert ("set_output", call or "add", True) in log
    assert ("set_dim", call or "add", [1, 8, 32]) in log and ("set_stride", call or "add", [256, 32, 1]) in log


def test_graph_transposes_are_strides_and_batches(fake):
    mod, log = fake
    prov.matmul_graph(mod, "h", gemm((64, 8), (32, 64), (8, 32), dtype="bfloat16", mode="gemm", transA=1, transB=1))
    t = _tensors(log)
    assert t["A"] == ([1, 8, 64], [512, 1, 8], "BF16")    # stored [K, M]
    assert t["B"] == ([1, 64, 32], [2048, 1, 64], "BF16")  # stored [N, K]
    assert t["C"][:2] == ([1, 8, 32], [256, 32, 1])         # a full matrix C
    log.clear()
    prov.matmul_graph(mod, "h", gemm((3, 7, 16), (3, 16, 9), (3, 1, 9), dtype="float32"))
    t = _tensors(log)
    assert t["A"][:2] == ([3, 7, 16], [112, 16, 1]) and t["B"][:2] == ([3, 16, 9], [144, 9, 1])
    assert t["C"][:2] == ([3, 1, 9], [9, 9, 1])
    assert ("set_dim", "add", [3, 7, 9]) in log
    log.clear()
    prov.matmul_graph(mod, "h", gemm((3, 7, 16), (16, 9), None))  # B shared: the batch folds into M
    t = _tensors(log)
    assert t["A"][:2] == ([1, 21, 16], [336, 16, 1]) and t["B"][0] == [1, 16, 9] and "C" not in t
    assert ("set_dim", "matmul", [1, 21, 9]) in log


@pytest.mark.parametrize("sig, reason", [
    (gemm((8, 64), (64, 32), activation="QuickGelu"), "activation QuickGelu"),
    (gemm((8, 64), (64, 32), dtype="float64"), "dtype float64"),
    (gemm((8, 64), (64, 32), mode="gemm", alpha=0.5), "alpha or beta"),
    (gemm((2, 3, 8, 64), (3, 64, 32)), "partial batch broadcast"),
    (gemm((8, 64), (4, 64, 32), (4, 8, 32)), "shared by every batch"),
    (gemm((2, 3, 8, 64), (2, 3, 64, 32), (2, 1, 1, 32)), "only some batch dimensions"),
    (gemm((8, 64), (65, 32)), "inner dims differ"),
])
def test_unsupported_cases_are_reasons(sig, reason):
    assert reason in prov.matmul_reason(sig)


def test_plans_are_candidates_and_build_declares_the_contract(fake, monkeypatch):
    mod, log = fake
    sig = gemm((8, 64), (64, 32), activation="Relu")
    keys = [c.key() for c in prov.candidates("GemmAct", sig)]
    assert keys == ["cudnn", "cudnn:plan=eng7_k24=24", "cudnn:plan=eng4_k24=23"]
    assert set(keys) <= {c.key() for c in registry.candidates_for(sig)}
    for k in keys:
        assert registry.candidate_from_key("GemmAct", k).key() == k
    low = prov.CudnnMatmul("cudnn", (("plan", "eng4_k24=23"),)).build(sig, "sm_90")
    assert isinstance(low, Lowering) and low.workspace_bytes == 1024 and low.capturable and low.barrier and low.layouts == ()
    assert dict(low.versions) == {"cudnn": "91900", "cudnn_frontend": "1.32.0"}
    assert prov.CudnnMatmul("cudnn").applies(sig, (6, 1)).startswith("cuDNN fused graphs need")
    with pytest.raises(Exception, match="not offered"):
        prov.CudnnMatmul("cudnn", (("plan", "eng99"),)).build(sig, "sm_90")
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=9)),
                                 empty=lambda n, dtype=None: np.empty(n, np.uint8), uint8=np.uint8)
    monkeypatch.setitem(__import__("sys").modules, "cupy", cupy)
    low.launch([np.zeros((8, 64)), np.zeros((64, 32)), np.zeros(32)], [np.zeros((8, 32))], np.empty(1024, np.uint8))
    assert ("set_stream", 9) in log and ("execute", ["A", "B", "C", "relu"], 1) in log
    assert sum(e[0] == "pygraph" for e in log) == 1


class _NotedGraph(_Graph):
    """Plan 0 carries a reduced-precision note: the frontend bars it once that note is deselected."""

    def deselect_numeric_notes(self, notes):
        self.log.append(("deselect_numeric_notes", list(notes)))
        self.barred = {0}

    def _barred_indices(self):
        return getattr(self, "barred", set())


def test_plans_that_compute_with_less_precision_are_never_offered(fake, monkeypatch):
    """cuDNN plans noted REDUCED_PRECISION_REDUCTION, DOWN_CONVERT_INPUTS or Winograd are barred
    (cudnn.INEXACT_NOTES): not candidates, never the load-time default, and the others keep their own
    plan index."""
    mod, log = fake
    mod.numerical_note = types.SimpleNamespace(**{n: n for n in cudnn.INEXACT_NOTES})
    mod.pygraph = lambda **kw: _NotedGraph(log, ["eng7_k24=24", "eng4_k24=23", "eng0"], **kw)
    sig = gemm((8, 64), (64, 32), activation="Relu")
    keys = [c.key() for c in prov.candidates("GemmAct", sig)]
    assert keys == ["cudnn", "cudnn:plan=eng4_k24=23", "cudnn:plan=eng0"]
    assert ("deselect_numeric_notes", list(cudnn.INEXACT_NOTES)) in log
    prov.CudnnMatmul("cudnn").build(sig, "sm_90")  # the heuristic's first offered plan: index 1
    prov.CudnnMatmul("cudnn", (("plan", "eng0"),)).build(sig, "sm_90")
    assert [e for e in log if e[0] == "build_plan_at_index"] == [("build_plan_at_index", 1), ("build_plan_at_index", 2)]


def test_a_second_node_of_one_signature_gets_its_own_plan(fake):
    """Two lowerings of the same plan (two nodes of one signature in one model) never share a cuDNN
    graph or plan: the second is built on a private copy. Different plans of one signature share the
    listed graph (as the tuner builds them, one after the other)."""
    mod, log = fake
    sig = gemm((8, 64), (64, 32), activation="Relu")
    prov.candidates("GemmAct", sig)  # the listing: one graph
    graphs = lambda: sum(1 for e in log if e[0] == "pygraph")  # noqa: E731
    assert graphs() == 1
    prov.CudnnMatmul("cudnn", (("plan", "eng4_k24=23"),)).build(sig, "sm_90")
    prov.CudnnMatmul("cudnn").build(sig, "sm_90")  # another plan of the listed graph
    assert graphs() == 1
    prov.CudnnMatmul("cudnn").build(sig, "sm_90")  # the same plan again: a private copy
    prov.CudnnMatmul("cudnn").build(sig, "sm_90")
    assert graphs() == 3
    builds = [e[1] for e in log if e[0] == "build_plan_at_index"]
    assert builds == [1, 0, 0, 0]  # each copy builds the plan of the same name
