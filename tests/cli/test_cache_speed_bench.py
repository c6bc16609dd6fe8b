"""bench/cache_speed.py: its cache verdict, and its dry run on CPU (``--gpu none``) end to end."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("cache_speed", ROOT / "bench" / "cache_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("rep, served", [
    ({"mode": "cached", "lowerings": []}, True),
    ({"mode": "cached+heuristic", "lowerings": [{"mode": "cached"}, {"mode": "cached"}]}, True),
    ({"mode": "profiled", "lowerings": [{"mode": "cached"}, {"mode": "profiled"}]}, False),
    ({"mode": "cached+heuristic", "lowerings": [{"mode": "cached"}, {"mode": "heuristic"}]}, False),
    # every candidate of the second node failed in the first run: its failures are served from the cache
    ({"mode": "cached+heuristic", "lowerings": [
        {"mode": "cached"},
        {"mode": "heuristic", "timings": [{"status": "wrong_answer", "cached": True}, {"status": "pruned"}]}]}, True),
    # ... but one of them timed out then (never cached) and was measured again
    ({"mode": "cached+heuristic", "lowerings": [
        {"mode": "cached"},
        {"mode": "heuristic", "timings": [{"status": "wrong_answer", "cached": True},
                                          {"status": "timeout", "cached": False}]}]}, False),
    ({"mode": "heuristic", "lowerings": []}, False),
    ({"mode": "none", "lowerings": [{"mode": "none"}]}, False),
])
def test_served_from_cache_needs_every_node_cached(rep, served):
    assert _bench().served_from_cache(rep) is served


def test_dry_run_on_cpu_runs_both_optimizes_and_says_it_checked_nothing(tmp_path, capsys):
    from tests.cli.test_shape_profile_cli import _model

    model = _model(tmp_path / "m.onnx")
    out = tmp_path / "res.json"
    assert _bench().main(["--gpu", "none", "--model", str(model), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "DRY RUN" in err and "nothing about the cache was checked" in err
    res = json.loads(out.read_text())
    assert res["dry_run"] is True and res["second_served_from_cache"] is False
    assert res["first"]["mode"] == res["second"]["mode"] == "none"
    assert res["first"]["custom_ops"] == {"CBR": 2}
    assert res["outputs_byte_identical"] is True
    assert res["command"].startswith("graphopt optimize ") and "--gpu none" in res["command"]
    assert res["first_run_s"] > 0 and res["second_run_s"] > 0
    for key in ("date", "gpu", "versions", "command", "note"):
        assert res[key]


def test_cold_only_runs_merge_into_one_file_by_model(tmp_path, capsys):
    from tests.cli.test_shape_profile_cli import _model

    model = _model(tmp_path / "m.onnx")
    out = tmp_path / "res.json"
    bench = _bench()
    assert bench.main(["--gpu", "none", "--model", str(model), "--out", str(out), "--label", "resnet50"]) == 0
    assert bench.main(["--gpu", "none", "--model", str(model), "--out", str(out), "--label", "gpt2", "--cold-only"]) == 0
    res = json.loads(out.read_text())
    assert res["model"] == "resnet50" and res["cold_s"] > 0 and res["warm_s"] > 0  # the top level stays the first model's
    models = {m["model"]: m for m in res["models"]}
    assert set(models) == {"resnet50", "gpt2"}
    assert models["gpt2"]["cold_s"] > 0 and models["gpt2"]["warm_s"] is None
    assert models["resnet50"]["cold_kernel_cache"] == "fresh"
