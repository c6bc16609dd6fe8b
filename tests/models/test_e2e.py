"""End to end: optimize then verify every sample model, the torch exports and onnx's zoo models."""

from __future__ import annotations

import glob
from pathlib import Path

import onnx
import pytest

from graphopt.pipeline import optimize_file
from graphopt.compare import verify_models

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted(p for p in (ROOT / "models").rglob("*.onnx") if p.stat().st_size < 5_000_000 and ".opt." not in p.name)
ZOO = sorted(glob.glob(str(Path(onnx.__file__).parent / "backend/test/data/light/*.onnx")))
ACTIVATIONS = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSwish", "HardSigmoid"}


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: str(p.relative_to(ROOT / "models")))
def test_optimize_and_verify_sample_models(path, tmp_path):
    model, report = optimize_file(path, tmp_path / "o.onnx", gpu="a100", verify=True)
    onnx.checker.check_model(str(tmp_path / "o.onnx"), full_check=True)
    assert report.verify["ok"]
    assert report.nodes_after <= report.nodes_before
    # re-optimizing graphopt's own output changes nothing (idempotent)
    again, report2 = optimize_file(tmp_path / "o.onnx", tmp_path / "o2.onnx", gpu="a100")
    assert report2.rewrites == {} and (tmp_path / "o2.onnx").read_bytes() == (tmp_path / "o.onnx").read_bytes()


@pytest.mark.parametrize("path", ZOO, ids=lambda p: Path(p).stem)
def test_optimize_and_verify_onnx_zoo_models(path, tmp_path):
    _, report = optimize_file(path, tmp_path / "o.onnx", gpu="none", verify=True)
    assert report.verify["ok"]


def _convs_left_before_activation(model: onnx.ModelProto) -> list[str]:
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for t in n.input:
            consumers.setdefault(t, []).append(n)
    outputs = {o.name for o in model.graph.output}
    left = []
    for n in model.graph.node:
        if n.op_type != "Conv":
            continue
        chain = n
        for _ in range(3):  # Conv -> (Add) -> activation
            users = consumers.get(chain.output[0], [])
            if len(users) != 1 or chain.output[0] in outputs:
                break
            chain = users[0]
            if chain.op_type in ACTIVATIONS:
                left.append(n.name)
                break
            if chain.op_type != "Add":
                break
    return left


RESNET_EXPORTS = sorted((ROOT / "models" / "torch").glob("resnet*.onnx"))


@pytest.mark.parametrize("path", RESNET_EXPORTS, ids=lambda p: p.stem)
def test_every_conv_feeding_an_activation_becomes_cbr(path, tmp_path):
    model, report = optimize_file(path, tmp_path / "o.onnx", gpu="a100", verify=True)
    assert _convs_left_before_activation(model) == []
    assert report.custom_ops.get("CBR", 0) > 0


@pytest.mark.parametrize("base", ["resnet18", "resnet50", "mobilenetv2"])
def test_dynamo_and_torchscript_cnn_exports_optimize_to_the_same_ops(base, tmp_path):
    """The dynamo exporter writes global pooling as ReduceMean over the spatial axes (made GlobalAveragePool by
    cleanup, so it runs in the convolutions' layout) and the flatten as a Reshape: otherwise the two exports'
    optimized graphs hold the same ops."""
    import collections

    counts = []
    for name in (f"{base}_dynamo_op18.onnx", f"{base}_torchscript_op17.onnx"):
        model, _ = optimize_file(ROOT / "models" / "torch" / name, tmp_path / name, gpu="a100")
        counts.append(collections.Counter((n.domain, "Reshape" if n.op_type == "Flatten" else n.op_type)
                                          for n in model.graph.node))
    assert counts[0] == counts[1]
    assert ("", "ReduceMean") not in counts[0] and counts[0][("", "GlobalAveragePool")] == 1
