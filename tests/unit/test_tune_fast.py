"""Tuning is fast and honest (CPU, fake device, fake candidates and timer): identical signatures are
profiled once, the pending candidates' kernels are compiled up front in one batch, and a run cut
short by the tuning budget says so in the report and the model's metadata and is never "profiled"."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from graphopt.ir import from_model
from graphopt.lowering.contract import Candidate
from graphopt.tune.cache import TuningCache
from graphopt.tune.candidate_run import FakeTimer
from graphopt.tune.gpus import DeviceInfo
from graphopt.tune.profiler import Profiler
from graphopt.tune.results import SKIPPED
from graphopt.tune.select import META_CUT_SHORT, META_MODE, select_lowerings
from graphopt.tune.tuning_time import Budget

H200 = DeviceInfo(0, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0")
CONV = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], activation="Relu")


def _graph(n_twins: int = 4, distinct: int = 1):
    """``distinct`` chains of CBRs on x, each chain ``n_twins`` identical 3x3 CBRs (same signature)."""
    rng = np.random.default_rng(0)
    nodes, inits, outs = [], [], []
    for d in range(distinct):
        c = 8 * (d + 1)
        inits += [numpy_helper.from_array(rng.standard_normal((c, 8, 3, 3)).astype(np.float32), f"w{d}")]
        for k in range(n_twins):
            nodes.append(helper.make_node("CBR", ["x", f"w{d}", "", ""], [f"y{d}_{k}"], name=f"cbr{d}_{k}",
                                          domain="graphopt", **CONV))
            outs.append(helper.make_tensor_value_info(f"y{d}_{k}", TensorProto.FLOAT, [1, c, 10, 10]))
    g = helper.make_graph(nodes, "twins", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 10, 10])],
                          outs, initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("graphopt", 1)])
    return from_model(model)


BUILDS: list[str] = []


class Fake(Candidate):
    def applies(self, sig, cc):
        return self.param("skip")

    def source_hash(self):
        return "src-" + self.name

    def kernels(self, sig):
        return [("fake.cu", f"{self.name}<{sig.input_shapes[1][0]}>"), ("shared.cu", "common")]

    def build(self, sig, arch):
        BUILDS.append(self.name)
        ms = float(self.param("ms"))
        return lambda inputs, outputs: ms


def candidates(sig):
    return [Fake("a", (("ms", 0.5),)), Fake("b", (("ms", 0.2),)), Fake("c", (("ms", 0.1), ("skip", "never applies")))]


def ok(sig, launch):
    return None


def test_identical_signatures_are_profiled_once():
    BUILDS.clear()
    g = _graph(n_twins=5, distinct=2)
    with Profiler(candidates, timer=FakeTimer(3), checker=ok, device=H200, isolate=False) as prof:
        rep = select_lowerings(g, "h200", profile=prof, devices=[H200], progress=False)
    assert len(rep.rows) == 10 and all(r.mode == "profiled" for r in rep.rows)
    assert sorted(BUILDS) == sorted(["a", "b"] * 2)  # 2 signatures x 2 applicable candidates, nothing more
    assert rep.summary.startswith("target h200 present (NVIDIA H200): 2 signatures profiled for 10 nodes")
    assert rep.cut_short == "" and META_CUT_SHORT not in g.metadata


def test_pending_kernels_are_compiled_in_one_batch_first(tmp_path):
    calls = []
    g = _graph(n_twins=3, distinct=2)
    cache = TuningCache(tmp_path / "c.sqlite", warn=False)
    with Profiler(candidates, timer=FakeTimer(3), checker=ok, device=H200, cache=cache, isolate=False,
                  precompile=lambda jobs, arch: calls.append((list(jobs), arch))) as prof:
        select_lowerings(g, "h200", cache=cache, profile=prof, devices=[H200], progress=False)
    (jobs, arch), = calls  # one batch for the whole run
    assert arch == "sm_90"
    # the pruned candidate's kernels are not compiled; shared kernels once
    assert jobs == [("fake.cu", "a<8>"), ("shared.cu", "common"), ("fake.cu", "b<8>"), ("fake.cu", "a<16>"),
                    ("fake.cu", "b<16>")]
    # a second run is served from the tuning cache: nothing left to compile
    calls.clear()
    with Profiler(candidates, timer=FakeTimer(3), checker=ok, device=H200, cache=cache, isolate=False,
                  precompile=lambda jobs, arch: calls.append(jobs)) as prof:
        rep = select_lowerings(_graph(n_twins=3, distinct=2), "h200", cache=cache, profile=prof, devices=[H200],
                               progress=False)
    assert calls == [] and rep.mode == "cached"
    cache.close()


def test_a_failing_precompile_only_costs_the_speed_up():
    def broken(jobs, arch):
        raise RuntimeError("no NVRTC here")

    with Profiler(candidates, timer=FakeTimer(3), checker=ok, device=H200, isolate=False, precompile=broken) as prof:
        rep = select_lowerings(_graph(), "h200", profile=prof, devices=[H200], progress=False)
    assert rep.mode == "profiled"


class Clock:
    """Each reading advances one second: the budget runs out after a known number of candidates."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def test_budget_skips_what_is_left():
    budget = Budget(2.5, clock=Clock())
    assert budget() is None and budget() is None  # t=1 (start), t=2
    assert budget() is None  # t=3: 2 s spent
    assert "tuning budget of 2.5 s was spent" in budget()  # t=4: 3 s spent
    assert Budget(None)() is None


def test_a_run_cut_short_by_the_budget_is_never_reported_as_tuned(tmp_path):
    g = _graph(n_twins=2, distinct=2)
    cache = TuningCache(tmp_path / "c.sqlite", warn=False)
    with Profiler(candidates, timer=FakeTimer(3), checker=ok, device=H200, cache=cache, isolate=False,
                  budget_s=2.5) as prof:
        prof._profile_kw["deadline"] = Budget(2.5, clock=Clock())  # 3 candidates run, then the budget is spent
        rep = select_lowerings(g, "h200", cache=cache, profile=prof, devices=[H200], progress=False)
    assert rep.mode == "partial" and g.metadata[META_MODE] == "partial"
    assert rep.cut_short.startswith("tuning cut short: 2 nodes not fully tuned")
    assert rep.cut_short in rep.summary and g.metadata[META_CUT_SHORT] == rep.cut_short
    first, second = rep.rows[0], rep.rows[2]
    assert first.mode == "profiled" and second.mode == "partial"
    assert [t["status"] for t in second.timings] == ["ok", SKIPPED, "pruned"]
    assert "tuning cut short (1 candidate not run)" in second.reason
    assert rep.to_dict()["cut_short"] == rep.cut_short
    # skipped candidates are not cached: the next run (no budget) measures them and finishes
    g2 = _graph(n_twins=2, distinct=2)
    with Profiler(candidates, timer=FakeTimer(3), checker=ok, device=H200, cache=cache, isolate=False) as prof:
        rep2 = select_lowerings(g2, "h200", cache=cache, profile=prof, devices=[H200], progress=False)
    assert rep2.mode == "profiled" and rep2.cut_short == "" and META_CUT_SHORT not in g2.metadata
    assert {r.lowering for r in rep2.rows} == {"b"}
    cache.close()


def test_budget_spent_before_any_candidate_falls_back_to_the_heuristic():
    with Profiler(candidates, timer=FakeTimer(3), checker=ok, device=H200, isolate=False, budget_s=1e-9) as prof:
        prof._profile_kw["deadline"]()  # starts the clock
        rep = select_lowerings(_graph(n_twins=1), "h200", profile=prof, devices=[H200], progress=False)
    (row,) = rep.rows
    assert row.mode == "partial" and "no candidate finished" in row.reason and "heuristic:" in row.reason
    assert rep.mode == "partial"


def test_the_report_says_where_the_tuning_time_went():
    """``tuning_time``: seconds per phase (list, compile, build, check, time, other) and per lowering,
    and how many candidates ran; a run served from the cache runs none."""
    g = _graph(n_twins=2, distinct=2)
    with Profiler(candidates, timer=FakeTimer(3), checker=ok, device=H200, isolate=False,
                  precompile=lambda jobs, arch: None) as prof:
        rep = select_lowerings(g, "h200", profile=prof, devices=[H200], progress=False)
    tt = rep.to_dict()["tuning_time"]
    assert tt["candidates_run"] == 4  # 2 signatures x 2 applicable candidates
    assert set(tt["by_lowering_s"]) == {"a", "b"}
    assert {"list", "compile", "build", "check", "time", "other"} <= set(tt["phases_s"])
    assert all(v >= 0 for v in tt["phases_s"].values()) and tt["workers_started"] == 0
