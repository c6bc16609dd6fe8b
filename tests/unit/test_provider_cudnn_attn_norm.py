"""The cuDNN SDPA and norm providers' CPU side: absent, they report why (never an error); graph
construction for every Attention variant (scale, causal, additive / bool / broadcast masks,
k_transposed, MQA, nan_to_zero) and for LayerNorm / SkipLayerNorm (with its sum output) / RMSNorm
against a fake ``cudnn`` module that records the calls; plan keys parse back through the registry;
the built Lowering declares workspace, capture, layouts and outputs; and its launch, run on NumPy
through a fake CuPy, binds what the graph reads (K transposed, the mask turned into a bias, epsilon
by value, the sum output)."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest

from graphopt.kernels import registry
from graphopt.lowering import Lowering, Signature
from graphopt.providers import cudnn as prov
from graphopt.providers import cudnn_norm, cudnn_sdpa

from _fake_cudnn import fake_module

PLANS = ("eng3_k5=1", "sdpa_fwd_prefill_sm90[TILE_M=128, TILE_N=64]")


def _fake_cudnn(plans=PLANS, refuse_inference=False):
    return fake_module(plans, refuse_inference)  # (tests/unit/_fake_cudnn.py)


class _Kernel:
    """cupy.ElementwiseKernel on NumPy: the two kernels the SDPA launch uses."""

    def __init__(self, ins, outs, op, name):
        self.name = name

    def __call__(self, *args):
        if "bool_bias" in self.name:
            m, on, off, y = args
            y[...] = np.where(np.broadcast_to(m, y.shape), on, off)
        else:
            lim, y = args
            y[(y & 0x7FFF) > lim] = 0


def _fake_cupy():
    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=7)),
        empty=lambda n, dtype=None: np.empty(n, dtype), zeros=lambda n, dtype=None: np.zeros(n, dtype),
        uint8=np.uint8, uint16=np.uint16, copyto=np.copyto, ElementwiseKernel=_Kernel)


@pytest.fixture()
def fake(monkeypatch):
    mod, log = _fake_cudnn()
    monkeypatch.setattr(prov, "_STATE", {"module": mod, "reason": None})
    monkeypatch.setattr(prov, "_GRAPHS", {})
    monkeypatch.setattr(cudnn_sdpa, "_KERNELS", {})
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    return mod, log


def _attn(q=(2, 4, 16, 64), k=None, v=None, mask=None, mask_dtype=None, dtype="float16", **attrs):
    k = k or q
    v = v or k[:-2] + ((k[-1] if attrs.get("k_transposed") else k[-2]), q[-1])
    if mask is not None:
        attrs.setdefault("mask_kind", "bool" if mask_dtype == "bool" else "additive")
    return Signature.make("Attention", [q, k, v, mask], [dtype] * 3 + [(mask_dtype or dtype) if mask else ""], attrs)


def _ops(log, op):
    return [e[1] for e in log if e[0] == op]


# ---------------------------------------------------------------------------------- absent library
def test_absent_frontend_is_a_reason_for_every_op(monkeypatch):
    monkeypatch.setattr(prov, "_STATE", {"module": None, "reason": "nvidia-cudnn-frontend is not importable (x)"})
    sigs = {"Attention": _attn(), "LayerNorm": Signature.make("LayerNorm", [(4, 64), (64,), (64,)], ["float16"] * 3, {}),
            "RMSNorm": Signature.make("RMSNorm", [(4, 64), (64,)], ["float16"] * 2, {})}
    for op, sig in sigs.items():
        cands = [c for c in registry.candidates_for(sig) if c.name == "cudnn"]
        assert [c.key() for c in cands] == ["cudnn"]
        assert "not importable" in cands[0].applies(sig, (9, 0))
        assert registry.candidate_from_key(op, "cudnn:plan=eng0").applies(sig, (9, 0)).startswith("nvidia-cudnn")
    assert cudnn_sdpa.candidates("CBR") == [] and cudnn_norm.candidates("Attention") == []


@pytest.mark.parametrize("kw, words", [
    ({"dtype": "float32"}, "cuDNN SDPA needs fp16/bf16"),
    ({"q": (2, 4, 16, 20)}, "multiples of 8"),
    ({"q": (2, 4, 16, 264)}, "up to 128"),
    ({"q": (2, 4, 16, 64), "v": (2, 4, 16, 192)}, "up to 128"),
    ({"k": (1, 4, 16, 64)}, "K/V leading dims"),
    ({"k": (2, 2, 16, 64)}, "K/V leading dims"),
    ({"mask": (2, 1, 16, 16), "mask_dtype": "float32"}, "mask of dtype float16"),
    ({"mask": (2, 3, 16, 16)}, "does not broadcast"),
    ({"mask": (1, 2, 1, 4, 16, 16)}, "rank <= 4"),
])
def test_forms_not_lowered_say_why(fake, kw, words):
    sig = _attn(**kw)
    assert words in cudnn_sdpa.sdpa_reason(sig)
    assert words in cudnn_sdpa.CudnnSdpa("cudnn").applies(sig, (9, 0))
    assert [c.key() for c in cudnn_sdpa.candidates("Attention", sig)] == ["cudnn"]  # no graph was tried
    assert not [e for e in fake[1] if e[0] == "pygraph"]


def test_capability_limits_with_the_library(fake):
    assert "compute capability >= 8.0" in cudnn_sdpa.CudnnSdpa("cudnn").applies(_attn(), (7, 5))
    big = _attn(q=(1, 2, 16, 256))
    assert cudnn_sdpa.CudnnSdpa("cudnn").applies(big, (9, 0)) is None
    assert "above 128 from sm90" in cudnn_sdpa.CudnnSdpa("cudnn").applies(big, (8, 0))


# ---------------------------------------------------------------------------------- SDPA graphs
@pytest.mark.parametrize("dtype, io", [("float16", "HALF"), ("bfloat16", "BF16")])
def test_plain_graph_scale_default_and_row_major_tensors(fake, dtype, io):
    mod, log = fake
    sig = _attn(q=(2, 4, 16, 64), dtype=dtype)
    cudnn_sdpa.sdpa_graph(mod, "h", sig)
    assert log[0] == ("pygraph", {"io_data_type": io, "intermediate_data_type": "FLOAT", "compute_data_type": "FLOAT",
                                  "handle": "h"})
    tensors = {e[1]: (e[2], e[3], e[4]) for e in log if e[0] == "tensor"}
    assert tensors["Q"] == ([2, 4, 16, 64], [4096, 1024, 64, 1], io)
    assert set(tensors) == {"Q", "K", "V"}
    sdpa = _ops(log, "sdpa")[0]
    assert sdpa["attn_scale"] == pytest.approx(1 / 8) and sdpa["generate_stats"] is False
    assert "bias" not in sdpa and "use_causal_mask" not in sdpa
    assert ("set_dim", "sdpa", [2, 4, 16, 64]) in log and ("set_stride", "sdpa", [4096, 1024, 64, 1]) in log


def test_qkv_bshd_binds_strided_tensors_and_no_copy(fake):
    """qkv_bshd=1: Q, K, V [B, S, H, D] are cuDNN tensors of logical [B, H, S, D] dims with the heads'
    rows H * D apart; O stays contiguous [B, H, Sq, Dv]; no K copy in the workspace."""
    mod, log = fake
    sig = Signature.make("Attention", [(2, 16, 4, 64), (2, 24, 4, 64), (2, 24, 4, 64), (2, 1, 16, 24)],
                         ["float16"] * 4, {"mask_kind": "additive", "qkv_bshd": 1})
    g = cudnn_sdpa.sdpa_geom(sig)
    assert (g.B, g.H, g.Sq, g.Skv, g.D, g.bshd, g.kt) == (2, 4, 16, 24, 64, True, False)
    cudnn_sdpa.sdpa_graph(mod, "h", sig)
    tensors = {e[1]: (e[2], e[3]) for e in log if e[0] == "tensor"}
    assert tensors["Q"] == ([2, 4, 16, 64], [16 * 4 * 64, 64, 4 * 64, 1])
    assert tensors["K"] == tensors["V"] == ([2, 4, 24, 64], [24 * 4 * 64, 64, 4 * 64, 1])
    assert tensors["bias"] == ([2, 1, 16, 24], [16 * 24, 16 * 24, 24, 1])
    assert ("set_stride", "sdpa", [4 * 16 * 64, 16 * 64, 64, 1]) in log
    assert g.workspace_parts(0)[1] == 0  # no transposed K
    log.clear()
    ysig = Signature.make("Attention", sig.input_shapes, list(sig.dtypes), {**dict(sig.attrs), "y_bshd": 1})
    cudnn_sdpa.sdpa_graph(mod, "h", ysig)
    assert ("set_stride", "sdpa", [16 * 4 * 64, 64, 4 * 64, 1]) in log  # O as [B, Sq, H, Dv]


def test_qkv_packed_binds_thirds_of_one_tensor(fake):
    """qkv_packed=1: one [B, S, 3, H, D] input; Q, K and V are cuDNN tensors with rows 3 * H * D apart."""
    mod, log = fake
    sig = Signature.make("Attention", [(2, 16, 3, 4, 64), None, None, (2, 1, 1, 16)], ["float16", "", "", "float16"],
                         {"mask_kind": "additive", "qkv_bshd": 1, "qkv_packed": 1, "y_bshd": 1})
    g = cudnn_sdpa.sdpa_geom(sig)
    assert (g.B, g.H, g.Sq, g.Skv, g.D, g.Dv, g.bshd, g.packed) == (2, 4, 16, 16, 64, 64, True, True)
    cudnn_sdpa.sdpa_graph(mod, "h", sig)
    tensors = {e[1]: (e[2], e[3]) for e in log if e[0] == "tensor"}
    row = 3 * 4 * 64
    assert tensors["Q"] == tensors["K"] == tensors["V"] == ([2, 4, 16, 64], [16 * row, 64, row, 1])
    assert ("set_stride", "sdpa", [16 * 4 * 64, 64, 4 * 64, 1]) in log  # O as [B, Sq, H, Dv]


def test_scale_causal_rank3_and_mqa(fake):
    mod, log = fake
    sig = _attn(q=(6, 7, 32), k=(6, 9, 32), v=(6, 9, 16), scale=0.3, causal=1)
    g = cudnn_sdpa.sdpa_graph(mod, "h", sig)[2]
    assert (g.B, g.H, g.Hk, g.Sq, g.Skv, g.D, g.Dv) == (1, 6, 6, 7, 9, 32, 16)
    sdpa = _ops(log, "sdpa")[0]
    assert sdpa["attn_scale"] == pytest.approx(float(np.float32(0.3))) and sdpa["use_causal_mask"] is True
    mod2, log2 = _fake_cudnn()
    mqa = _attn(q=(2, 8, 16, 64), k=(2, 1, 16, 64))
    cudnn_sdpa.sdpa_graph(mod2, "h", mqa)
    tensors = {e[1]: e[2] for e in log2 if e[0] == "tensor"}
    assert tensors["K"] == [2, 1, 16, 64] and tensors["V"] == [2, 1, 16, 64] and tensors["Q"] == [2, 8, 16, 64]


def test_grouped_query_binds_the_grouped_kv_heads_as_they_are(fake):
    """kv_groups=g: cuDNN's SDPA reads K and V with H / g heads (head h of Q takes h // g, as the op), so
    they are bound as given, no repeat; K^T is transposed with its own heads."""
    mod, log = fake
    sig = _attn(q=(2, 8, 16, 64), k=(2, 2, 16, 64), kv_groups=4, causal=1)
    assert cudnn_sdpa.sdpa_reason(sig) is None
    g = cudnn_sdpa.sdpa_graph(mod, "h", sig)[2]
    assert (g.H, g.Hk) == (8, 2)
    tensors = {e[1]: e[2] for e in log if e[0] == "tensor"}
    assert tensors["K"] == tensors["V"] == [2, 2, 16, 64] and tensors["Q"] == [2, 8, 16, 64]
    kt = _attn(q=(2, 8, 16, 64), k=(2, 2, 64, 16), v=(2, 2, 16, 64), kv_groups=4, k_transposed=1)
    assert cudnn_sdpa.sdpa_geom(kt).workspace_parts(0)[2] == 2 * 2 * 16 * 64 * 2  # K^T's copy, 2 heads
    wrong = _attn(q=(2, 8, 16, 64), k=(2, 4, 16, 64), kv_groups=4)
    assert "kv_groups=4 needs" in cudnn_sdpa.sdpa_reason(wrong)
    assert "one head" in cudnn_sdpa.sdpa_reason(_attn(q=(2, 8, 16, 64), k=(2, 2, 16, 64)))  # no kv_groups: no GQA


def test_grouped_query_also_runs_as_the_plain_graph_on_repeated_heads(fake):
    """cudnn_rkv: for grouped K/V only, the plain signature's plans (shared with its cudnn candidates) after
    each K/V head is repeated into the workspace in front of the plan's own; keys parse back."""
    from graphopt.providers import cudnn_sdpa_repeat as rkv

    mod, log = fake
    sig = _attn(q=(2, 8, 16, 64), k=(2, 2, 16, 64), kv_groups=4)
    plain = _attn(q=(2, 8, 16, 64))
    assert rkv.candidates("Attention", plain) == [] and "kv_groups > 1" in rkv.repeat_reason(plain)
    keys = [c.key() for c in rkv.candidates("Attention", sig)]
    assert keys == ["cudnn_rkv"] + [f"cudnn_rkv:plan={p}" for p in PLANS]
    assert set(keys) <= {c.key() for c in registry.candidates_for(sig)}
    for k in keys:
        assert registry.candidate_from_key("Attention", k).key() == k
    low = registry.candidate_from_key("Attention", keys[1]).build(sig, "sm_90")
    kv = 2 * 8 * 16 * 64 * 2  # each repeated tensor, fp16
    assert low.workspace_bytes == 2 * kv + 1024 and low.capturable and not low.barrier
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 8, 16, 64)).astype(np.float16)
    k, v = (rng.standard_normal((2, 2, 16, 64)).astype(np.float16) for _ in range(2))
    low([q, k, v], [np.zeros_like(q)])
    graph = prov._GRAPHS[plain.key()].graph  # the plain signature's graph
    assert np.array_equal(graph.bound["K"].view(np.float16), np.repeat(k, 4, axis=1))
    assert np.array_equal(graph.bound["V"].view(np.float16), np.repeat(v, 4, axis=1))
    assert "kv_groups > 1" in rkv.CudnnSdpaRepeat("cudnn_rkv").applies(plain)


@pytest.mark.parametrize("mask, kind, in_ws", [
    ((2, 1, 16, 16), "additive", False),   # [B, 1, Sq, Skv]: cuDNN's bias as is
    ((16, 16), "additive", False),         # [Sq, Skv] broadcast over B and H
    ((2, 1, 1, 16), "additive", True),     # BERT's [B, 1, 1, Skv]: expanded over Sq in the workspace
    ((2, 1, 1, 16), "bool", True),         # padding mask: a -inf / 0 bias in the workspace
    ((2, 4, 16, 16), "bool", True),
])
def test_masks_become_cudnn_bias(fake, mask, kind, in_ws):
    mod, log = fake
    sig = _attn(mask=mask, mask_dtype="bool" if kind == "bool" else None)
    g = cudnn_sdpa.sdpa_graph(mod, "h", sig)[2]
    bias = next(e for e in log if e[0] == "tensor" and e[1] == "bias")
    m4 = (1,) * (4 - len(mask)) + mask
    assert bias[2] == [m4[0], m4[1], 16, 16] and bias[4] == "HALF"
    assert _ops(log, "sdpa")[0]["bias"] == "bias"
    assert g.bias_in_workspace is in_ws


def test_lowering_declares_plan_workspace_layouts_and_keys(fake):
    mod, log = fake
    sig = _attn(mask=(2, 1, 1, 16), mask_dtype="bool", k_transposed=1, k=(2, 4, 64, 16))
    cands = cudnn_sdpa.candidates("Attention", sig)
    keys = [c.key() for c in cands]
    assert keys == ["cudnn", "cudnn:plan=eng3_k5=1", "cudnn:plan=sdpa_fwd_prefill_sm90[TILE_M=128, TILE_N=64]"]
    assert set(keys) <= {c.key() for c in registry.candidates_for(sig)}
    for k in keys:
        assert registry.candidate_from_key("Attention", k).key() == k
    low = registry.candidate_from_key("Attention", keys[2]).build(sig, "sm_90")
    assert isinstance(low, Lowering) and low.capturable and low.barrier and low.outputs == 1
    assert low.layouts == ("rowmajor",) * 5
    assert dict(low.versions) == {"cudnn": "91900", "cudnn_frontend": "1.32.0"}
    # plan 1's 2000 bytes, then K (2*4*16*64 fp16) and the bias (2*1*16*16 fp16), each 256-aligned
    assert low.workspace_bytes == 2048 + 16384 + 1024
    assert ("build_plan_at_index", 1) in log
    assert cands[0].build(sig, "sm_90").workspace_bytes == 1024 + 16384 + 1024  # the first plan, same graph
    assert sum(e[0] == "pygraph" for e in log) == 1
    with pytest.raises(Exception, match="not offered"):
        cudnn_sdpa.CudnnSdpa("cudnn", (("plan", "eng99"),)).build(sig, "sm_90")


def test_launch_transposes_k_builds_the_bias_and_zeroes_nans(fake):
    mod, log = fake
    rng = np.random.default_rng(0)
    sig = _attn(q=(2, 4, 16, 64), k=(2, 4, 64, 16), mask=(2, 1, 1, 16), mask_dtype="bool", k_transposed=1,
                nan_to_zero=1, mask_value=-100.0)
    low = cudnn_sdpa.CudnnSdpa("cudnn").build(sig, "sm_90")
    q = rng.standard_normal((2, 4, 16, 64)).astype(np.float16)
    kt = rng.standard_normal((2, 4, 64, 16)).astype(np.float16)
    v = rng.standard_normal((2, 4, 16, 64)).astype(np.float16)
    m = rng.random((2, 1, 1, 16)) < 0.5
    y = np.full((2, 4, 16, 64), np.nan, np.float16)
    y[0, 0, 0, :3] = 1.0
    low([q, kt, v, m], [y])
    assert ("set_stream", 7) in log
    graph = prov._GRAPHS[sig.key()].graph
    assert log[-1] == ("execute", ["K", "Q", "V", "bias", "sdpa"], 0)
    k = graph.bound["K"].view(np.float16)
    assert np.array_equal(k, np.swapaxes(kt, -1, -2))
    bias = graph.bound["bias"].view(np.float16)
    assert bias.shape == (2, 1, 16, 16)
    assert np.array_equal(bias, np.broadcast_to(np.where(m, 0.0, -100.0), (2, 1, 16, 16)).astype(np.float16))
    assert np.isnan(y).sum() == 0 and (y[0, 0, 0, :3] == 1).all()  # the fake graph wrote nothing: NaN -> 0


def test_additive_broadcast_mask_is_expanded_and_a_full_one_bound_as_is(fake):
    mod, log = fake
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, 16, 64)).astype(np.float16)
    for shape in ((2, 1, 1, 16), (2, 1, 16, 16)):
        sig = _attn(mask=shape)
        low = cudnn_sdpa.CudnnSdpa("cudnn").build(sig, "sm_90")
        m = rng.standard_normal(shape).astype(np.float16)
        y = np.zeros_like(q)
        low([q, q, q, m], [y])
        bias = prov._GRAPHS[sig.key()].graph.bound["bias"].view(np.float16)
        assert np.array_equal(bias.reshape(-1), np.broadcast_to(m, (2, 1, 16, 16)).reshape(-1))
        assert low.workspace_bytes == (1024 + 1024 if shape[2] == 1 else 1024)


def test_bf16_mask_value_bits():
    import ml_dtypes

    assert cudnn_sdpa.bits16(-math.inf, "bfloat16") == 0xFF80
    assert cudnn_sdpa.bits16(-math.inf, "float16") == 0xFC00
    assert np.array(cudnn_sdpa.bits16(-3.5, "bfloat16"), np.uint16).view(ml_dtypes.bfloat16) == -3.5


# ---------------------------------------------------------------------------------- norms
def _ln(x=(2, 5, 64), bias=True, skip=False, skip_bias=False, sum_output=0, dtype="float16", skip_shape=None, eps=1e-5):
    d = x[-1]
    shapes = [x, (d,), (d,) if bias else None, (skip_shape or x) if skip else None, (d,) if skip_bias else None]
    dts = [dtype if s is not None else "" for s in shapes]
    return Signature.make("LayerNorm", shapes, dts, {"epsilon": eps, "sum_output": sum_output})


def test_layernorm_graph_inference_phase_and_epsilon_by_value(fake):
    mod, log = fake
    sig = _ln()
    cudnn_norm.norm_graph(mod, "h", sig)
    tensors = {e[1]: e[2:] for e in log if e[0] == "tensor"}
    assert tensors["X"][:2] == ([10, 64, 1, 1], [64, 1, 1, 1]) and tensors["scale"][0] == [1, 64, 1, 1]
    assert tensors["eps"] == ([1, 1, 1, 1], [1, 1, 1, 1], "FLOAT", True)
    ln = _ops(log, "layernorm")[0]
    assert ln["norm_forward_phase"] == "INFERENCE" and ln["input"] == "X" and ln["epsilon"] == "eps"
    assert ln["bias"] == "bias" and not _ops(log, "add")
    assert ("set_output", "norm", True) in log and ("set_data_type", "norm", "HALF") in log


def test_skip_layernorm_graph_adds_and_marks_the_sum_as_output(fake):
    mod, log = fake
    sig = _ln(skip=True, skip_bias=True, sum_output=1)
    t = cudnn_norm.norm_graph(mod, "h", sig)[1]
    adds = _ops(log, "add")
    assert [a["b"] for a in adds] == ["skip", "skip_bias"] and adds[1]["a"] == "skip_add"
    assert _ops(log, "layernorm")[0]["input"] == "skip_bias_add"
    assert ("set_output", "skip_bias_add", True) in log and "S" in t
    low = cudnn_norm.CudnnNorm("cudnn").build(sig, "sm_90")
    assert low.outputs == 2 and low.layouts == ("rowmajor",) * 7 and low.capturable and low.barrier and low.workspace_bytes == 1000
    no_sum = cudnn_norm.CudnnNorm("cudnn").build(_ln(skip=True), "sm_90")
    assert no_sum.outputs == 1


def test_skip_layernorm_launch_binds_both_outputs_or_a_scratch_sum(fake):
    mod, log = fake
    sig = _ln(skip=True, sum_output=1, eps=1e-3)
    low = cudnn_norm.CudnnNorm("cudnn", (("plan", PLANS[1]),)).build(sig, "sm_90")
    x = np.ones((2, 5, 64), np.float16)
    p = np.ones(64, np.float16)
    low([x, p, p, x, None], [np.empty_like(x), np.empty_like(x)])
    graph = prov._GRAPHS[sig.key()].graph
    assert log[-1] == ("execute", ["X", "bias", "eps", "norm", "scale", "skip", "skip_add"], 1)  # S is skip_add
    assert graph.bound["eps"].dtype == np.float32 and graph.bound["eps"].reshape(-1)[0] == np.float32(1e-3)
    low([x, p, p, x, None], [np.empty_like(x)])  # the checker's single output: S goes to scratch
    assert graph.bound["skip_add"].nbytes == x.nbytes


def test_skip_rmsnorm_graph_adds_binds_by_name_and_keeps_the_sum(fake):
    """SkipRMSNorm's skip is its input 2: the graph adds it before the rmsnorm and S is the add's output."""
    mod, log = fake
    x = (2, 5, 64)
    sig = Signature.make("RMSNorm", [x, (64,), x], ["float16"] * 3, {"epsilon": 1e-6, "sum_output": 1})
    low = cudnn_norm.CudnnNorm("cudnn").build(sig, "sm_90")
    assert [a["b"] for a in _ops(log, "add")] == ["skip"] and _ops(log, "rmsnorm")[0]["input"] == "skip_add"
    assert low.outputs == 2 and low.layouts == ("rowmajor",) * 5
    a = np.ones(x, np.float16)
    low([a, np.ones(64, np.float16), a], [np.empty_like(a), np.empty_like(a)])
    assert log[-1] == ("execute", ["X", "eps", "norm", "scale", "skip", "skip_add"], 0)
    broadcast = Signature.make("RMSNorm", [x, (64,), (1, 5, 64)], ["float16"] * 3, {})
    assert "broadcast over the leading dims" in cudnn_norm.CudnnNorm("cudnn").applies(broadcast, (9, 0))


def test_layernorm_without_bias_binds_zeros_and_rmsnorm_has_no_bias(fake):
    mod, log = fake
    sig = _ln(bias=False)
    low = cudnn_norm.CudnnNorm("cudnn").build(sig, "sm_90")
    x = np.ones((2, 5, 64), np.float16)
    low([x, np.ones(64, np.float16), None, None, None], [np.empty_like(x)])
    graph = prov._GRAPHS[sig.key()].graph
    assert not graph.bound["bias"].any() and graph.bound["bias"].nbytes == 128
    rms = Signature.make("RMSNorm", [(3, 7, 128), (128,)], ["bfloat16"] * 2, {"epsilon": 1e-6})
    lowr = cudnn_norm.CudnnNorm("cudnn").build(rms, "sm_90")
    r = _ops(log, "rmsnorm")[0]
    assert r["norm_forward_phase"] == "INFERENCE" and "bias" not in r and lowr.layouts == ("rowmajor",) * 5
    assert next(e for e in log if e[0] == "tensor" and e[1] == "X" and e[2] == [21, 128, 1, 1])[4] == "BF16"


@pytest.mark.parametrize("sig, words", [
    (_ln(dtype="float64"), "cuDNN normalization takes"),
    (_ln(skip=True, skip_shape=(1, 5, 64)), "broadcast over the leading dims"),
    (Signature.make("LayerNorm", [(4, 64), (1, 32)], ["float16"] * 2, {}), "must hold the 64 values"),
    (Signature.make("RMSNorm", [None, (64,)], ["float16"] * 2, {}), "known, non-empty X"),
])
def test_norm_forms_not_lowered_say_why(fake, sig, words):
    assert words in cudnn_norm.CudnnNorm("cudnn").applies(sig, (9, 0))
    assert [c.key() for c in registry.candidates_for(sig) if c.name == "cudnn"] == ["cudnn"]


def test_norm_plans_are_candidates_keyed_by_name(fake):
    for sig in (_ln(skip=True, sum_output=1), Signature.make("RMSNorm", [(4, 64), (64,)], ["float16"] * 2, {})):
        keys = [c.key() for c in registry.candidates_for(sig) if c.name == "cudnn"]
        assert keys == ["cudnn"] + [f"cudnn:plan={p}" for p in PLANS]
        for k in keys:
            assert registry.candidate_from_key(sig.op, k).key() == k
            assert registry.candidate_from_key(sig.op, k).applies(sig, (9, 0)) is None


def test_skip_layernorm_falls_back_to_the_training_phase_with_stats_in_the_workspace(fake, monkeypatch):
    mod, log = _fake_cudnn(refuse_inference=True)  # cuDNN offers no INFERENCE plan for the fused add
    monkeypatch.setattr(prov, "_STATE", {"module": mod, "reason": None})
    sig = _ln(x=(2, 5, 64), skip=True, sum_output=1)
    keys = [c.key() for c in cudnn_norm.candidates("LayerNorm", sig)]
    assert keys == ["cudnn"] + [f"cudnn:plan={p}" for p in PLANS]
    assert [e[1]["norm_forward_phase"] for e in log if e[0] == "layernorm"] == ["INFERENCE", "TRAINING"]
    assert ("set_output", "norm:1", True) in log and ("set_data_type", "norm:2", "FLOAT") in log
    low = cudnn_norm.CudnnNorm("cudnn").build(sig, "sm_90")
    assert low.workspace_bytes == 1024 + 256 + 256 and low.outputs == 2  # plan 0, then mean and inv_var (10 rows)
    x = np.ones((2, 5, 64), np.float16)
    p = np.ones(64, np.float16)
    low([x, p, p, x, None], [np.empty_like(x), np.empty_like(x)])
    graph = prov._GRAPHS[sig.key() + "|training"].graph
    assert {"norm:1", "norm:2", "skip_add", "norm"} <= set(graph.bound)
    assert graph.bound["norm:1"].nbytes == 256


def test_provider_modules_import_first_in_a_fresh_process():
    """The profiler's worker unpickles a candidate by its module: each provider module imports on its
    own (no cycle through graphopt.kernels) and reports its absence as a reason."""
    import subprocess

    code = ("import graphopt.providers.cudnn_sdpa as s, graphopt.providers.cudnn_norm as n; "
            "from graphopt.lowering import Signature; "
            "sig = Signature.make('Attention', [(1, 2, 8, 64)] * 3 + [None], ['float16'] * 3 + [''], {}); "
            "print(type(s.CudnnSdpa('cudnn').applies(sig, (9, 0))).__name__, n.OPS)")
    repeat = ("import graphopt.providers.cudnn_sdpa_repeat as r; from graphopt.lowering import Signature; "
              "sig = Signature.make('Attention', [(1, 4, 8, 64)] + [(1, 2, 8, 64)] * 2 + [None], ['float16'] * 3 + [''], "
              "{'kv_groups': 2}); print(type(r.CudnnSdpaRepeat('cudnn_rkv').applies(sig, (9, 0))).__name__)")
    out = subprocess.run([sys.executable, "-c", repeat], capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "PYTHONPATH": ":".join(sys.path)})
    assert out.returncode == 0 and out.stdout.split()[0] in ("str", "NoneType"), out.stderr[-800:]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "PYTHONPATH": ":".join(sys.path)})
    assert out.returncode == 0, out.stderr[-800:]
    assert out.stdout.split()[0] in ("str", "NoneType")


def test_a_host_scalar_in_the_variant_pack_accepts_the_frontends_stream_argument():
    """The frontend reads every entry with __dlpack__(stream=-1); NumPy refuses any stream but None
    (every cuDNN norm failed on the H200 that way): bind wraps host arrays so the stream is dropped."""
    import numpy as np

    from graphopt.providers.cudnn import bind

    eps = np.full((1, 1, 1, 1), 1e-5, dtype=np.float32)
    with pytest.raises((ValueError, RuntimeError)):  # the error type depends on NumPy's version
        eps.__dlpack__(stream=-1)
    entry = bind(eps)
    assert entry.__dlpack__(stream=-1) is not None and entry.__dlpack_device__() == eps.__dlpack_device__()
    assert np.from_dlpack(entry)[0, 0, 0, 0] == np.float32(1e-5)
