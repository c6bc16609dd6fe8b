"""Every model in models/, models/torch/ and the light ONNX-zoo models onnx ships runs on the
runtime's executor (device="numpy") and matches onnxruntime CPU within 1e-3 relative error; the
optimized files (graphopt.CBR / GemmAct) too, in fp32 and in fp16 (documented tolerance 1e-2).

onnx ships the zoo models under onnx/backend/test/data/real only as download stubs (data.json
with a URL); the "light" variants under data/light are real graphs whose weights are made by
ConstantOfShape nodes, so they exercise the same op coverage offline.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from _runtime_helpers import ort_run, random_feeds, rel_err
from graphopt.runtime import Session

ROOT = Path(__file__).resolve().parents[2]
FP16_RTOL = 1e-2  # max |fp16 run - ORT fp32| / max |ORT fp32|; measured <= 1.2e-3 on these models
SLOW_BYTES = 5 * 1024 * 1024


def _model_params():
    out = []
    for p in sorted((ROOT / "models").rglob("*.onnx")):
        marks = [pytest.mark.slow] if p.stat().st_size > SLOW_BYTES else []
        out.append(pytest.param(p, id=p.relative_to(ROOT / "models").as_posix(), marks=marks))
    return out


def _light_params():
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    slow = {"light_bvlc_alexnet.onnx", "light_densenet121.onnx", "light_inception_v2.onnx", "light_vgg19.onnx",
            "light_resnet50.onnx", "light_inception_v1.onnx"}
    return [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name in slow else [])
            for p in sorted(light.glob("*.onnx"))]


def _check(model, path_or_model, seed: int, dtype=None, tol=1e-3):
    feeds = random_feeds(model, np.random.default_rng(seed))
    want = ort_run(path_or_model, feeds)
    sess = Session(path_or_model, device="numpy", dtype=dtype)
    got = sess.run(feeds)
    assert list(got) == list(want), "outputs differ in names or order"
    for name, w in want.items():
        assert got[name].dtype == w.dtype, f"output {name}: dtype {got[name].dtype} vs {w.dtype}"
        err = rel_err(got[name], w)
        assert err <= tol, f"output {name}: relative error {err:.3g} > {tol}"
    return sess


@pytest.mark.parametrize("path", _model_params())
def test_model_matches_onnxruntime(path):
    model = onnx.load(path)
    sess = _check(model, str(path), seed=3)
    assert sess.last_peak_bytes and sess.last_peak_bytes > 0


@pytest.mark.parametrize("path", _light_params())
def test_onnx_zoo_light_model_matches_onnxruntime(path):
    _check(onnx.load(path), str(path), seed=4)


OPTIMIZED = ["resnet_style.onnx", "mobilenetv2_style.onnx", "transformer_block.onnx",
             "torch/resnet50_torchscript_op17.onnx", "torch/mobilenetv2_dynamo_op18.onnx",
             "torch/gpt2_dynamo_op18.onnx", "torch/bert_torchscript_op14.onnx", "torch/vit_torchscript_op17.onnx"]


@pytest.fixture(scope="module")
def optimized_models():
    import graphopt

    return {name: graphopt.optimize(str(ROOT / "models" / name), gpu="h200")[0] for name in OPTIMIZED}


@pytest.mark.parametrize("name", OPTIMIZED)
def test_optimized_model_fp32_and_fp16(name, optimized_models):
    opt = optimized_models[name]
    assert any(n.domain == "graphopt" for n in opt.graph.node), "the optimizer fused nothing: the test would not test custom ops"
    original = onnx.load(ROOT / "models" / name)
    feeds = random_feeds(original, np.random.default_rng(5))
    want = ort_run(original, feeds)
    for dtype, tol in ((None, 1e-3), ("float16", FP16_RTOL)):
        got = Session(opt, device="numpy", dtype=dtype).run(feeds)
        for out, w in want.items():
            assert got[out].dtype == w.dtype
            err = rel_err(got[out], w)
            assert err <= tol, f"{name} dtype={dtype} output {out}: relative error {err:.3g} > {tol}"


def test_cpu_device_delegates_to_onnxruntime_with_function_bodies(optimized_models):
    opt = optimized_models["resnet_style.onnx"]
    feeds = random_feeds(opt, np.random.default_rng(6))
    got = Session(opt, device="cpu").run(feeds)
    want = ort_run(onnx.load(ROOT / "models" / "resnet_style.onnx"), feeds)
    for name in want:
        assert rel_err(got[name], want[name]) <= 1e-4
