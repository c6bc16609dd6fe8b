"""The command line: summaries, exit codes, one-line errors, untouched inputs, determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import run_graphopt
from graphopt.errors import EXIT_CODES, InputNotFound, InvalidGraph, InvalidModel, OutputRefused, UnsafeExternalData, UnsupportedModel

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"


graphopt = run_graphopt


def _conv_relu_model(path: Path, opset=13) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"), helper.make_node("Relu", ["c"], ["y"], name="relu")]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 9, 9])],
        [w, b],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def test_help_lists_exit_codes():
    r = graphopt("optimize", "--help")
    assert r.returncode == 0
    for code in EXIT_CODES:
        assert f"{code:>3}  " in r.stdout


def test_optimize_writes_default_output_and_summary(tmp_path):
    src = _conv_relu_model(tmp_path / "m.onnx")
    before = src.read_bytes()
    r = graphopt("optimize", src, "--gpu", "a100", "--verify", "--report", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "m.opt.onnx"
    assert out.exists() and src.read_bytes() == before
    assert "nodes before" in r.stdout and "CBR" in r.stdout
    assert "nothing was profiled" in r.stdout
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["graphopt.target"] == "a100" and meta["graphopt.mode"] == "heuristic"
    cbr = [n for n in m.graph.node if n.domain == "graphopt"]
    assert len(cbr) == 1 and any(a.name == "lowering" for a in cbr[0].attribute)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["custom_ops"] == {"CBR": 1} and rep["verify"]["ok"]


def test_explain_lists_matches_and_near_misses(tmp_path):
    src = _conv_relu_model(tmp_path / "m.onnx")
    m = onnx.load(src)
    m.graph.output.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, ["N", 8, 9, 9]))  # intermediate is an output
    onnx.save(m, src)
    r = graphopt("optimize", src, "--gpu", "none", "--explain", "-o", tmp_path / "o.onnx")
    assert r.returncode == 0, r.stderr
    assert "near-misses" in r.stdout and "graph output" in r.stdout


def test_deterministic_output_across_runs_and_hash_seeds(tmp_path):
    src = MODELS / "resnet_style.onnx"
    outs = []
    for seed in ("0", "12345"):
        out = tmp_path / f"o{seed}.onnx"
        r = graphopt("optimize", src, "--gpu", "a100", "-o", out, "-q", env={"PYTHONHASHSEED": seed})
        assert r.returncode == 0, r.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def _bad_models(tmp_path: Path):
    good = _conv_relu_model(tmp_path / "good.onnx")
    data = good.read_bytes()
    cases = {}
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    cases["empty"] = (p, InvalidModel)
    p = tmp_path / "trunc.onnx"
    p.write_bytes(data[: len(data) // 3])
    cases["truncated"] = (p, InvalidModel)
    p = tmp_path / "text.onnx"
    p.write_text("this is not a model\n")
    cases["not onnx"] = (p, InvalidModel)
    cases["missing"] = (tmp_path / "nope.onnx", InputNotFound)
    m = onnx.load(good)
    m.opset_import[0].version = 7
    onnx.save(m, tmp_path / "opset7.onnx")
    cases["opset"] = (tmp_path / "opset7.onnx", UnsupportedModel)
    m = onnx.load(good)
    m.ir_version = 42
    onnx.save(m, tmp_path / "ir42.onnx")
    cases["ir_version"] = (tmp_path / "ir42.onnx", UnsupportedModel)
    m = onnx.load(good)
    m.graph.node[0].input[0] = "y"
    onnx.save(m, tmp_path / "cycle.onnx")
    cases["cycle"] = (tmp_path / "cycle.onnx", InvalidGraph)
    m = onnx.load(good)
    m.graph.node[1].input[0] = "ghost"
    onnx.save(m, tmp_path / "dangling.onnx")
    cases["dangling"] = (tmp_path / "dangling.onnx", InvalidGraph)
    m = onnx.load(good)
    m.graph.output.append(m.graph.output[0])
    onnx.save(m, tmp_path / "dupout.onnx")
    cases["duplicate outputs"] = (tmp_path / "dupout.onnx", InvalidGraph)
    m = onnx.load(good)
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    del t.float_data[:]
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="../../etc/passwd")
    onnx.save(m, tmp_path / "unsafe.onnx")
    cases["unsafe external data"] = (tmp_path / "unsafe.onnx", UnsafeExternalData)
    return cases


def test_bad_inputs_get_one_line_errors_and_distinct_codes(tmp_path):
    codes = {}
    for label, (path, error) in _bad_models(tmp_path).items():
        before = path.read_bytes() if path.exists() else None
        files_before = sorted(os.listdir(tmp_path))
        r = graphopt("optimize", path, "--gpu", "a100")
        assert r.returncode == error.exit_code, (label, r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("graphopt: error: "), (label, r.stderr)
        assert "Traceback" not in r.stderr
        assert sorted(os.listdir(tmp_path)) == files_before, label  # no output, no temp file
        if before is not None:
            assert path.read_bytes() == before, label
        codes.setdefault(error.exit_code, label)
    assert len(codes) >= 5


def test_output_equal_to_input_is_refused(tmp_path):
    src = _conv_relu_model(tmp_path / "m.onnx")
    before = src.read_bytes()
    r = graphopt("optimize", src, "-o", src)
    assert r.returncode == OutputRefused.exit_code and "refusing to overwrite" in r.stderr
    os.link(src, tmp_path / "alias.onnx")
    r = graphopt("optimize", src, "-o", tmp_path / "alias.onnx")
    assert r.returncode == OutputRefused.exit_code
    assert src.read_bytes() == before


BUGGY_RULE = """
[[rule]]
name = "buggy_conv_relu"
doc = "deliberately wrong: the Relu becomes a Sigmoid"
pattern = "Relu(Conv(x, w, b?) as conv)"
replace = "graphopt.CBR(x, w, b?, attrs=conv, activation='Sigmoid')"
"""


def test_verify_catches_a_wrong_rule_and_writes_nothing(tmp_path):
    src = _conv_relu_model(tmp_path / "m.onnx")
    rule = tmp_path / "buggy.toml"
    rule.write_text(BUGGY_RULE)
    args = ("optimize", src, "--rules", rule, "--disable", "conv_relu", "--verify", "--shape", "x=1x3x9x9", "-o", tmp_path / "o.onnx")
    r = graphopt(*args)
    assert r.returncode == 9, r.stderr
    assert "nothing was written" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.onnx").exists()
    # without --verify the (wrong) rule is applied: the check above is what caught it
    r = graphopt(*[a for a in args if a != "--verify"])
    assert r.returncode == 0 and (tmp_path / "o.onnx").exists()


def test_inspect_and_rules_commands(tmp_path):
    r = graphopt("inspect", MODELS / "resnet_style.onnx", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["ops"]["Conv"] >= 3 and info["rules_that_would_fire"]
    r = graphopt("rules", "list")
    assert r.returncode == 0 and "conv" in r.stdout.lower()
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\nname = "x"\npattern = "Relu(Conv(x, w)"\nreplace = "graphopt.CBR(x, w)"\n')
    r = graphopt("rules", "check", bad)
    assert r.returncode == 10 and "bad.toml" in r.stderr


def test_verify_command(tmp_path):
    src = _conv_relu_model(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    assert graphopt("optimize", src, "-o", out, "-q").returncode == 0
    r = graphopt("verify", out, src)
    assert r.returncode == 0, r.stderr
    other = _conv_relu_model(tmp_path / "other.onnx")
    m = onnx.load(other)
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.full(8, 5.0, np.float32), "b"))
    onnx.save(m, other)
    r = graphopt("verify", other, src)
    assert r.returncode == 9
