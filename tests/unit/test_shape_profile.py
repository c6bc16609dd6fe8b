"""--shape-profile buckets: parsing and checking, per-bucket selection with fake candidates and a
fake timer, the ``lowering_buckets`` record and the runtime's dispatch (``buckets.choose``) (CPU)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.errors import GraphoptError, TuningError, UsageError
from graphopt.ir import from_model
from graphopt.lowering.contract import Candidate
from graphopt.tune import buckets as B
from graphopt.tune.cache import TuningCache
from graphopt.tune.candidate_run import FakeTimer
from graphopt.tune.gpus import DeviceInfo
from graphopt.tune.profiler import Profiler
from graphopt.tune.select import DEFAULT_DIM, SEQ_DIM, select_lowerings

from test_tune_select import build_model, ok_checker  # noqa: E402

H200 = DeviceInfo(0, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0")


# ------------------------------------------------------------------------------ parsing
def test_parse_sorts_values_and_keeps_the_text():
    (p,) = B.parse_shape_profiles(["input.1=batch:32,1,8"])
    assert (p.input, p.dim, p.values, p.text) == ("input.1", "batch", (1, 8, 32), "input.1=batch:32,1,8")
    # an input name may contain ':' (TensorFlow style); the dim is after the last '='
    (q,) = B.parse_shape_profiles(["input:0=seq:128"])
    assert (q.input, q.dim, q.values) == ("input:0", "seq", (128,))


@pytest.mark.parametrize("item, fragment", [
    ("x=batch:1,a", "'a' is not an integer"),
    ("x=batch:1.5", "'1.5' is not an integer"),
    ("x=batch:0", "0 is not positive"),
    ("x=batch:-4", "-4 is not positive"),
    ("x=batch:", "the value list is empty"),
    ("x=batch:1,,8", "empty entry"),
    ("x=batch:1,8,1", "1 is given twice"),
    ("x=1,8", "expected NAME=DIM:V1,V2,..."),
    ("batch:1,8", "expected NAME=DIM:V1,V2,..."),
    ("=batch:1", "expected NAME=DIM:V1,V2,..."),
    ("x=:1", "expected NAME=DIM:V1,V2,..."),
])
def test_bad_items_are_one_line_usage_errors_naming_the_option(item, fragment):
    with pytest.raises(UsageError) as ei:
        B.parse_shape_profiles([item])
    msg = str(ei.value)
    assert msg.startswith(f"--shape-profile {item!r}: ") and fragment in msg and "\n" not in msg
    assert ei.value.exit_code == 2


def test_the_same_dim_of_the_same_input_twice_is_refused():
    with pytest.raises(UsageError, match=r"'x=N:2'.*already profiled by --shape-profile 'x=N:1,8'; give each dim once"):
        B.parse_shape_profiles(["x=N:1,8", "x=N:2"])


def test_api_mapping_form_goes_through_the_same_checks():
    assert [p.text for p in B.normalize_profile({"x": {"N": [8, 1]}})] == ["x=N:8,1"]
    assert B.normalize_profile({"x": {"N": 4}})[0].values == (4,)
    assert B.normalize_profile(None) == [] and B.normalize_profile([]) == []
    with pytest.raises(UsageError, match="is not an integer"):
        B.normalize_profile({"x": {"N": [1, 2.5]}})
    with pytest.raises(UsageError, match="is not positive"):
        B.normalize_profile({"x": {"N": [0]}})
    with pytest.raises(UsageError, match="expected a mapping of dim name to values"):
        B.normalize_profile({"x": [1, 8]})


# ------------------------------------------------------------------------------ checking against the graph
def _two_input_model(seq="seq") -> onnx.ModelProto:
    node = helper.make_node("Add", ["a", "b"], ["y"], name="add")
    g = helper.make_graph([node], "two",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", seq, 4]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", seq, 4]),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", seq, 4])],
                          initializer=[numpy_helper.from_array(np.zeros((4,), np.float32), "bias")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("items, shapes, fragment", [
    (["q=N:1"], None, "the model has no graph input 'q' (its inputs: a, b, s)"),
    (["bias=N:1"], None, "the model has no graph input 'bias'"),  # an initializer is not an input to bind
    (["a=M:1,2"], None, "'M' is not a symbolic dim of input 'a' (declared shape [N, seq, 4]; its symbolic dims: N, seq)"),
    (["a=4:1,2"], None, "'4' is not a symbolic dim of input 'a'"),
    (["s=N:1"], None, "it has no symbolic dims; use --shape for fixed shapes"),
    (["a=N:1,8", "b=N:1,8"], None, "dim 'N' is already profiled by --shape-profile 'a=N:1,8'"),
    (["a=N:1,8"], {"b": [2, 5, 4]}, "dim 'N' is also fixed by --shape b=...; drop it from one of them"),
    (["a=N:" + ",".join(map(str, range(1, 9))), "a=seq:" + ",".join(map(str, range(1, 10)))], None,
     "8 x 9 = 72 buckets, more than 64"),
])
def test_profiles_that_do_not_fit_the_model_are_refused(items, shapes, fragment):
    g = from_model(_two_input_model())
    with pytest.raises(UsageError) as ei:
        B.resolve_profile(g, items, shapes)
    assert fragment in str(ei.value) and str(ei.value).startswith("--shape-profile"), str(ei.value)


def test_buckets_are_the_product_in_ascending_order_by_dim_name():
    g = from_model(_two_input_model())
    res = B.resolve_profile(g, ["b=seq:512,128", "a=N:8,1"], {"s": [3, 4]})  # --shape of another input is fine
    assert [d.dim for d in res.dims] == ["N", "seq"]
    assert res.buckets() == [{"N": 1, "seq": 128}, {"N": 1, "seq": 512}, {"N": 8, "seq": 128}, {"N": 8, "seq": 512}]
    assert res.describe() == {"N": {"values": [1, 8], "source": "--shape-profile a"},
                              "seq": {"values": [128, 512], "source": "--shape-profile b"}}
    assert not B.resolve_profile(g, None) and B.resolve_profile(g, None).buckets() == []


# ------------------------------------------------------------------------------ the record and the dispatch
ROWS = [({"batch": 32}, "implicit_gemm", "bm=128"), ({"batch": 1}, "direct", "opt=1"), ({"batch": 8}, "cublas", "")]


def test_encode_is_sorted_compact_and_deterministic():
    text = B.encode(ROWS)
    assert text == B.encode(list(reversed(ROWS)))
    assert json.loads(text) == [
        {"dims": {"batch": 1}, "lowering": "direct", "params": "opt=1"},
        {"dims": {"batch": 8}, "lowering": "cublas", "params": ""},
        {"dims": {"batch": 32}, "lowering": "implicit_gemm", "params": "bm=128"},
    ]
    assert " " not in text


@pytest.mark.parametrize("actual, want", [
    (1, "direct"), (2, "cublas"), (7, "cublas"), (8, "cublas"), (9, "implicit_gemm"), (32, "implicit_gemm"),
    (1000, "implicit_gemm"),  # above every bucket: the last (largest) one
])
def test_choose_takes_the_first_bucket_at_or_above_the_actual_size(actual, want):
    assert B.choose(B.encode(ROWS), {"batch": actual})[0] == want


def test_choose_with_two_dims_needs_every_dim_at_or_above():
    rows = [({"N": n, "seq": s}, f"k{n}_{s}", "") for n in (1, 8) for s in (128, 512)]
    text = B.encode(rows)
    assert B.choose(text, {"N": 1, "seq": 100}) == ("k1_128", "")
    assert B.choose(text, {"N": 1, "seq": 300}) == ("k1_512", "")
    assert B.choose(text, {"N": 4, "seq": 128}) == ("k8_128", "")
    assert B.choose(text, {"N": 4, "seq": 513}) == ("k8_512", "")  # nothing covers it: the last
    assert B.choose(text, {"N": 9, "seq": 1}) == ("k8_512", "")


def test_choose_accepts_node_attributes_and_falls_back_to_lowering():
    attrs = {"lowering": "implicit_gemm", "lowering_params": "bm=128", "lowering_buckets": B.encode(ROWS)}
    assert B.choose(attrs, {"batch": 1}) == ("direct", "opt=1")
    assert B.choose({"lowering": "cublas", "lowering_params": ""}, {"batch": 3}) == ("cublas", "")
    assert B.choose(json.loads(B.encode(ROWS)), {"batch": 5}) == ("cublas", "")
    node = from_model(build_model()).node("cbr_1x1")  # has lowering="stale", no buckets
    assert B.choose(node, {}) == ("stale", "bm=1")


@pytest.mark.parametrize("value, fragment", [
    ("not json", "not valid JSON"),
    ("[]", "non-empty JSON list"),
    ('[{"dims": {}, "lowering": "a", "params": ""}]', "non-empty 'dims'"),
    ('[{"dims": {"N": 0}, "lowering": "a", "params": ""}]', "positive integers"),
    ('[{"dims": {"N": 1}, "lowering": "a"}, {"dims": {"M": 2}, "lowering": "b"}]', "bucket 1 has dims ['M']"),
    ('[{"dims": {"N": 1}, "params": ""}]', "string 'lowering'"),
])
def test_malformed_buckets_are_a_one_line_tuning_error(value, fragment):
    with pytest.raises(TuningError) as ei:
        B.choose(value, {"N": 1})
    assert fragment in str(ei.value) and "lowering_buckets" in str(ei.value)


def test_choose_refuses_missing_actual_dims():
    with pytest.raises(TuningError, match="dispatches on dim.s. batch, but actual_dims gives only"):
        B.choose(B.encode(ROWS), {"N": 3})
    with pytest.raises(TuningError, match="neither lowering_buckets nor lowering"):
        B.choose({}, {})


# ------------------------------------------------------------------------------ per-bucket selection
class ScaledCand(Candidate):
    """A fake lowering whose time grows with the batch: ``fixed + per_row * N`` ms."""

    def source_hash(self):
        return "src-" + self.name

    def build(self, sig, arch):
        BUILDS.append((self.name, sig.key()))
        n = sig.input_shapes[0][0]
        return _Launch(float(self.param("fixed")) + float(self.param("per_row")) * n)


class _Launch:
    def __init__(self, ms):
        self.ms = ms

    def __call__(self, inputs, outputs):
        return self.ms


BUILDS: list[tuple[str, str]] = []


def scaled_candidates(sig):
    # small batches: "lean" (0.1 ms per row); large batches: "wide" (1 ms fixed, 0.01 per row)
    return [ScaledCand("lean", (("fixed", 0.0), ("per_row", 0.1))), ScaledCand("wide", (("fixed", 1.0), ("per_row", 0.01)))]


def _lowering_nodes(g):
    return {n.name: n for _, n in g.walk() if n.domain == "graphopt"}


def test_each_bucket_is_tuned_and_recorded_largest_bucket_in_lowering():
    BUILDS.clear()
    g = from_model(build_model())
    with Profiler(scaled_candidates, timer=FakeTimer(3), checker=ok_checker, device=H200, isolate=False) as prof:
        rep = select_lowerings(g, "h200", profile=prof, devices=[H200], progress=False, shape_profile=["x=N:32,1,8"])
    assert rep.buckets == [{"N": 1}, {"N": 8}, {"N": 32}]
    nodes = _lowering_nodes(g)
    # 6 nodes x 3 buckets, node-major, buckets ascending
    assert [(r.node, r.dims["N"]) for r in rep.rows] == [(n, b) for n in
                                                         ["cbr_3x3", "cbr_dw", "cbr_1x1", "cbr_twin", "fc_else", "fc_then"]
                                                         for b in (1, 8, 32)]
    by = {(r.node, r.dims["N"]): r for r in rep.rows}
    assert [by["cbr_3x3", b].lowering for b in (1, 8, 32)] == ["lean", "lean", "wide"]  # 0.1/0.8/3.2 vs 1.01/1.08/1.32
    assert by["cbr_3x3", 8].signature.startswith("CBR|8x16x20x20;")
    for name, node in nodes.items():
        rec = json.loads(node.attr("lowering_buckets"))
        assert [r["dims"] for r in rec] == [{"N": 1}, {"N": 8}, {"N": 32}]
        assert [r["lowering"] for r in rec] == [by[name, b].lowering for b in (1, 8, 32)]
        assert (node.attr("lowering"), node.attr("lowering_params")) == (rec[-1]["lowering"], rec[-1]["params"])
        assert B.choose(node, {"N": 4})[0] == "lean" and B.choose(node, {"N": 9})[0] == "wide"
    # identical signatures (the twin shares cbr_3x3's at every bucket) are built and timed once:
    # 5 distinct node signatures x 3 buckets x 2 candidates
    assert len(BUILDS) == len(set(BUILDS)) == 5 * 3 * 2
    assert rep.summary == "target h200 present (NVIDIA H200): 15 signatures profiled for 18 node-buckets (6 nodes x 3 buckets)"
    assert rep.dims == {"N": {"values": [1, 8, 32], "source": "--shape-profile x"}}
    assert rep.dims_line() == "tuned at: 'N'=1,8,32 (--shape-profile x)"


def test_second_run_is_served_from_the_cache_for_every_bucket(tmp_path):
    with TuningCache(tmp_path / "t.sqlite3") as cache:
        g = from_model(build_model())
        with Profiler(scaled_candidates, timer=FakeTimer(3), checker=ok_checker, device=H200, cache=cache,
                      isolate=False) as prof:
            first = select_lowerings(g, "h200", cache=cache, profile=prof, devices=[H200], progress=False,
                                     shape_profile=["x=N:1,32"])
        BUILDS.clear()
        g2 = from_model(build_model())
        with Profiler(scaled_candidates, timer=FakeTimer(3), checker=ok_checker, device=H200, cache=cache,
                      isolate=False) as prof:
            second = select_lowerings(g2, "h200", cache=cache, profile=prof, devices=[H200], progress=False,
                                      shape_profile=["x=N:1,32"])
        assert BUILDS == [] and second.mode == "cached" and all(r.mode == "cached" for r in second.rows)
        assert [(r.node, r.dims, r.lowering) for r in second.rows] == [(r.node, r.dims, r.lowering) for r in first.rows]
        # an absent GPU with those entries (imported elsewhere) serves every bucket too
        g3 = from_model(build_model())
        third = select_lowerings(g3, "h200", cache=cache, devices=[], shape_profile=["x=N:1,32"])
        assert third.mode == "cached" and len(third.rows) == 12
        assert {n: v.attr("lowering_buckets") for n, v in _lowering_nodes(g3).items()} == \
            {n: v.attr("lowering_buckets") for n, v in _lowering_nodes(g2).items()}


def test_heuristic_and_none_modes_record_buckets_too():
    g = from_model(build_model())
    rep = select_lowerings(g, "a100", devices=[], shape_profile={"x": {"N": [1, 32]}})
    cbr = json.loads(_lowering_nodes(g)["cbr_3x3"].attr("lowering_buckets"))
    # the heuristic follows the pixel count: cuBLAS for batch 1's few pixels, a bn=128 tile at batch 32
    assert [(r["lowering"], r["params"].split(",")[1:2]) for r in cbr] == [("cublas_ws", []), ("implicit_gemm", ["bn=128"])]
    assert all(r.mode == "heuristic" for r in rep.rows) and "(6 nodes x 2 buckets)" in rep.summary
    assert "12 node-buckets" in rep.summary
    g = from_model(build_model())
    rep = select_lowerings(g, "none", devices=[], shape_profile=["x=N:2"])
    assert rep.mode == "none" and json.loads(_lowering_nodes(g)["cbr_dw"].attr("lowering_buckets"))[0]["dims"] == {"N": 2}


def test_without_a_profile_stale_buckets_go_and_the_dims_say_where_they_came_from():
    g = from_model(build_model())
    select_lowerings(g, "a100", devices=[], shape_profile=["x=N:1,8"])
    assert _lowering_nodes(g)["cbr_3x3"].has_attr("lowering_buckets")
    rep = select_lowerings(g, "a100", devices=[])
    assert not any(n.has_attr("lowering_buckets") for n in _lowering_nodes(g).values())
    assert rep.dims == {"N": {"values": [DEFAULT_DIM], "source": "default (DEFAULT_DIM)"}} and rep.buckets == []
    assert len(rep.rows) == 6 and all(r.dims == {} for r in rep.rows)
    rep = select_lowerings(g, "a100", devices=[], shapes={"x": (4, 16, 20, 20)})
    assert rep.dims == {"N": {"values": [4], "source": "--shape x"}}
    assert rep.dims_line() == "tuned at: 'N'=4 (--shape x)"


def test_a_profile_binds_only_its_dim_the_others_keep_their_defaults():
    rng = np.random.default_rng(1)
    node = helper.make_node("GemmAct", ["h", "w", "b"], ["y"], name="mlp", domain="graphopt", mode="matmul",
                            activation="Gelu")
    graph = helper.make_graph(
        [node], "mlp", [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", "seq_len", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq_len", 256])],
        initializer=[numpy_helper.from_array(rng.standard_normal((64, 256)).astype(np.float32), "w"),
                     numpy_helper.from_array(rng.standard_normal((256,)).astype(np.float32), "b")])
    g = from_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("graphopt", 1)]))
    rep = select_lowerings(g, "h100", devices=[], shape_profile=["h=batch:1,4"])
    assert [r.signature.split("|")[1].split(";")[0] for r in rep.rows] == [f"1x{SEQ_DIM}x64", f"4x{SEQ_DIM}x64"]
    assert rep.dims == {"batch": {"values": [1, 4], "source": "--shape-profile h"},
                        "seq_len": {"values": [SEQ_DIM], "source": "default (SEQ_DIM)"}}
    assert "'seq_len'=128 (default)" in rep.rows[0].reason


def test_a_bad_profile_fails_before_anything_is_recorded():
    g = from_model(build_model())
    with pytest.raises(GraphoptError, match="no graph input 'y'"):
        select_lowerings(g, "a100", devices=[], shape_profile=["y=N:1"])
    assert _lowering_nodes(g)["cbr_3x3"].attr("lowering") is None


def test_library_optimize_takes_a_profile_and_the_result_still_runs_under_onnxruntime(rng):
    import graphopt
    from tests.conftest import run_ort
    from tests.cli.test_shape_profile_cli import _model

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        model = onnx.load(_model(Path(d) / "m.onnx"))
    opt, report = graphopt.optimize(model, gpu="h100", shape_profile={"x": {"N": [16, 2]}})
    assert report.buckets == [{"N": 2}, {"N": 16}] and len(report.lowerings) == 2 * 2
    assert report.tuning_dims == {"N": {"values": [2, 16], "source": "--shape-profile x"}}
    assert all("lowering_buckets" in {a.name for a in n.attribute} for n in opt.graph.node if n.domain == "graphopt")
    again, _ = graphopt.optimize(model, gpu="h100", shape_profile=["x=N:2,16"])
    assert again.SerializeToString() == opt.SerializeToString()
    x = rng.standard_normal((5, 16, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(run_ort(opt, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(UsageError, match="no graph input 'y'"):
        graphopt.optimize(model, gpu="none", shape_profile={"y": {"N": [1]}})
