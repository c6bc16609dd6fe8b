"""The convolution-then-epilogue cuDNN CBR (graphopt.providers.cudnn_split) on the GPU, all three forms (the
operands as given, channel-padded, and declared 32-byte aligned): every plan it offers for stems with 1, 3 and 4 input channels (odd sizes, stride 2, asymmetric pads, with and without a bias,
the stem activations, fp16 and fp32) against the float64 reference with NaN-poisoned outputs
(_provider_check); the scalar pass where the bias is not 16-byte aligned; two nodes of one signature
captured into one CUDA graph; one lowering captured and replayed equal to its eager run."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402
from _provider_check import STEM_GEOMS, captured_pair_errors, check_plans, eager_and_replayed, host_inputs, reference  # noqa: E402

require_device()

from graphopt.lowering import Signature, as_lowering  # noqa: E402
from graphopt.providers import cudnn, cudnn_split as prov  # noqa: E402

if cudnn.unavailable():
    pytest.skip(cudnn.unavailable(), allow_module_level=True)

GEOMS = STEM_GEOMS
FAMILIES = [prov.NAME, prov.NAME_PAD]  # operands as given, channel-padded
CLASSES = {prov.NAME: prov.CudnnSplitConv, prov.NAME_PAD: prov.CudnnSplitPaddedConv}
ACTS = [("Relu", {}), ("Clip", {"clip_min": 0.0, "clip_max": 6.0}), ("none", {}), ("HardSwish", {}), ("Gelu", {})]


def _sig(x, w, attrs, dtype, act, extra, bias=True):
    g = dict(attrs, kernel_shape=list(w[2:]), activation=act, **extra)
    return Signature.make("CBR", [x, w, (w[0],) if bias else None, None], [dtype, dtype, dtype if bias else "", ""], g)


def _family(sig, name):
    return [c for c in prov.candidates("CBR", sig) if c.name == name]


@pytest.mark.gpu
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("geom", range(len(GEOMS)))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_every_plan_matches_the_reference(name, dtype, geom, bias):
    x, w, attrs = GEOMS[geom]
    sig = _sig(x, w, attrs, dtype, "Relu", {}, bias)
    ok, unbuilt = check_plans(_family(sig, name), sig)
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("act,extra", ACTS, ids=[a for a, _ in ACTS])
def test_every_stem_activation(name, act, extra):
    x, w, attrs = GEOMS[1]
    sig = _sig(x, w, attrs, "float16", act, extra)
    ok, unbuilt = check_plans(_family(sig, name), sig)
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


@pytest.mark.gpu
def test_a_misaligned_bias_takes_the_scalar_pass():
    low, ins, ref = _built_with_inputs(prov.CudnnSplitConv("cudnn_split"), GEOMS[0], seed=2)
    store = cupy.empty(ins[2].size + 1, dtype=ins[2].dtype)
    store[1:] = ins[2]
    ins[2] = store[1:]  # 2 bytes past a 256-byte boundary
    assert ins[2].data.ptr % 16
    _launch_matches(low, ins, ref)


def _built_with_inputs(cand, geom, seed: int):
    """``cand`` built for an fp16 Relu stem of ``geom``, fresh random inputs in its layouts, the float64
    reference."""
    x, w, attrs = geom
    sig = _sig(x, w, attrs, "float16", "Relu", {})
    f64, up = host_inputs(sig, seed)
    low = as_lowering(cand.build(sig, "sm_90"))
    return low, low.conform([None if a is None else cupy.asarray(a) for a in up], cupy), reference(sig, f64)


def _launch_matches(low, ins, ref):
    """``low`` launched on ``ins`` into a NaN-poisoned output matches the float64 ``ref``; the output and
    workspace it used."""
    out = low.empty_outputs(4, [ref.shape], "float16", cupy)[0]
    out[...] = cupy.nan
    ws = cupy.empty(max(1, low.workspace_bytes), dtype=cupy.uint8)
    low.launch(ins, [out], ws)
    got = cupy.asnumpy(out).astype(np.float64)
    assert np.isfinite(got).all()
    assert np.abs(got - ref).max() <= 1e-2 * max(1.0, np.abs(ref).max())
    return out, ws


@pytest.mark.gpu
@pytest.mark.parametrize("name", FAMILIES)
def test_two_nodes_in_one_captured_graph(name):
    x, w, attrs = GEOMS[0]
    sig = _sig(x, w, attrs, "float16", "Relu", {})
    assert captured_pair_errors(_family(sig, name)[:4], sig) == []


@pytest.mark.gpu
@pytest.mark.parametrize("name", FAMILIES)
def test_captured_replay_equals_the_eager_run(name):
    x, w, attrs = GEOMS[0]
    sig = _sig(x, w, attrs, "float16", "Relu", {})
    low = as_lowering(CLASSES[name](name).build(sig, "sm_90"))
    eager, out = eager_and_replayed(low, sig)
    assert not bool(cupy.isnan(eager).any())
    assert cupy.array_equal(out, eager)
