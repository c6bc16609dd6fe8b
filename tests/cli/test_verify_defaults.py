"""`--verify` and `graphopt verify` defaults (issue 18, items 3 and 9): the tolerance follows the
model's dtypes (fp16/bf16 models get 1e-2), symbolic dims take realistic sizes (batch 2, others
16) and mask inputs are all ones. CLI tests go through the real `graphopt` command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphopt.compare import default_tolerances, make_inputs
from tests.conftest import run_graphopt as graphopt

ROOT = Path(__file__).resolve().parents[2]
FP16_LLAMA = ROOT / "models" / "coverage" / "llama_fp16_torchscript.onnx"


def _dynamic_text_model(path: Path) -> Path:
    """ids [batch, seq] int64 and attention_mask [batch, seq] -> Gather(emb) * mask."""
    emb = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "emb")
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]),
             helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "ax"], ["mu"]),
             helper.make_node("Mul", ["e", "mu"], ["y"])]
    ax = numpy_helper.from_array(np.array([-1], dtype=np.int64), "ax")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
                                       helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])], [emb, ax])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_verify_uses_realistic_sizes_and_masks_of_ones(tmp_path):
    src = _dynamic_text_model(tmp_path / "m.onnx")
    r = graphopt("optimize", src, "--gpu", "none", "--verify", "--report", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    verify = json.loads((tmp_path / "r.json").read_text())["verify"]
    assert verify["input_shapes"] == {"ids": [2, 16], "attention_mask": [2, 16]}
    assert (verify["rtol"], verify["atol"]) == (1e-4, 1e-5)
    feeds = make_inputs(onnx.load(src))
    assert feeds["attention_mask"].dtype == np.int64 and (feeds["attention_mask"] == 1).all()


def test_fp16_model_is_verified_at_fp16_tolerances(tmp_path):
    r = graphopt("optimize", FP16_LLAMA, "-o", tmp_path / "o.onnx", "--gpu", "none", "--verify",
                 "--report", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    verify = json.loads((tmp_path / "r.json").read_text())["verify"]
    assert (verify["rtol"], verify["atol"]) == (1e-2, 1e-2)
    # graphopt verify picks the same defaults, and says which
    r = graphopt("verify", tmp_path / "o.onnx", FP16_LLAMA)
    assert r.returncode == 0, r.stderr
    assert "rtol 0.01, atol 0.01" in r.stdout.replace("\n", " ")
    # explicit tolerances still win
    r = graphopt("verify", tmp_path / "o.onnx", FP16_LLAMA, "--rtol", "0", "--atol", "0")
    assert r.returncode in (0, 9) and "rtol 0, atol 0" in r.stdout.replace("\n", " ")


def test_default_tolerances_follow_the_dtypes():
    fp32 = onnx.load(ROOT / "models" / "coverage" / "llama_torchscript.onnx")
    assert default_tolerances(fp32) == (1e-4, 1e-5)
    assert default_tolerances(fp32, onnx.load(FP16_LLAMA)) == (1e-2, 1e-2)
