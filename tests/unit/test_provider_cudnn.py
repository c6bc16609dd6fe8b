"""The cuDNN provider's CPU side: absent, it reports why (never an error); its graph construction
for every CBR variant against a fake ``cudnn`` module that records the calls; plan keys parse back
to candidates; the built Lowering declares workspace, capture and NHWC layouts."""

from __future__ import annotations

import types

import numpy as np
import pytest

from graphopt.kernels import geometry as geo
from graphopt.kernels import registry
from graphopt.lowering import Lowering, Signature
from graphopt.lowering import layout
from graphopt.providers import cudnn as prov
from graphopt.providers import cudnn_pointwise as pointwise

from _fake_cudnn import FakeGraph, fake_module


class _Graph(FakeGraph):
    NAMED_BY_OP = True  # the tests read the pointwise chain's tensors by operation


def _fake_module(plans=("eng0_k2=1", "eng7_k3=0")):
    return fake_module(plans, graph=_Graph)  # (tests/unit/_fake_cudnn.py)


@pytest.fixture()
def fake(monkeypatch):
    mod, log = _fake_module()
    monkeypatch.setattr(prov, "_STATE", {"module": mod, "reason": None})
    monkeypatch.setattr(prov, "_GRAPHS", {})
    return mod, log


def _sig(x=(2, 8, 9, 11), w=(16, 8, 3, 3), bias=True, res=False, dtype="float16", **attrs):
    out = (x[0], w[0]) + tuple(x[2:])
    shapes = [x, w, (w[0],) if bias else None, out if res else None]
    attrs.setdefault("pads", [1] * (2 * (len(x) - 2)))
    return Signature.make("CBR", shapes, [dtype, dtype, dtype if bias else "", dtype if res else ""], attrs)


def test_absent_frontend_is_a_reason_not_an_error(monkeypatch):
    monkeypatch.setattr(prov, "_STATE", {"module": None, "reason": "nvidia-cudnn-frontend is not importable (x)"})
    sig = _sig(activation="Relu")
    cands = prov.candidates("CBR", sig)
    assert [c.key() for c in cands] == ["cudnn"]
    assert "not importable" in cands[0].applies(sig, (9, 0))
    assert prov.candidates("GemmAct", None) == []


@pytest.mark.parametrize("act,call,kw", [
    ("none", None, {}), ("Relu", "relu", {}), ("LeakyRelu", "leaky_relu", {"negative_slope": pytest.approx(0.2)}),
    ("Sigmoid", "sigmoid", {}), ("SiLU", "swish", {}), ("Gelu", "gelu", {}), ("GeluTanh", "gelu_approx_tanh", {}),
    ("Clip", "relu", {"lower_clip": 0.0, "upper_clip": 6.0}),
])
def test_graph_for_every_activation(fake, act, call, kw):
    mod, log = fake
    extra = {"act_alpha": 0.2} if act == "LeakyRelu" else {"clip_min": 0.0, "clip_max": 6.0} if act == "Clip" else {}
    sig = _sig(activation=act, **extra)
    assert prov.CudnnConv("cudnn").applies(sig, (9, 0)) is None
    prov.conv_graph(mod, "h", sig)
    ops = [e[0] for e in log]
    assert ops[:4] == ["pygraph", "tensor", "tensor", "conv_fprop"]
    if call:
        entry = next(e for e in log if e[0] == call)
        for k, v in kw.items():
            assert entry[1][k] == v
    else:
        assert not {"relu", "sigmoid", "swish", "gelu"} & set(ops)
    assert any(e[0] == "set_output" and e[2] is True for e in log)


def test_graph_nhwc_strides_groups_residual_and_asymmetric_pads(fake):
    mod, log = fake
    sig = _sig(x=(2, 8, 9, 11), w=(8, 1, 3, 3), bias=True, res=True, group=8, pads=[1, 0, 1, 2], activation="Relu")
    prov.conv_graph(mod, "h", sig)
    tensors = {e[1]: (e[2], e[3]) for e in log if e[0] == "tensor"}
    assert tensors["X"] == ([2, 8, 9, 11], [8 * 9 * 11, 1, 11 * 8, 8])  # NHWC strides
    assert tensors["W"] == ([8, 1, 3, 3], [9, 1, 3, 1])                 # depthwise: C/G = 1
    assert tensors["B"][0] == [1, 8, 1, 1]
    conv = next(e for e in log if e[0] == "conv_fprop")[1]
    assert conv["pre_padding"] == [1, 0] and conv["post_padding"] == [1, 2]
    adds = [e[1] for e in log if e[0] == "add"]
    assert [a["b"] for a in adds] == ["B", "R"]
    assert ("set_dim", "relu", [2, 8, 9, 11]) in log


@pytest.mark.parametrize("x,w,attrs,pre,post", [
    ((2, 3, 224, 224), (64, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}, [3, 3], [3, 3]),  # ResNet-50's stem
    ((2, 32, 112, 112), (32, 32, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, [1, 1], [1, 1]),  # stride 2, even H
    ((2, 8, 9, 11), (8, 8, 3, 3), {"pads": [0, 0, 0, 0], "auto_pad": "SAME_UPPER"}, [1, 1], [1, 1]),
    ((2, 8, 10, 10), (8, 8, 2, 2), {"pads": [0, 0, 0, 0], "auto_pad": "SAME_LOWER"}, [1, 1], [0, 0]),
])
def test_the_convolution_takes_the_models_own_end_pads(fake, x, w, attrs, pre, post):
    """The end pads cuDNN gets are the model's (torch passes its symmetric ones), not the fewest that give
    the output size: ResNet-50's stem has pads 3 and an output that 2 would give, and cuDNN's first-layer
    engine (torch's 61 us kernel on the H100) refuses the trimmed form."""
    mod, log = fake
    sig = _sig(x=x, w=w, bias=True, **attrs)
    g = geo.conv_geom(sig)
    prov.conv_graph(mod, "h", sig)
    conv = next(e for e in log if e[0] == "conv_fprop")[1]
    assert conv["pre_padding"] == pre == [g.ph, g.pw] and conv["post_padding"] == post == [g.eh, g.ew]
    for i, (size, k, s) in enumerate(zip(x[2:], w[2:], attrs.get("strides", [1, 1]))):  # the same output size
        assert (size + pre[i] + post[i] - k) // s + 1 == (g.OH, g.OW)[i]


def test_the_graph_form_is_in_the_source_hash():
    """A change to the convolution graphs invalidates the cached timings of the old ones, for every cuDNN CBR
    provider; the other ops' graphs did not change, nor do their hashes."""
    from graphopt.providers import cudnn_cpad, cudnn_matmul, cudnn_nchw, cudnn_split

    for cand in (prov.CudnnConv("cudnn"), cudnn_nchw.CudnnNchwConv("cudnn_nchw"), cudnn_cpad.CudnnPaddedConv("cudnn_cpad"),
                 cudnn_split.CudnnSplitConv("cudnn_split")):
        assert cand.source_hash().startswith(f"cudnn{prov.GRAPH_FORM}:"), cand
    assert cudnn_matmul.CudnnMatmul("cudnn").source_hash().startswith("cudnn:")


def test_one_d_conv_and_unsupported_cases():
    sig1 = _sig(x=(2, 8, 17), w=(4, 8, 3), pads=[1, 1])
    assert prov.conv_reason(sig1) is None
    assert "activation QuickGelu" in prov.conv_reason(_sig(activation="QuickGelu"))
    assert "dtype float64" in prov.conv_reason(_sig(dtype="float64"))


@pytest.mark.parametrize("act,extra,alpha,beta", [
    ("HardSwish", {}, 1 / 6, 0.5), ("HardSigmoidMul", {"act_alpha": 0.25, "act_beta": 0.4}, 0.25, 0.4),
    ("HardSigmoidMul", {}, 0.2, 0.5),
])
def test_composed_hard_sigmoids_are_four_pointwise_ops_with_scalars_by_value(fake, act, extra, alpha, beta):
    mod, log = fake
    sig = _sig(activation=act, **extra)
    assert prov.conv_reason(sig) is None
    _, t = prov.conv_graph(mod, "h", sig)
    ops = [e[0] for e in log if e[0] in ("add", "mul", "relu")]
    assert ops == ["add", "mul", "add", "relu", "mul"]  # bias, then y * clamp(alpha * y + beta, 0, 1)
    scalars = [e for e in log if e[0] == "tensor" and e[5]]  # passed by value
    assert [(e[1], e[2]) for e in scalars] == [("act_alpha", [1, 1, 1, 1]), ("act_beta", [1, 1, 1, 1])]
    clamp = next(e[1] for e in log if e[0] == "relu")
    assert clamp["lower_clip"] == 0.0 and clamp["upper_clip"] == 1.0
    assert float(t["constants"]["act_alpha"].ravel()[0]) == pytest.approx(alpha)
    assert float(t["constants"]["act_beta"].ravel()[0]) == pytest.approx(beta)
    assert t["constants"]["act_alpha"].dtype == np.float32 and t["constants"]["act_alpha"].shape == (1, 1, 1, 1)


class _V:
    """A value in the evaluating fake graph (a NumPy array), or a pass-by-value scalar by name."""

    def __init__(self, value=None, name=None):
        self.value, self.name = value, name


class _EvalGraph:
    """A fake cuDNN graph that evaluates the pointwise ops it is given on NumPy arrays (float64), with
    cuDNN's documented semantics (relu: clamp to [lower_clip, upper_clip], lower 0 by default)."""

    def __init__(self, t: dict):
        self.t = t  # the tensor dict the graph builder fills: its "constants" are what a launch binds

    def tensor(self, name, dim, stride, data_type, is_pass_by_value=False):
        assert is_pass_by_value and list(dim) == list(stride)
        return _V(self.t["constants"][name].astype(np.float64), name)

    def _un(self, f):
        return lambda input, **kw: _V(f(input.value, kw))

    def __getattr__(self, op):
        from math import erf, sqrt, tanh, pi

        verf, vtanh = np.vectorize(erf), np.vectorize(tanh)
        unary = {
            "relu": lambda x, kw: np.clip(x, kw.get("lower_clip", 0.0), kw.get("upper_clip", np.inf)),
            "leaky_relu": lambda x, kw: np.where(x >= 0, x, x * kw["negative_slope"]),
            "sigmoid": lambda x, kw: 1 / (1 + np.exp(-x)), "swish": lambda x, kw: x / (1 + np.exp(-x)),
            "gelu": lambda x, kw: 0.5 * x * (1 + verf(x / sqrt(2))),
            "gelu_approx_tanh": lambda x, kw: 0.5 * x * (1 + vtanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))),
        }
        if op in unary:
            return self._un(unary[op])
        if op in ("add", "mul"):
            f = np.add if op == "add" else np.multiply
            return lambda a, b, **kw: _V(f(a.value, b.value))
        raise AttributeError(op)


@pytest.mark.parametrize("act", list(pointwise.ACTIVATIONS))
def test_every_activation_graph_computes_the_reference(act, rng):
    """The pointwise ops each activation becomes, evaluated with cuDNN's semantics and the scalars the
    launch binds, give the op's float64 reference (``graphopt.ops.activations``)."""
    from graphopt.ops.activations import ACTIVATIONS

    extra = {"LeakyRelu": {"act_alpha": 0.15}, "Clip": {"clip_min": -0.5, "clip_max": 6.0},
             "HardSigmoidMul": {"act_alpha": 0.3, "act_beta": 0.45}}.get(act, {})
    sig = _sig(activation=act, **extra)
    y = rng.standard_normal((2, 3, 5, 7)) * 4  # past HardSwish's +-3 knees and ReLU6's 6
    t: dict = {}
    out = pointwise.activation(_EvalGraph(t), _V(y), sig, "f32", t, rank=4)
    np.testing.assert_allclose(out.value, ACTIVATIONS[act].numpy(y, dict(sig.attrs)), rtol=1e-6, atol=1e-6)


def test_clip_without_a_lower_bound_clips_nothing_below(rng):
    sig = _sig(activation="Clip", clip_max=1.0)
    y = rng.standard_normal(50) * 3
    out = pointwise.activation(_EvalGraph({}), _V(y), sig, "f32", {}, rank=4)
    np.testing.assert_array_equal(out.value, np.minimum(y, 1.0))


def test_launch_binds_the_scalars_by_value(fake, monkeypatch):
    mod, log = fake
    sig = _sig(activation="HardSwish")
    low = prov.CudnnConv("cudnn").build(sig, "sm_90")
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=7)),
                                 empty=lambda n, dtype=None: np.empty(n, np.uint8), uint8=np.uint8)
    monkeypatch.setitem(__import__("sys").modules, "cupy", cupy)
    seen = {}
    graph = prov._GRAPHS[sig.key()].graph
    monkeypatch.setattr(graph, "execute_plan_at_index", lambda pack, ws, i, handle=None: seen.update(
        {t.name: e for t, e in pack.items()}), raising=False)
    x = np.zeros((2, 8, 9, 11), np.float16)
    low.launch([x, np.zeros((16, 8, 3, 3), np.float16), np.zeros(16, np.float16), None],
               [np.zeros((2, 16, 9, 11), np.float16)], np.empty(1000, np.uint8))
    assert {"act_alpha", "act_beta", "X", "W", "B"} <= set(seen)
    assert isinstance(seen["act_alpha"], prov._HostDl) and isinstance(seen["X"], prov._Dl)
    assert float(seen["act_alpha"].a.ravel()[0]) == pytest.approx(1 / 6)


def test_plans_are_candidates_keyed_by_name_and_parse_back(fake):
    sig = _sig(activation="Relu")
    keys = [c.key() for c in prov.candidates("CBR", sig)]
    assert keys == ["cudnn", "cudnn:plan=eng0_k2=1", "cudnn:plan=eng7_k3=0"]
    all_keys = [c.key() for c in registry.candidates_for(sig)]
    assert set(keys) <= set(all_keys)
    for k in keys:
        assert registry.candidate_from_key("CBR", k).key() == k


def test_build_declares_workspace_capture_layouts_and_versions(fake, monkeypatch):
    mod, log = fake
    sig = _sig(activation="Relu", res=True)
    low = prov.CudnnConv("cudnn", (("plan", "eng7_k3=0"),)).build(sig, "sm_90")
    assert isinstance(low, Lowering)
    assert low.workspace_bytes == 2000 and low.capturable and low.barrier and low.outputs == 1
    assert low.layouts == ("NHWC", "NHWC", "NHWC", "NHWC", "NHWC")
    assert dict(low.versions) == {"cudnn": "91900", "cudnn_frontend": "1.32.0"}
    assert ("build_plan_at_index", 1) in log
    heur = prov.CudnnConv("cudnn").build(sig, "sm_90")  # the heuristic's first plan, same cached graph
    assert heur.workspace_bytes == 1000 and sum(e[0] == "pygraph" for e in log) == 1
    with pytest.raises(Exception, match="not offered"):
        prov.CudnnConv("cudnn", (("plan", "eng99"),)).build(sig, "sm_90")
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=7)),
                                 empty=lambda n, dtype=None: np.empty(n, np.uint8), uint8=np.uint8)
    monkeypatch.setitem(__import__("sys").modules, "cupy", cupy)
    x = np.zeros((2, 8, 9, 11), np.float16)
    low.launch([x, np.zeros((16, 8, 3, 3), np.float16), np.zeros(16, np.float16), x[:, :1].repeat(16, 1)],
               [np.zeros((2, 16, 9, 11), np.float16)], np.empty(2000, np.uint8))
    assert ("set_stream", 7) in log
    assert ("execute", ["B", "R", "W", "X", "relu"], 1) in log


def test_layout_helpers_keep_values_and_convert_only_when_needed():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    y = layout.to_layout(x, "NHWC", np)
    assert np.array_equal(x, y) and y.transpose(0, 2, 3, 1).flags.c_contiguous
    assert layout.to_layout(y, "NHWC", np) is y and layout.is_layout(y, "NHWC")
    z = layout.to_layout(y, "NCHW", np)
    assert np.array_equal(z, x) and z.flags.c_contiguous
    e = layout.empty((2, 3, 4, 5), np.float16, "NHWC", np)
    assert e.shape == (2, 3, 4, 5) and layout.is_layout(e, "NHWC")
    low = Lowering(launch=lambda i, o, w: None, layouts=("NHWC", "", "NHWC"))
    a, b = low.conform([x, x], np)
    assert layout.is_layout(a, "NHWC") and b.flags.c_contiguous
    assert layout.is_layout(low.empty_outputs(2, [(2, 3, 4, 5)], np.float32, np)[0], "NHWC")


@pytest.mark.parametrize("dtype, n, ld", [(np.float16, 33, 40), (np.float32, 9, 12), (np.float16, 32, 32)])
def test_rowpad_layout_pads_each_row_to_16_bytes_and_keeps_values(dtype, n, ld):
    """``rowpad``: a ``[..., :N]`` view of a C-contiguous ``(..., ld)`` buffer, rows 16-byte aligned
    (cublaslt_rowpad's Y; GPT-2's 50257 logits); rows already aligned are plain C order."""
    e = layout.empty((2, 3, n), dtype, "rowpad", np)
    assert e.shape == (2, 3, n) and e.strides[-2:] == (ld * e.itemsize, e.itemsize) and layout.is_layout(e, "rowpad")
    assert layout.padded_row(n, np.dtype(dtype).itemsize) == ld
    x = np.arange(2 * 3 * n, dtype=dtype).reshape(2, 3, n)
    assert layout.is_layout(x, "rowpad") == (ld == n)  # C order is rowpad only where rows need no padding
    y = layout.to_layout(x, "rowpad", np)
    assert np.array_equal(x, y) and layout.is_layout(y, "rowpad") and layout.to_layout(y, "rowpad", np) is y
    z = layout.to_layout(y, "NCHW", np)
    assert np.array_equal(z, x) and z.flags.c_contiguous
    assert layout.is_layout(np.zeros((1, n), dtype), "rowpad") and layout.is_layout(np.zeros(n, dtype), "rowpad")  # a bias
    for shape in ((3, 0), (0, n), (0,)):  # nothing to place: every empty array is in the layout
        e = layout.empty(shape, dtype, "rowpad", np)
        assert layout.is_layout(e, "rowpad") and layout.to_layout(e, "rowpad", np) is e


@pytest.mark.parametrize("x,w,group,barred", [
    ((2, 3, 224, 224), (64, 3, 7, 7), 1, False),    # ResNet-50's stem: 147 terms
    ((2, 3, 224, 224), (32, 3, 3, 3), 1, False),    # MobileNetV2's: 27
    ((2, 3, 224, 224), (64, 3, 11, 11), 1, True),   # a stem of 363 terms
    ((2, 64, 56, 56), (64, 64, 3, 3), 1, True),     # a body layer: 576
    ((2, 64, 56, 56), (64, 64, 1, 1), 1, True),     # a short body reduction (64): no stem
    ((2, 96, 56, 56), (96, 1, 3, 3), 96, True),     # depthwise (9 terms): no stem
])
def test_short_stem_reductions_may_take_reduced_precision_plans(x, w, group, barred):
    """cuDNN plans noted REDUCED_PRECISION_REDUCTION stay barred except for a stem (dense, 2-D, fewer than
    8 input channels) whose reduction is at most SHORT_REDUCTION terms (torch's first-layer engine carries
    the note); the other inexact notes bar everywhere, and every op but CBR keeps them all."""
    sig = _sig(x=x, w=w, group=group)
    notes = prov.barred_notes(sig)
    assert ("REDUCED_PRECISION_REDUCTION" in notes) == barred
    assert set(prov.INEXACT_NOTES) - {"REDUCED_PRECISION_REDUCTION"} <= set(notes)
    assert prov.barred_notes(None) == prov.INEXACT_NOTES


def test_remembered_plan_listings_are_keyed_by_the_graph_form(monkeypatch):
    """The plan names kept on disk per GPU and cuDNN version also carry the graph form: a listing of the
    stem's graph with trimmed end pads and every note barred (no engine 63) must not stand for the new one."""
    from graphopt.providers import cudnn_listing

    seen = []
    monkeypatch.setattr(prov, "_STATE", {"module": object(), "reason": None})
    monkeypatch.setattr(prov, "_device_tag", lambda: "NVIDIA H200 sm_90")
    monkeypatch.setattr(cudnn_listing, "remembered", lambda key, device, versions, listing: seen.append(versions) or [])
    prov.plan_keys(_sig(activation="Relu"), lambda sig: None)
    assert seen and ("graph_form", str(prov.GRAPH_FORM)) in seen[0]
    assert set(prov.versions()) <= set(seen[0])
    other = Signature.make("GemmAct", [(8, 64), (64, 32), None], ["float16", "float16", ""], {"mode": "matmul"})
    prov.plan_keys(other, lambda sig: None)
    assert seen[1] == prov.versions()  # the matmul graphs' listings stay where they were
