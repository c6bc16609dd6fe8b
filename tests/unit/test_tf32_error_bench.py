"""bench/tf32_error_cpu.py: its ONNX rounding is TF32's (11 significant bits, nearest), it rounds only
the chosen ops' operands, and the error it reports on a committed model is that of the rounding."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from _scripts import ROOT, load_script

bench = load_script("bench/tf32_error_cpu.py")


def _matmul_model(w: np.ndarray) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, w.shape[0]])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, w.shape[1]])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                          "g", [x], [y], [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_the_onnx_rounding_equals_tf32_rounding_of_both_operands():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((37, 5)).astype(np.float32)
    x = rng.standard_normal((3, 37)).astype(np.float32)
    emulated, count = bench.emulate_tf32(_matmul_model(w), {"MatMul"})
    assert count == 1
    (out,) = bench.run(emulated, {"x": x})
    want = np.maximum(bench.tf32_round(x).astype(np.float64) @ bench.tf32_round(w).astype(np.float64), 0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(bench.tf32_round(x), x)  # the rounding does something
    # the rounded values keep 10 mantissa bits
    assert np.all((bench.tf32_round(x).view(np.uint32) & 0x1FFF) == 0)


def test_ops_not_named_are_left_alone(tmp_path):
    model = _matmul_model(np.ones((4, 2), np.float32))
    emulated, count = bench.emulate_tf32(model, {"Conv"})
    assert count == 0 and [n.op_type for n in emulated.graph.node] == ["MatMul", "Relu"]
    assert len(model.graph.initializer) == 1  # the input model is not modified


def test_a_committed_model_reports_a_small_error(tmp_path):
    out = tmp_path / "e.json"
    assert bench.main(["--model", f"r={ROOT / 'models' / 'resnet_style.onnx'}", "--shape", "r:input=1,3,32,32",
                       "--seeds", "1", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["nodes_rounded"] > 0 and 0 < row["max_rel_err"] < 1e-2
