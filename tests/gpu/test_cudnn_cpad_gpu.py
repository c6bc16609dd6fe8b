"""The channel-padded cuDNN CBR (graphopt.providers.cudnn_cpad) on the GPU: every plan it offers for
stems with 1, 3 and 4 input channels (odd sizes, stride 2, asymmetric pads, residual, the stem
activations, fp16 and fp32) against the float64 reference with NaN-poisoned outputs (_provider_check); one
lowering captured in a CUDA graph and replayed equal to its eager run, its workspace poisoned first
(the zero channels are the lowering's to write)."""

from __future__ import annotations

import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402
from _provider_check import STEM_GEOMS, check_plans, eager_and_replayed, xfail_if_refused  # noqa: E402

require_device()

from graphopt.kernels.geometry import conv_geom  # noqa: E402
from graphopt.lowering import Signature, as_lowering  # noqa: E402
from graphopt.providers import cudnn, cudnn_cpad as prov  # noqa: E402
from graphopt.providers.cudnn_pointwise import COMPOSED  # noqa: E402

if cudnn.unavailable():
    pytest.skip(cudnn.unavailable(), allow_module_level=True)

GEOMS = STEM_GEOMS
ACTS = [("Relu", {}), ("Clip", {"clip_min": 0.0, "clip_max": 6.0}), ("none", {}), ("HardSwish", {})]  # MobileNetV3's stem


def _sig(x, w, attrs, dtype, act, extra, res):
    g = dict(attrs, kernel_shape=list(w[2:]), activation=act, **extra)
    out = conv_geom(Signature.make("CBR", [x, w, (w[0],), None], [dtype] * 3, g)).out_shape
    return Signature.make("CBR", [x, w, (w[0],), out if res else None], [dtype] * 3 + [dtype if res else ""], g)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("geom", range(len(GEOMS)))
@pytest.mark.parametrize("res", [False, True], ids=["bias", "residual"])
def test_every_plan_matches_the_reference(dtype, geom, res):
    x, w, attrs = GEOMS[geom]
    sig = _sig(x, w, attrs, dtype, "Relu", {}, res)
    ok, unbuilt = check_plans(prov.candidates("CBR", sig), sig)
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


@pytest.mark.gpu
@pytest.mark.parametrize("act,extra", ACTS, ids=[a for a, _ in ACTS])
def test_every_stem_activation(act, extra):
    x, w, attrs = GEOMS[1]
    sig = _sig(x, w, attrs, "float16", act, extra, False)
    ok, unbuilt = check_plans(prov.candidates("CBR", sig), sig)
    if act in COMPOSED and not ok:  # four pointwise ops: whether cuDNN fuses them is a fact to record
        xfail_if_refused(sig, prov._graph_for)
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


@pytest.mark.gpu
def test_captured_replay_equals_the_eager_run():
    x, w, attrs = GEOMS[0]
    sig = _sig(x, w, attrs, "float16", "Relu", {}, True)
    low = as_lowering(prov.CudnnPaddedConv("cudnn_cpad").build(sig, "sm_90"))
    eager, out = eager_and_replayed(low, sig)  # the workspace poisoned: the zero channels are the lowering's to write
    assert not bool(cupy.isnan(eager).any())
    assert cupy.array_equal(out, eager)
