"""bench/cache_speed.py: its cache verdict, and its dry run on CPU (``--gpu none``) end to end."""

from __future__ import annotations

import json

import pytest
from _scripts import load_script



def _bench():
    return load_script("bench/cache_speed.py")


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


def test_dry_run_on_cpu_runs_cold_and_warm_and_says_it_checked_nothing(tmp_path, capsys):
    from tests.cli.test_shape_profile_cli import _model

    model = _model(tmp_path / "m.onnx")
    out = tmp_path / "res.json"
    assert _bench().main(["--gpu", "none", "--model", str(model), "--out", str(out), "--batch", "0"]) == 0
    err = capsys.readouterr().err
    assert "DRY RUN" in err and "nothing about the cache was checked" in err
    res = json.loads(out.read_text())
    assert res["dry_run"] is True and res["model"] == "m"
    assert res["cold_s"] > 0 and res["warm_s"] > 0
    (run,) = res["runs"]
    assert run["cold_s"] == res["cold_s"] and run["warm_s"] == res["warm_s"]
    assert run["warm_served_from_cache"] is False
    assert run["cold"]["mode"] == run["warm"]["mode"] == "none"
    assert run["cold"]["custom_ops"] == {"CBR": 2}
    assert run["outputs_byte_identical"] is True
    assert run["command"].startswith("graphopt optimize ") and "--gpu none" in run["command"]
    assert "--shape" not in run["command"]
    for key in ("date", "gpu", "versions", "note", "method"):
        assert res[key]


def test_out_dir_names_the_file_after_the_gpu(tmp_path):
    from tests.cli.test_shape_profile_cli import _model

    model = _model(tmp_path / "m.onnx")
    assert _bench().main(["--gpu", "none", "--model", str(model), "--out-dir", str(tmp_path / "OUT"),
                          "--batch", "0", "--limit", "120"]) == 0
    res = json.loads((tmp_path / "OUT" / "cache_speed_none.json").read_text())
    assert res["runs"][0]["cold_exit"] == res["runs"][0]["warm_exit"] == 0


def test_a_failed_run_is_recorded_and_fails_the_script(tmp_path):
    from tests.cli.test_shape_profile_cli import _model

    model = _model(tmp_path / "m.onnx")  # its input is 'x': --shape input=... is refused (exit 2)
    assert _bench().main(["--gpu", "none", "--model", str(model), "--out", str(tmp_path / "r.json")]) == 1
    (run,) = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert run["cold_exit"] == 2 and "input" in run["cold_error"] and "warm_s" not in run


def test_output_differences_names_the_node_and_attribute(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    def model(lowering, meta):
        node = helper.make_node("Relu", ["x"], ["y"], name="act0")
        node.attribute.append(helper.make_attribute("lowering", lowering))
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        m = helper.make_model(g)
        helper.set_model_props(m, {"graphopt.target": meta})
        return m

    a, b, c = tmp_path / "a.onnx", tmp_path / "b.onnx", tmp_path / "c.onnx"
    onnx.save(model("cudnn:plan=eng4", "h200"), str(a))
    onnx.save(model("cudnn:plan=eng9", "h200"), str(b))
    onnx.save(model("cudnn:plan=eng4", "a100"), str(c))
    diff = _bench().output_differences(a, b)
    assert diff["attributes"] == [{"node": "act0", "op": "Relu", "differs": {"lowering": ["cudnn:plan=eng4", "cudnn:plan=eng9"]}}]
    assert "model_fields" not in diff
    meta = _bench().output_differences(a, c)
    assert meta["attributes"] == [] and meta["model_fields"] == ["metadata_props"]
