"""The README's examples run, so the docs cannot rot: the rule walkthrough and the library snippet."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import run_graphopt

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _block_after(marker: str, lang: str) -> str:
    m = re.search(rf"<!-- {re.escape(marker)} -->\s*```{lang}\n(.*?)```", README, re.S)
    assert m, f"README lost its {marker} block"
    return m.group(1)


def _code_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def _relu6_as_min_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")
    six = numpy_helper.from_array(np.array(6.0, np.float32), "six")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Min", ["six", "r"], ["y"], name="min6"),  # operand order swapped on purpose
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 7, 7])],
        [w, b, six],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _cli(*args, cwd):
    return run_graphopt(*args, cwd=cwd)


def test_writing_a_fusion_rule_walkthrough(tmp_path):
    rules = tmp_path / "my_rules"
    rules.mkdir()
    (rules / "relu6.toml").write_text(_block_after("readme:rule-example", "toml"))
    model = _relu6_as_min_model(tmp_path / "model.onnx")
    r = _cli("rules", "check", "my_rules/relu6.toml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = _cli("optimize", "model.onnx", "--rules", "my_rules/", "--explain", "--verify", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "conv_relu_min6" in r.stdout
    out = onnx.load(tmp_path / "model.opt.onnx")
    ops = [(n.domain, n.op_type) for n in out.graph.node]
    assert ops == [("graphopt", "CBR")], ops
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in out.graph.node[0].attribute}
    assert attrs["activation"] == b"Clip" and attrs["clip_min"] == 0.0 and attrs["clip_max"] == 6.0
    # without the user's rule, the shipped conv_relu fires and the Min stays
    r = _cli("optimize", "model.onnx", "-o", "plain.onnx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [n.op_type for n in onnx.load(tmp_path / "plain.onnx").graph.node] == ["CBR", "Min"]


def test_library_snippet_runs(tmp_path, monkeypatch):
    snippet = next(b for b in _code_blocks("python") if "graphopt.optimize(" in b)
    src = ROOT / "models" / "resnet_style.onnx"
    (tmp_path / "model.onnx").write_bytes(src.read_bytes())
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "README.md", "exec"), {})
    out = onnx.load(tmp_path / "model.opt.onnx")
    assert any(n.domain == "graphopt" for n in out.graph.node)


def test_ci_commands_are_the_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "ci:main" in ci and "ci:test" in ci
    main_cmd = _block_after("ci:main", "bash").strip()
    test_cmd = _block_after("ci:test", "bash").strip()
    assert "pip install ." in main_cmd and "graphopt optimize models/" in main_cmd
    assert "pytest" in test_cmd and ".[test,nvrtc]" in test_cmd  # CI runs the NVRTC kernel-compile tests too
    model = main_cmd.split("graphopt optimize ")[1].split()[0]
    assert (ROOT / model).exists()
