"""`graphopt optimize --precision fp16` (graphopt.precision): fp16 weights, I/O dtypes kept unless
--io-fp16, --keep-fp32 ops stay fp32, fusions still fire, results within the fp16 tolerance of the
fp32 original (onnxruntime and the runtime's executor), one-line errors, untouched input, determinism."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from graphopt.errors import GraphoptError, UnsupportedModel
from tests.conftest import run_graphopt as graphopt

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
from _runtime_helpers import ort_run, random_feeds, rel_err  # noqa: E402

pytest.importorskip("onnxconverter_common")


def _float_inits(model):
    return {np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)) for t in model.graph.initializer
            if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)}


@pytest.mark.parametrize("name", ["resnet_style.onnx", "transformer_block.onnx", "torch/gpt2_dynamo_op18.onnx"])
def test_fp16_model_matches_the_fp32_original_and_keeps_io_dtypes(name):
    import graphopt
    from graphopt.runtime import Session

    src = onnx.load(MODELS / name)
    out, report = graphopt.optimize(str(MODELS / name), gpu="none", precision="fp16")
    assert _float_inits(out) == {np.dtype(np.float16)}
    assert any(n.domain == "graphopt" for n in out.graph.node), "the fusions must still fire at fp16"
    assert [i.type.tensor_type.elem_type for i in out.graph.input] == [i.type.tensor_type.elem_type for i in src.graph.input]
    assert [o.type.tensor_type.elem_type for o in out.graph.output] == [o.type.tensor_type.elem_type for o in src.graph.output]
    assert report.precision == "fp16"
    feeds = random_feeds(src, np.random.default_rng(0))
    want = ort_run(src, feeds)
    for got in (ort_run(out, feeds), Session(out, device="numpy").run(feeds)):
        for k, w in want.items():
            assert got[k].dtype == w.dtype
            assert rel_err(got[k], w) <= 1e-2, (k, rel_err(got[k], w))
    # the custom ops were lowered for fp16 signatures (what the profiler measures on a GPU)
    cbr_or_gemm = [n for n in out.graph.node if n.domain == "graphopt"]
    assert all(any(a.name == "lowering" for a in n.attribute) for n in cbr_or_gemm)


def test_io_fp16_and_keep_fp32():
    import graphopt

    # (the attention rules would take the fp32 Softmax and its Casts into graphopt.Attention, whose
    # lowerings compute the softmax in fp32: off here, to see the Softmax the conversion kept)
    out, report = graphopt.optimize(str(MODELS / "transformer_block.onnx"), gpu="none", precision="fp16",
                                    io_fp16=True, keep_fp32=["Softmax"], disable=["attention_*"])
    assert all(i.type.tensor_type.elem_type == TensorProto.FLOAT16 for i in out.graph.input)
    assert all(o.type.tensor_type.elem_type == TensorProto.FLOAT16 for o in out.graph.output)
    softmax = [n for n in out.graph.node if n.op_type == "Softmax"]
    assert softmax, "the model has a Softmax"
    inferred = onnx.shape_inference.infer_shapes(out)
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(inferred.graph.input)}
    assert all(types[n.input[0]] == TensorProto.FLOAT for n in softmax)  # kept at fp32 behind a Cast
    assert "Softmax" in report.precision and "fp16 inputs/outputs" in report.precision


def test_keep_fp32_names_must_be_onnx_ops():
    from graphopt.precision import parse_keep_fp32

    assert parse_keep_fp32("Softmax, ReduceMean,Softmax") == ["ReduceMean", "Softmax"]
    with pytest.raises(GraphoptError, match="--keep-fp32 Softmx: not an ONNX op"):
        parse_keep_fp32("Softmx")


def test_a_conversion_the_converter_gets_wrong_is_a_one_line_error():
    """onnxconverter-common mistypes If branches that read outer-scope weights: refused, not written."""
    from graphopt.precision import convert_fp16

    with pytest.raises(UnsupportedModel) as e:
        convert_fp16(onnx.load(MODELS / "subgraph_if.onnx"), source="subgraph_if.onnx")
    assert "subgraph_if.onnx: the fp16 conversion" in str(e.value) and "--keep-fp32" in str(e.value)
    assert "\n" not in str(e.value)


def test_cli_fp16_verify_writes_deterministically_and_leaves_the_input(tmp_path):
    src = MODELS / "resnet_style.onnx"
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    outs = []
    for k in range(2):
        out = tmp_path / f"o{k}.onnx"
        r = graphopt("optimize", src, "-o", out, "--gpu", "none", "--precision", "fp16", "--verify",
                     "--report", tmp_path / f"r{k}.json")
        assert r.returncode == 0, r.stderr
        assert "precision" in r.stdout and "fp16" in r.stdout
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
    import json

    rep = json.loads((tmp_path / "r0.json").read_text())
    assert rep["precision"] == "fp16" and rep["verify"]["ok"] and rep["verify"]["rtol"] == 1e-2
    assert 0 < max(o["max_abs"] for o in rep["verify"]["outputs"])  # the error fp16 introduces is reported


def test_cli_refuses_fp16_flags_without_fp16_and_bad_conversions(tmp_path):
    r = graphopt("optimize", MODELS / "resnet_style.onnx", "-o", tmp_path / "o.onnx", "--io-fp16")
    assert r.returncode == 2 and "go with --precision fp16" in r.stderr and not (tmp_path / "o.onnx").exists()
    r = graphopt("optimize", MODELS / "subgraph_if.onnx", "-o", tmp_path / "o.onnx", "--precision", "fp16")
    assert r.returncode == 5 and "fp16 conversion" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("name", ["llamadyn_dynamo.onnx", "llamadyn_torchscript.onnx"])
def test_fp16_conversion_keeps_the_dims_the_fp32_graph_proves(name):
    """The converted model's own shape inference names a head split's batch dim afresh (``unk__``); the dims the
    fp32 IR knows come back (precision.restore_dims), so the rules that prove two dims equal fire at fp16 as at
    fp32: grouped K/V in the dynamic LLaMA exports (without them: 98 and 139 nodes, repeat_kv's Expands left)."""
    import graphopt

    path = str(MODELS / "coverage" / name)
    fp32, _ = graphopt.optimize(path, gpu="none")
    fp16, report = graphopt.optimize(path, gpu="none", precision="fp16")

    def groups(model):
        return [next((a.i for a in n.attribute if a.name == "kv_groups"), 1) for n in model.graph.node if n.op_type == "Attention"]

    assert groups(fp16) == groups(fp32) == [2, 2]
    assert len(fp16.graph.node) <= len(fp32.graph.node) + 1  # the converter's Cast of the int positions at most
