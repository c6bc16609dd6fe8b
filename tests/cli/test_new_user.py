"""What a new user trips over (issue 16), each through the real ``graphopt`` command: options checked
before any work with exit 2 and one line, near-miss suggestions, rule values checked, truthful and
uncut displays, the --explain list of unfused chains, the --verify tolerance warning, whole --help."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.rewrite import load_rules
from tests.conftest import run_graphopt as graphopt


def _save(path, nodes, inputs, outputs, inits=(), opset=13):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def _conv_act(path, act="Relu", opset=13):
    """x [N, 3, 9, 9] -> Conv(8) -> act -> y."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node(act, ["c"], ["y"], name="act")]
    return _save(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 9, 9])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 9, 9])], [w, b], opset)


def _one_line_error(r, code):
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphopt: error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


# ----------------------------------------------------------------------------- options checked first
@pytest.mark.parametrize("value, expect", [
    ("nope=1x3x9x9", ["--shape nope=1x3x9x9", "no input 'nope'", "x [N, 3, 9, 9]"]),
    ("xx=1x3x9x9", ["no input 'xx'", "did you mean x?"]),
    ("x=1x3x9", ["--shape x=1x3x9", "has 4 dims [N, 3, 9, 9]", "gives 3"]),
    ("x=1x3xfoo", ["--shape 'x=1x3xfoo'", "'foo' is not a positive integer"]),
    ("x=0x3x9x9", ["--shape 'x=0x3x9x9'", "'0' is not a positive integer"]),
    ("x=1x4x9x9", ["--shape x=1x4x9x9", "dim 1 of input 'x' is fixed at 3", "[N, 3, 9, 9]"]),
])
def test_bad_shape_is_a_usage_error_before_any_work(tmp_path, value, expect):
    model = _conv_act(tmp_path / "m.onnx")
    line = _one_line_error(graphopt("optimize", model, "--gpu", "none", "--verify", "--shape", value), 2)
    for fragment in expect:
        assert fragment in line, line
    assert not (tmp_path / "m.opt.onnx").exists()


@pytest.mark.parametrize("command", [["verify", "{m}", "{m}"], ["run", "{m}", "--device", "cpu"],
                                     ["bench", "{m}", "--device", "numpy"]])
def test_every_command_checks_shape_against_the_model(tmp_path, command):
    model = _conv_act(tmp_path / "m.onnx")
    args = [str(model) if a == "{m}" else a for a in command]
    assert "dim 1 of input 'x' is fixed at 3" in _one_line_error(graphopt(*args, "--shape", "x=1x4x9x9"), 2)


def test_a_good_shape_still_works(tmp_path):
    r = graphopt("optimize", _conv_act(tmp_path / "m.onnx"), "--gpu", "none", "--verify", "--shape", "x=2x3x9x9")
    assert r.returncode == 0, r.stderr


def test_unknown_gpu_is_exit_2_with_the_closest_name(tmp_path):
    model = _conv_act(tmp_path / "m.onnx")
    line = _one_line_error(graphopt("optimize", model, "--gpu", "a1000"), 2)
    assert "unknown GPU name 'a1000'" in line and "did you mean a100" in line
    assert not (tmp_path / "m.opt.onnx").exists()
    assert "did you mean" not in _one_line_error(graphopt("optimize", model, "--gpu", "zzzz"), 2)


def test_unknown_disable_names_the_closest_rules_not_all(tmp_path):
    line = _one_line_error(graphopt("optimize", _conv_act(tmp_path / "m.onnx"), "--disable", "conv_relu_typo"), 2)
    assert "--disable conv_relu_typo" in line and "did you mean conv_relu" in line
    assert "matmul_bias" not in line and len(line) < 300


def test_run_input_of_the_wrong_dtype_is_exit_2(tmp_path):
    model = _conv_act(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 9, 9)))  # float64
    line = _one_line_error(graphopt("run", model, "--input", f"x={tmp_path / 'x.npy'}", "--device", "cpu"), 2)
    assert "--input x" in line and "float64" in line and "float32" in line


def test_verify_models_with_different_inputs_is_exit_2(tmp_path):
    a = _conv_act(tmp_path / "a.onnx")
    b = _save(tmp_path / "b.onnx", [helper.make_node("Relu", ["z"], ["y"])],
              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3])],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    line = _one_line_error(graphopt("verify", a, b), 2)
    assert "different inputs" in line and "a.onnx" in line and "b.onnx" in line
    c = _save(tmp_path / "c.onnx", [helper.make_node("Relu", ["x"], ["y"])],
              [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 3, 9, 9])],
              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 3, 9, 9])])
    assert "input 'x' is float" in _one_line_error(graphopt("verify", a, c), 2)


@pytest.mark.parametrize("args", [
    ["optimize", "{m}", "--rtol", "-1"], ["verify", "{m}", "{m}", "--atol", "-1"],
    ["bench", "{m}", "--repeats", "0"], ["bench", "{m}", "--batch", "0"], ["bench", "{m}", "--budget", "0"],
    ["optimize", "{m}", "--keep-fp32", "Softmax"], ["run", "{m}", "--seed", "-1"],
    ["optimize", "{m}", "--shape", "x=1x3x9x9", "--shape", "x=2x3x9x9"], ["run", "{m}", "--dtype", "fp16", "--device", "cpu"],
])
def test_every_bad_option_value_is_exit_2(tmp_path, args):
    model = _conv_act(tmp_path / "m.onnx")
    r = graphopt(*[str(model) if a == "{m}" else a for a in args])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


# ----------------------------------------------------------------------------- rules check
@pytest.mark.parametrize("replace, fragment", [
    ("graphopt.CBR(x, w, attrs=conv, activation='Clipp')", "unknown activation 'Clipp'; did you mean Clip?"),
    ("graphopt.CBR(x, w, attrs=conv, activation='Relu', colour=1)", "unknown attribute 'colour' for graphopt.CBR"),
    ("graphopt.CBR(x, w, attrs=conv, activation='LeakyRelu', act_alpha='big')", "act_alpha='big' must be a float"),
    ("LeakyRelu(conv, alpha='x')", "alpha='x' of LeakyRelu must be a float"),
])
def test_rules_check_validates_replace_values(tmp_path, replace, fragment):
    f = tmp_path / "mine.toml"
    f.write_text('# my rules\n\n[[rule]]\nname = "my_rule"\ndoc = "Conv -> Relu"\n'
                 f'pattern = "Relu(Conv(x, w) as conv)"\nreplace = "{replace}"\n')
    r = graphopt("rules", "check", f)
    assert r.returncode == 10, r.stderr
    assert f"{f}:7: rule my_rule: " in r.stderr and fragment in r.stderr, r.stderr
    # and optimize refuses the file instead of skipping the rule silently
    r = graphopt("optimize", _conv_act(tmp_path / "m.onnx"), "--gpu", "none", "--rules", f)
    assert r.returncode == 10 and fragment in r.stderr, r.stderr


# ----------------------------------------------------------------------------- truthful summary
def _rows(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 2 and cells[0]:
            rows[cells[0]] = cells[1]
    return rows


def test_summary_node_counts_add_up_and_gpu_none_says_one_thing(tmp_path):
    r = graphopt("optimize", _conv_act(tmp_path / "m.onnx"), "--gpu", "none")
    assert r.returncode == 0, r.stderr
    rows = _rows(r.stdout)
    before, after = int(rows["nodes before"]), int(rows["nodes after"])
    assert before - int(rows["cleanup: nodes removed"]) - int(rows["fusion rules: nodes removed"]) == after
    assert rows["  rule conv_relu (matches)".strip()] == "1"
    assert rows["target / mode"] == "none / heuristic" and "none / none" not in r.stdout
    assert "heuristic" in r.stdout and "tuned at" not in r.stdout


def test_tuned_at_lists_the_input_dims_only_when_tuned(tmp_path):
    r = graphopt("optimize", _conv_act(tmp_path / "m.onnx"), "--gpu", "a100")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("tuned at:"))
    assert line.startswith("tuned at: 'N'=1 ") and line.count("=") == 1


def test_ops_table_before_and_after(tmp_path):
    r = graphopt("optimize", _conv_act(tmp_path / "m.onnx"), "--gpu", "none", "--ops")
    assert r.returncode == 0, r.stderr
    assert "ops before / after" in r.stdout
    assert re.search(r"│ Conv\s+│\s+1 │\s+0 │\s+-1 │", r.stdout) and re.search(r"│ graphopt\.CBR\s+│\s+0 │\s+1 │\s+\+1 │", r.stdout)


def test_paths_and_rule_names_are_never_cut(tmp_path):
    deep = tmp_path / ("a_rather_long_folder_name_" * 3) / "and_another_long_one"
    deep.mkdir(parents=True)
    out = deep / "model_with_a_long_name.opt.onnx"
    r = graphopt("optimize", _conv_act(tmp_path / "m.onnx"), "--gpu", "none", "-o", out, env={"COLUMNS": "80"})
    assert r.returncode == 0 and str(out) in r.stdout and "…" not in r.stdout, r.stdout
    r = graphopt("rules", "list", env={"COLUMNS": "80"})
    assert r.returncode == 0 and "…" not in r.stdout
    names = set(re.findall(r"^│ (\S+)", r.stdout, flags=re.M))
    assert set(load_rules().names()) <= names


def test_inspect_shows_symbolic_dims_and_readable_opsets(tmp_path):
    r = graphopt("inspect", _conv_act(tmp_path / "m.onnx"))
    assert r.returncode == 0, r.stderr
    assert "float [N, 3, 9, 9]" in r.stdout and "float [N, 8, 9, 9]" in r.stdout
    assert "opsets ai.onnx 13," in r.stdout and "{" not in r.stdout.splitlines()[0]


def test_top_level_help_shows_each_description_whole():
    r = graphopt("--help", env={"COLUMNS": "80"})
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "..." not in r.stdout.split("Commands:")[1]
    assert "Op histogram, opsets, inputs/outputs with shapes, and which rules would fire." in text
    assert "Optimize MODEL: cleanup, fusion rules, lowering selection; write MODEL.opt.onnx." in text


# ----------------------------------------------------------------------------- explain and verify
def test_explain_lists_unfused_conv_gemm_activation_chains(tmp_path):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "gw"),
             numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "gb"),
             numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Tanh", ["c"], ["t"], name="tanh"),
             helper.make_node("Conv", ["x", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Add", ["t", "r2"], ["s"], name="add"),
             helper.make_node("Add", ["s", "c2"], ["s2"], name="add2"),  # conv2 has a second consumer
             helper.make_node("GlobalAveragePool", ["s2"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "gw", "gb"], ["g"], transB=1, name="fc"),
             helper.make_node("Softsign", ["g"], ["y"], name="softsign")]
    model = _save(tmp_path / "m.onnx", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    r = graphopt("optimize", model, "--gpu", "none", "--explain")
    assert r.returncode == 0, r.stderr
    assert "unfused Conv/Gemm/MatMul -> activation (3)" in r.stdout
    assert "Conv -> Tanh at 'conv' -> 'tanh': no rule fuses Conv -> Tanh" in r.stdout
    assert "Gemm -> Softsign at 'fc' -> 'softsign': no rule fuses Gemm -> Softsign" in r.stdout
    line = next(x for x in r.stdout.splitlines() if "at 'conv2' -> 'relu2'" in x)
    assert "conv_relu" in line and "consumer" in line, line


def test_verify_warns_when_outputs_are_too_small_for_the_tolerance(tmp_path):
    tiny = numpy_helper.from_array(np.array(1e-14, dtype=np.float32), "tiny")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "tiny"], ["y"])]
    model = _save(tmp_path / "m.onnx", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [tiny])
    for args in (["optimize", model, "--gpu", "none", "--verify"], ["verify", model, model]):
        r = graphopt(*args)
        assert r.returncode == 0, r.stderr
        assert "graphopt: warning: output 'y': every value is within atol 1e-05 of zero" in r.stderr, r.stderr
        assert "--atol below" in r.stderr
    r = graphopt("verify", model, model, "--atol", "1e-20")
    assert r.returncode == 0 and "warning" not in r.stderr


# ----------------------------------------------------------------------------- bench
def test_bench_on_the_cpu_adds_ort_optimized_and_per_op_fits_the_total(tmp_path):
    model = _conv_act(tmp_path / "m.onnx")
    r = graphopt("bench", model, "--device", "numpy", "--repeats", "3", "--warmup", "1")
    assert r.returncode == 0, r.stderr
    assert "│ ORT CPU, optimized" in r.stdout and "testing aid" in r.stdout
    eager = re.search(r"│ runtime numpy \(a testing aid\), optimized, eager\s+│ \d+\s+│ ([\d.]+)", r.stdout)
    per_op = r.stdout.split("per-op time")[1]
    total = sum(float(ms) for ms in re.findall(r"│ \S+\s+│ ([\d.]+)\s+│ [\d.]+% │", per_op))
    assert eager and 0 < total <= float(eager.group(1)) + 1e-3, r.stdout
