"""The cuDNN provider on the GPU: every plan it offers for a sweep of CBR signatures (odd sizes,
stride, dilation, asymmetric pads, groups, depthwise, residual, every activation it maps, fp16 and
fp32, 1-D) is checked against the float64 reference with NaN-poisoned NHWC outputs; a wrong plan is
a failure, a plan that does not build is reported. And one lowering is captured in a CUDA graph and
replayed with the right result."""

from __future__ import annotations

import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402
from _provider_check import eager_and_replayed, xfail_if_refused  # noqa: E402

require_device()

from graphopt.errors import TuningError  # noqa: E402
from graphopt.kernels.check import checker  # noqa: E402
from graphopt.lowering import Signature, as_lowering  # noqa: E402
from graphopt.providers import cudnn as prov  # noqa: E402
from graphopt.providers.cudnn_pointwise import COMPOSED  # noqa: E402

if prov.unavailable():
    pytest.skip(prov.unavailable(), allow_module_level=True)

MAX_PLANS = 8
ACTS = [("Relu", {}), ("none", {}), ("Clip", {"clip_min": 0.0, "clip_max": 6.0}), ("LeakyRelu", {"act_alpha": 0.1}),
        ("Sigmoid", {}), ("SiLU", {}), ("Gelu", {}), ("GeluTanh", {}), ("HardSwish", {}),
        ("HardSigmoidMul", {"act_alpha": 0.25, "act_beta": 0.4})]
GEOMS = [  # (x, w, attrs)
    ((2, 16, 13, 11), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 24, 17, 17), (40, 24, 1, 1), {}),
    ((3, 8, 15, 9), (16, 8, 3, 3), {"pads": [1, 0, 2, 1], "strides": [2, 2]}),
    ((2, 16, 12, 12), (16, 16, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((2, 32, 10, 10), (32, 8, 3, 3), {"pads": [1, 1, 1, 1], "group": 4}),
    ((2, 32, 14, 14), (32, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 32}),
    ((2, 3, 33, 33), (16, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ((2, 16, 31), (24, 16, 3), {"pads": [1, 1]}),
]


def _sig(x, w, attrs, dtype, act, extra, res):
    g = dict(attrs, activation=act, **extra)
    base = Signature.make("CBR", [x, w, (w[0],), None], [dtype] * 3, g)
    from graphopt.kernels.geometry import conv_geom

    out = conv_geom(base).out_shape
    return Signature.make("CBR", [x, w, (w[0],), out if res else None], [dtype] * 3 + [dtype if res else ""], g)


def _check_all_plans(sig, module=prov):
    cands = module.candidates("CBR", sig)[:MAX_PLANS]  # the heuristic's first plans (a run's time bound)
    assert cands[0].applies(sig, (9, 0)) is None, cands[0].applies(sig, (9, 0))
    ok, wrong, unbuilt = 0, [], []
    for cand in cands:
        try:
            low = as_lowering(cand.build(sig, "sm_90"))
        except Exception as e:  # noqa: BLE001 - a plan cuDNN lists but cannot build scores inf in the tuner
            unbuilt.append((cand.key(), str(e)[:100]))
            continue
        reason = checker(sig, low)
        if reason:
            wrong.append((cand.key(), reason))
        else:
            ok += 1
    return ok, wrong, unbuilt


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("geom", range(len(GEOMS)))
@pytest.mark.parametrize("res", [False, True])
def test_every_plan_matches_the_reference_over_geometries(dtype, geom, res):
    x, w, attrs = GEOMS[geom]
    sig = _sig(x, w, attrs, dtype, "Relu", {}, res)
    ok, wrong, unbuilt = _check_all_plans(sig)
    print(f"{sig.key()}: {ok} plans correct, {len(unbuilt)} did not build")
    assert not wrong, wrong
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("geom", range(len(GEOMS)))
def test_nchw_plans_match_the_reference_over_geometries(dtype, geom):
    """``cudnn_nchw``: the same graph with every tensor NCHW (the checker hands NCHW arrays)."""
    from graphopt.providers import cudnn_nchw

    x, w, attrs = GEOMS[geom]
    sig = _sig(x, w, attrs, dtype, "Clip", {"clip_min": 0.0, "clip_max": 6.0}, geom % 2 == 0)
    ok, wrong, unbuilt = _check_all_plans(sig, cudnn_nchw)
    print(f"{sig.key()} NCHW: {ok} plans correct, {len(unbuilt)} did not build")
    assert not wrong, wrong
    if not ok:  # whether cuDNN fuses an NCHW graph here is a fact to record (the tuner reports it too)
        xfail_if_refused(sig, cudnn_nchw._graph_for)


@pytest.mark.gpu
@pytest.mark.parametrize("act,extra", ACTS, ids=[a for a, _ in ACTS])
def test_every_activation(act, extra):
    sig = _sig((2, 16, 13, 11), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", act, extra, True)
    ok, wrong, unbuilt = _check_all_plans(sig)
    print(f"{act}: {ok} plans correct, {len(unbuilt)} did not build")
    assert not wrong, wrong
    if act in COMPOSED and not ok:  # four pointwise ops: whether cuDNN fuses them is a fact to record
        xfail_if_refused(sig, prov._graph_for)
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["Relu", "HardSwish"])  # HardSwish: its scalars are bound by value
def test_a_plan_captures_in_a_cuda_graph_and_replays(act):
    sig = _sig((4, 32, 28, 28), (64, 32, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", act, {}, True)
    try:
        low = as_lowering(prov.CudnnConv("cudnn").build(sig, "sm_90"))
    except TuningError:  # refused, or no plan offered
        if act not in COMPOSED:
            raise
        xfail_if_refused(sig, prov._graph_for)
    # the reference is the eager result of the same lowering (and the checker's float64 one below)
    eager, out = eager_and_replayed(low, sig, seed=0)
    assert cupy.array_equal(out, eager)
    assert checker(sig, low) is None


@pytest.mark.gpu
@pytest.mark.parametrize("res", [False, True], ids=["bias", "residual"])
def test_two_nodes_of_one_signature_in_one_captured_graph(res):
    """Two CBR nodes of one signature share the signature's cuDNN graph and plans: captured together
    into one CUDA graph, each must still read its own inputs, bias and residual."""
    from _provider_check import captured_pair_errors

    sig = Signature.make("CBR", [(4, 64, 14, 14), (64, 64, 3, 3), (64,), (4, 64, 14, 14) if res else None],
                         ["float16"] * 3 + (["float16"] if res else [""]),
                         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "activation": "Relu"})
    assert captured_pair_errors(prov.candidates(sig.op, sig), sig) == []
