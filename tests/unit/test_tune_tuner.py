"""tune_graph: the wiring of devices, cache, backend and selection (CPU, fakes for the GPU parts)."""

from __future__ import annotations

import pytest

from graphopt.errors import UsageError
from graphopt.ir import from_model
from graphopt.tune.cache import TuningCache
from graphopt.tune.cache_file import CACHE_FILE
from graphopt.tune.candidate_run import FakeTimer
from graphopt.tune.gpus import DeviceInfo
from graphopt.tune.tuner import TuningBackend, tune_graph

from test_tune_select import FakeCand, build_model, fake_candidates, lowerings, ok_checker  # noqa: E402

H200 = DeviceInfo(0, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0")


def _no_buffers(sig):
    return [], []


BACKEND = TuningBackend(fake_candidates, FakeTimer(3), ok_checker, _no_buffers)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_profiles_then_second_run_is_served_from_the_default_cache(cache_dir):
    g = from_model(build_model())
    rep = tune_graph(g, "h200", devices=[H200], backend=BACKEND, isolate=False, progress=False)
    assert rep.mode == "profiled"
    assert (cache_dir / CACHE_FILE).exists()
    g2 = from_model(build_model())
    rep2 = tune_graph(g2, "auto", devices=[H200], backend=BACKEND, isolate=False, progress=False)
    assert rep2.mode == "cached" and lowerings(g2) == lowerings(g)


def test_isolated_profiling_through_tune_graph():
    g = from_model(build_model())
    rep = tune_graph(g, "h200", devices=[H200], backend=BACKEND, isolate=True, progress=False)
    assert rep.mode == "profiled" and lowerings(g)["cbr_3x3"] == ("implicit_gemm", "bm=64,ms=0.25")


def test_absent_gpu_uses_exported_timings(cache_dir, tmp_path):
    g = from_model(build_model())
    tune_graph(g, "h200", devices=[H200], backend=BACKEND, isolate=False, progress=False)
    with TuningCache(cache_dir / CACHE_FILE) as c:
        c.export(tmp_path / "h200.json")
        c.clear()
    with TuningCache(cache_dir / CACHE_FILE) as c:
        c.import_(tmp_path / "h200.json")
    g2 = from_model(build_model())
    rep = tune_graph(g2, "h200", devices=[], backend=BACKEND, progress=False)  # a CPU machine
    assert rep.mode == "cached" and not rep.present
    assert rep.summary == "target h200 not present: nothing was profiled; lowerings from tuning-cache entries for h200 (6 nodes)"
    assert lowerings(g2) == lowerings(g)


def test_present_gpu_without_kernels_backend_says_why(monkeypatch):
    import graphopt.tune.tuner as T

    monkeypatch.setattr(T, "kernels_backend", lambda: (None, "graphopt.kernels.check is not importable"))
    g = from_model(build_model())
    rep = tune_graph(g, "h200", devices=[H200], cache=False)
    assert rep.mode == "heuristic"
    assert "present but no kernel candidates are available: nothing was profiled" in rep.summary
    assert rep.messages[0] == "no profiling: graphopt.kernels.check is not importable"


def test_none_and_unknown():
    g = from_model(build_model())
    assert tune_graph(g, "none", devices=[H200]).mode == "none"
    with pytest.raises(UsageError):
        tune_graph(g, "quadro9000")


def test_unusable_cache_dir_is_reported_not_fatal(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(blocker / "sub"))  # a folder under a file cannot exist
    g = from_model(build_model())
    rep = tune_graph(g, "a100", devices=[])
    assert rep.mode == "heuristic" and rep.messages and rep.messages[0].startswith("tuning cache not used:")


class _WhereLaunch:
    def __call__(self, inputs, outputs):
        import os
        import time

        time.sleep(0.05)
        return float(os.environ.get("CUDA_VISIBLE_DEVICES", "-1")) + 1.0  # "time" = physical GPU + 1


class WhereAmI(FakeCand):
    """Reports, as its time, the GPU its worker was pinned to."""

    def build(self, sig, arch):
        return _WhereLaunch()


def _where_candidates(sig):
    return [WhereAmI("where")]


def test_tuning_spreads_over_every_visible_gpu_of_the_target_kind_only(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")  # an A100 at index 0, two H200s at 1 and 2
    devs = [DeviceInfo(0, "NVIDIA A100-SXM4-80GB", "a100", (8, 0), "13.0", "13.0", "14.2.0"),
            DeviceInfo(1, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0"),
            DeviceInfo(2, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0")]
    g = from_model(build_model())
    backend = TuningBackend(_where_candidates, FakeTimer(2), ok_checker, _no_buffers)
    rep = tune_graph(g, "h200", devices=devs, backend=backend, cache=False, isolate=True, progress=False)
    assert rep.mode == "profiled"
    assert "(NVIDIA H200 x 2: devices 1, 2)" in rep.summary
    where = {t["ms"] for row in rep.rows for t in row.timings}
    assert where and where <= {6.0, 8.0}, where  # never the A100 (physical 3 -> 4.0)


def test_tuning_workers_per_gpu_follow_cores_memory_and_the_environment(monkeypatch):
    from types import SimpleNamespace

    from graphopt.tune.tuner import WORKER_GPU_BYTES, default_workers_per_gpu

    monkeypatch.delenv("GRAPHOPT_TUNE_WORKERS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    big, small = SimpleNamespace(total_memory=141 << 30), SimpleNamespace(total_memory=WORKER_GPU_BYTES * 2 + 1)
    assert default_workers_per_gpu([big]) == 4  # one per four cores, at most 4
    assert default_workers_per_gpu([big, small]) == 2  # the smallest GPU holds two
    assert default_workers_per_gpu([SimpleNamespace(total_memory=0)]) == 4  # memory unknown
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert default_workers_per_gpu([big]) == 1
    monkeypatch.setenv("GRAPHOPT_TUNE_WORKERS", "3")
    assert default_workers_per_gpu([small]) == 3
