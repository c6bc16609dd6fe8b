"""`--precision fp16` on the standard exports (issue 18, item 3): GPT-2, BERT, ViT and LLaMA from both
torch exporters convert, fuse at fp16 and verify at the fp16 tolerances. The fixes are graphopt's,
around onnxconverter-common: no-op Casts go before the conversion (the converter drops one that reads
a graph input without casting the input), the model's own Casts to float32 whose output the
converter declared float16 cast to float16, and nodes that read a graph output kept in fp32 read the
fp16 tensor before its final Cast."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import graphopt
from tests.conftest import run_graphopt

ROOT = Path(__file__).resolve().parents[2]
FILES = ["torch/gpt2_torchscript_op17.onnx", "torch/gpt2_dynamo_op18.onnx", "torch/bert_torchscript_op17.onnx",
         "torch/bert_dynamo_op18.onnx", "torch/vit_torchscript_op17.onnx", "torch/vit_dynamo_op18.onnx",
         "coverage/llama_torchscript.onnx", "coverage/llama_dynamo.onnx", "coverage/clipvision_torchscript.onnx"]


@pytest.mark.parametrize("file", FILES)
def test_fp16_conversion_fuses_and_verifies(file):
    optimized, report = graphopt.optimize(str(ROOT / "models" / file), gpu="none", precision="fp16", verify=True)
    assert report.verify["ok"] and report.verify["rtol"] == 1e-2
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in optimized.graph.initializer)
    assert report.custom_ops.get("Attention", 0) >= 1 and len(report.custom_ops) >= 2, report.custom_ops


def test_gpt2_torchscript_fp16_through_the_cli(tmp_path):
    r = run_graphopt("optimize", ROOT / "models/torch/gpt2_torchscript_op17.onnx", "-o", tmp_path / "o.onnx",
                     "--gpu", "none", "--precision", "fp16", "--verify")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o.onnx").exists()
