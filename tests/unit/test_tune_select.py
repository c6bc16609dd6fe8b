"""select_lowerings on small graphs built with onnx.helper and loaded into the IR (CPU)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.errors import UsageError
from graphopt.ir import from_model, to_model
from graphopt.lowering.contract import Candidate, Signature
from graphopt.tune.cache import TuningCache
from graphopt.tune.cache_record import TimingRecord
from graphopt.tune.candidate_run import FakeTimer
from graphopt.tune.gpus import DeviceInfo
from graphopt.tune.profiler import Profiler
from graphopt.tune.select import graphopt_version, node_signature, select_lowerings


def _init(name, shape, rng):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def build_model(batch="N") -> onnx.ModelProto:
    """x -> CBR(3x3) -> CBR(depthwise) -> CBR(1x1) -> If(then: GemmAct, else: GemmAct) ; plus a twin 3x3 CBR."""
    rng = np.random.default_rng(0)
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], activation="Relu")
    nodes = [
        helper.make_node("CBR", ["x", "w1", "b1", ""], ["t1"], name="cbr_3x3", domain="graphopt", **conv),
        helper.make_node("CBR", ["t1", "w2", "", ""], ["t2"], name="cbr_dw", domain="graphopt", group=32, **conv),
        helper.make_node("CBR", ["t2", "w3", "", ""], ["t3"], name="cbr_1x1", domain="graphopt",
                         kernel_shape=[1, 1], activation="none", lowering="stale", lowering_params="bm=1"),
        helper.make_node("CBR", ["x", "w1", "b1", ""], ["t1b"], name="cbr_twin", domain="graphopt", **conv),
        helper.make_node("ReduceMean", ["t3"], ["pooled"], name="pool", axes=[2, 3], keepdims=0),
    ]
    then_g = helper.make_graph(
        [helper.make_node("GemmAct", ["pooled", "fcw", "fcb"], ["then_out"], name="fc_then", domain="graphopt",
                          mode="matmul", activation="Gelu")],
        "then_body", [], [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [batch, 10])])
    else_g = helper.make_graph(
        [helper.make_node("GemmAct", ["pooled", "fcw", ""], ["else_out"], name="fc_else", domain="graphopt",
                          mode="matmul", activation="none")],
        "else_body", [], [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [batch, 10])])
    nodes.append(helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g))
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16, 20, 20]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10]),
         helper.make_tensor_value_info("t1b", TensorProto.FLOAT, [batch, 32, 20, 20])],
        initializer=[_init("w1", (32, 16, 3, 3), rng), _init("b1", (32,), rng), _init("w2", (32, 1, 3, 3), rng),
                     _init("w3", (64, 32, 1, 1), rng), _init("fcw", (64, 10), rng), _init("fcb", (10,), rng)],
        value_info=[helper.make_tensor_value_info("t1", TensorProto.FLOAT, [batch, 32, 20, 20]),
                    helper.make_tensor_value_info("t2", TensorProto.FLOAT, [batch, 32, 20, 20]),
                    helper.make_tensor_value_info("t3", TensorProto.FLOAT, [batch, 64, 20, 20]),
                    helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [batch, 64])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("graphopt", 1)])


@pytest.fixture
def graph():
    return from_model(build_model())


@pytest.fixture
def cache(tmp_path):
    with TuningCache(tmp_path / "tuning.sqlite3") as c:
        yield c


CUSTOM = ["cbr_3x3", "cbr_dw", "cbr_1x1", "cbr_twin", "fc_else", "fc_then"]


def lowerings(g):
    return {n.name: (n.attr("lowering"), n.attr("lowering_params")) for _, n in g.walk() if n.domain == "graphopt"}


def test_absent_gpu_uses_heuristic_and_says_so(graph):
    rep = select_lowerings(graph, "a100", devices=[])
    assert [r.node for r in rep.rows] == CUSTOM  # walk order: root graph, then the If's branches (attribute order)
    assert rep.mode == "heuristic" and not rep.present and rep.target == "a100"
    assert rep.summary == "target a100 not present: nothing was profiled; lowerings chosen by heuristic (6 nodes)"
    low = lowerings(graph)
    assert low["cbr_dw"] == ("direct", "opt=1")
    assert low["cbr_1x1"] == ("cublas_ws", "")  # the stale attribute was replaced
    assert low["cbr_3x3"] == ("cublas_ws", "")  # batch 1: few output pixels
    assert low["fc_then"] == ("cublas_ws", "") and low["fc_else"] == ("cublas_ws", "")
    assert all(r.mode == "heuristic" and r.reason.startswith("heuristic:") for r in rep.rows)
    assert graph.metadata["graphopt.target"] == "a100"
    assert graph.metadata["graphopt.mode"] == "heuristic"
    assert graph.metadata["graphopt.version"] == graphopt_version() != ""
    assert "graphopt.device" not in graph.metadata


def test_metadata_and_attributes_survive_save(graph):
    select_lowerings(graph, "rtx4090", devices=[])
    model = to_model(graph)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["graphopt.target"] == "rtx4090" and meta["graphopt.mode"] == "heuristic"
    cbr = next(n for n in model.graph.node if n.name == "cbr_dw")
    attrs = {a.name: helper.get_attribute_value(a) for a in cbr.attribute}
    assert attrs["lowering"] == b"direct" and attrs["lowering_params"] == b"opt=1"


def test_gpu_none_still_records_lowerings(graph):
    rep = select_lowerings(graph, "none")
    assert rep.mode == "none" and graph.metadata["graphopt.mode"] == "none"
    assert graph.metadata["graphopt.target"] == "none"
    assert rep.summary == "--gpu none: nothing was profiled; lowerings recorded by heuristic (6 nodes)"
    assert all(v[0] for v in lowerings(graph).values())


def test_auto_without_gpu(graph):
    rep = select_lowerings(graph, "auto", devices=[])
    assert rep.target == "none" and rep.mode == "heuristic"
    assert rep.summary.startswith("no GPU detected (--gpu auto): nothing was profiled")


def test_unknown_gpu_name_raises_before_touching_the_graph(graph):
    with pytest.raises(UsageError, match="h300"):
        select_lowerings(graph, "h300", devices=[])
    assert lowerings(graph)["cbr_dw"] == (None, None)
    assert "graphopt.mode" not in graph.metadata


def test_signature_uses_value_info_and_binds_symbolic_dims(graph):
    node = graph.node("cbr_3x3")
    sig, notes = node_signature(graph, node)
    assert sig.input_shapes[:3] == ((1, 16, 20, 20), (32, 16, 3, 3), (32,)) and sig.input_shapes[3] is None
    assert sig.dtypes == ("float32", "float32", "float32", "")
    assert notes == ["'N'=1 (default)"]
    assert "lowering" not in dict(sig.attrs) and dict(sig.attrs)["activation"] == "Relu"
    rep = select_lowerings(graph, "a100", devices=[], shapes={"x": (8, 16, 20, 20)})
    row = rep.rows[0]
    assert row.signature.startswith("CBR|8x16x20x20;32x16x3x3;32;-|float32,float32,float32,|")
    assert "dims" not in row.reason
    # the twin node has the same signature; the branches read the outer "pooled" (bound N too)
    by = {r.node: r for r in rep.rows}
    assert by["cbr_twin"].signature == row.signature
    assert by["fc_then"].signature.startswith("GemmAct|8x64;64x10;10|")
    assert by["fc_else"].signature.startswith("GemmAct|8x64;64x10;-|float32,float32,|")


def test_lowering_attrs_are_not_part_of_the_signature(graph):
    before = node_signature(graph, graph.node("cbr_1x1"))[0].key()
    graph.node("cbr_1x1").set_attr("lowering", "something")
    assert node_signature(graph, graph.node("cbr_1x1"))[0].key() == before
    assert "lowering" not in before


def test_deterministic(graph):
    other = from_model(build_model())
    select_lowerings(graph, "l4", devices=[])
    select_lowerings(other, "l4", devices=[])
    assert to_model(graph).SerializeToString() == to_model(other).SerializeToString()


# ------------------------------------------------------------------ cached mode (GPU absent)

def _rec(gpu, sig_key, cand, ms, **kw):
    name, _, params = cand.partition(":")
    base = dict(gpu=gpu, compute_capability="8.0", driver="12.4", cuda="12.4", cupy="13.3.0", source_hash="h",
                candidate=cand, signature=sig_key, op=sig_key.split("|")[0], lowering=name, params=params, ms=ms)
    base.update(kw)
    return TimingRecord(**base)


def test_absent_gpu_served_by_imported_cache_entries(graph, cache, tmp_path):
    sig = node_signature(graph, graph.node("cbr_3x3"))[0].key()
    other = TuningCache(tmp_path / "other.sqlite3")
    other.put_many([
        _rec("a100", sig, "implicit_gemm:bm=128,bn=64,bk=32,stages=4", 0.030),
        _rec("a100", sig, "direct", 0.090),
        _rec("a100", sig, "gemm_cublas", math.inf, status="build_failed", reason="nvrtc error"),
        _rec("h100", sig, "direct", 0.001),  # another GPU: must not be used for a100
    ])
    other.export(tmp_path / "a100.json")
    other.close()
    assert cache.import_(tmp_path / "a100.json") == 4
    rep = select_lowerings(graph, "a100", cache=cache, devices=[])
    by = {r.node: r for r in rep.rows}
    assert by["cbr_3x3"].mode == "cached" and by["cbr_twin"].mode == "cached"
    assert lowerings(graph)["cbr_3x3"] == ("implicit_gemm", "bm=128,bn=64,bk=32,stages=4")
    assert {t["candidate"] for t in by["cbr_3x3"].timings} == {
        "implicit_gemm:bm=128,bn=64,bk=32,stages=4", "direct", "gemm_cublas"}
    assert by["cbr_dw"].mode == "heuristic"
    assert rep.mode == "cached+heuristic" and graph.metadata["graphopt.mode"] == "cached+heuristic"
    assert rep.summary == ("target a100 not present: nothing was profiled; lowerings from tuning-cache entries "
                           "for a100 (2 nodes) and by heuristic (4 nodes)")
    # the h100 entry serves h100 only
    rep = select_lowerings(graph, "h100", cache=cache, devices=[])
    assert lowerings(graph)["cbr_3x3"] == ("direct", "")  # the h100 entry


# ------------------------------------------------------------------ profiled mode (fake device)

class FakeCand(Candidate):
    """A fake lowering: ``params`` carry its simulated time and whether it applies."""

    def applies(self, sig, cc):
        return self.param("skip")

    def source_hash(self):
        return "src-" + self.name

    def build(self, sig, arch):
        return _FakeLaunch(float(self.param("ms")))


class _FakeLaunch:
    def __init__(self, ms):
        self.ms = ms

    def __call__(self, inputs, outputs):
        return self.ms


def ok_checker(sig, launch):
    return None


def fake_candidates(sig: Signature):
    if sig.op == "GemmAct":
        return [FakeCand("cublas_epilogue", (("ms", 0.5),)), FakeCand("tiled_gemm", (("ms", 0.2),))]
    return [FakeCand("direct", (("ms", 1.0),)), FakeCand("implicit_gemm", (("bm", 64), ("ms", 0.25))),
            FakeCand("gemm_cublas", (("ms", 0.1), ("skip", "needs a 1x1 stride-1 conv")))]


H200 = DeviceInfo(0, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0")


class CountingCandidates:
    def __init__(self):
        self.calls = 0

    def __call__(self, sig):
        self.calls += 1
        return fake_candidates(sig)


def test_profiled_then_served_from_cache(graph, cache):
    cands = CountingCandidates()
    with Profiler(cands, timer=FakeTimer(3), checker=ok_checker, device=H200, cache=cache, isolate=False) as prof:
        rep = select_lowerings(graph, "h200", cache=cache, profile=prof, devices=[H200], progress=False)
    assert rep.mode == "profiled" and rep.present and graph.metadata["graphopt.mode"] == "profiled"
    assert "NVIDIA H200" in graph.metadata["graphopt.device"]
    low = lowerings(graph)
    assert low["cbr_3x3"] == ("implicit_gemm", "bm=64,ms=0.25")
    assert low["fc_then"] == ("tiled_gemm", "ms=0.2")
    row = rep.rows[0]
    assert [t["status"] for t in row.timings] == ["ok", "ok", "pruned"]
    assert row.timings[2]["reason"] == "needs a 1x1 stride-1 conv" and row.timings[2]["ms"] is None
    # 6 nodes, 5 distinct signatures (the twin shares cbr_3x3's): the twin is not re-timed
    assert rep.summary == "target h200 present (NVIDIA H200): 5 signatures profiled for 6 nodes"
    assert cands.calls == 5  # one listing per signature: the layout choice reads the profiler's
    assert len(cache) == 2 * 5  # pruned candidates are not stored
    # second run, fresh profiler: everything is served from the cache, nothing re-timed
    g2 = from_model(build_model())
    with Profiler(fake_candidates, timer=_ExplodingTimer(), checker=ok_checker, device=H200, cache=cache,
                  isolate=False) as prof:
        rep2 = select_lowerings(g2, "h200", cache=cache, profile=prof, devices=[H200], progress=False)
    assert rep2.mode == "cached" and all(r.mode == "cached" for r in rep2.rows)
    assert lowerings(g2) == low
    # the file records how the choices were made, not whether the cache was warm: same metadata
    assert g2.metadata == graph.metadata
    assert "6 nodes served from the tuning cache" in rep2.summary


class _ExplodingTimer:
    def __call__(self, launch, inputs, outputs):
        raise AssertionError("re-timed although cached")


def test_other_driver_entries_are_ignored_with_a_warning(graph, cache):
    sig = node_signature(graph, graph.node("cbr_dw"))[0].key()
    cache.put(_rec("h200", sig, "direct:ms=1.0", 0.0001, compute_capability="9.0", driver="12.0", source_hash="src-direct"))
    with Profiler(fake_candidates, timer=FakeTimer(3), checker=ok_checker, device=H200, cache=cache,
                  isolate=False) as prof:
        with pytest.warns(UserWarning, match="ignoring entries measured on h200 .*driver 12.0"):
            rep = select_lowerings(graph, "h200", cache=cache, profile=prof, devices=[H200], progress=False)
    assert lowerings(graph)["cbr_dw"] == ("implicit_gemm", "bm=64,ms=0.25")  # re-measured, not trusted
    assert any("driver 12.0" in m for m in rep.messages)


class AllFail(Candidate):
    def build(self, sig, arch):
        raise RuntimeError("nvrtc: error: identifier undefined")


def test_every_candidate_failing_falls_back_to_heuristic(graph):
    with Profiler(lambda s: [AllFail("implicit_gemm"), AllFail("direct")], timer=FakeTimer(), checker=ok_checker,
                  device=H200, isolate=False) as prof:
        rep = select_lowerings(graph, "h200", profile=prof, devices=[H200], progress=False)
    assert all(r.mode == "heuristic" for r in rep.rows) and rep.mode == "heuristic"
    assert "every candidate failed" in rep.rows[0].reason and "nvrtc" in rep.rows[0].reason
    assert lowerings(graph)["cbr_dw"] == ("direct", "opt=1")
    assert all(t["status"] == "build_failed" for t in rep.rows[0].timings)


def test_present_gpu_without_profiler_uses_local_cache(graph, cache):
    sig = node_signature(graph, graph.node("cbr_dw"))[0].key()
    fp = H200.fingerprint()
    cache.put(_rec("h200", sig, "direct:v=2", 0.01, compute_capability=fp.compute_capability, driver=fp.driver,
                   cuda=fp.cuda, cupy=fp.cupy))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rep = select_lowerings(graph, "h200", cache=cache, devices=[H200])
    assert lowerings(graph)["cbr_dw"] == ("direct", "v=2")
    assert rep.summary.startswith("target h200 present but no kernel candidates are available: nothing was profiled")


def test_shapes_of_rewritten_tensors_are_inferred_through_the_function_bodies():
    model = build_model()
    kept = [vi for vi in model.graph.value_info if vi.name not in ("t1", "t2")]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    g = from_model(model)
    assert g.value_info("t1").shape is None
    rep = select_lowerings(g, "a100", devices=[], shapes={"x": (2, 16, 20, 20)})
    by = {r.node: r for r in rep.rows}
    assert by["cbr_dw"].signature.startswith("CBR|2x32x20x20;32x1x3x3;-;-|float32,float32,,|")
    assert by["cbr_1x1"].signature.startswith("CBR|2x32x20x20;64x32x1x1;")
    assert lowerings(g)["cbr_dw"] == ("direct", "opt=1") and "dims" not in by["cbr_dw"].reason


def test_sequence_dims_default_to_128():
    rng = np.random.default_rng(1)
    node = helper.make_node("GemmAct", ["h", "w", "b"], ["y"], name="mlp", domain="graphopt", mode="matmul",
                            activation="Gelu")
    graph = helper.make_graph(
        [node], "mlp", [helper.make_tensor_value_info("h", TensorProto.FLOAT16, ["batch", "seq_len", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", "seq_len", 256])],
        initializer=[numpy_helper.from_array(rng.standard_normal((64, 256)).astype(np.float16), "w"),
                     numpy_helper.from_array(rng.standard_normal((256,)).astype(np.float16), "b")])
    g = from_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("graphopt", 1)]))
    row = select_lowerings(g, "h100", devices=[]).rows[0]
    assert row.signature.startswith("GemmAct|1x128x64;64x256;256|float16,float16,float16|")
    assert "'batch'=1 (default), 'seq_len'=128 (default)" in row.reason
    row = select_lowerings(g, "h100", devices=[], shapes={"h": (4, 77, 64)}).rows[0]
    assert row.signature.startswith("GemmAct|4x77x64;") and "default" not in row.reason


@pytest.mark.parametrize("mode, profiling, recorded", [
    ("cached", True, "profiled"), ("cached+heuristic", True, "profiled"), ("profiled", True, "profiled"),
    ("partial", True, "partial"), ("heuristic", True, "heuristic"),
    ("cached", False, "cached"), ("cached+heuristic", False, "cached+heuristic"), ("none", False, "none"),
])
def test_the_file_records_how_choices_were_made_not_whether_the_cache_was_warm(mode, profiling, recorded):
    """With the GPU present a warm run (cached, with or without heuristic fallbacks) writes what the
    cold run wrote (profiled, with the same fallbacks: overall_mode says profiled); without it the
    cache's entries were imported, and the file says so."""
    from graphopt.tune.select import file_mode

    assert file_mode(mode, profiling) == recorded
