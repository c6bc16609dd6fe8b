"""The cuDNN SDPA and norm providers on the GPU: the plans cuDNN lists (the heuristic's first
``GRAPHOPT_CUDNN_TEST_PLANS``, default 4, per signature) for sweeps of Attention signatures (seq
1/7/128/129, odd sizes, head dims 64 and 128, causal, additive / broadcast / bool / padding masks,
k_transposed, one K/V head, nan_to_zero over fully masked rows) and LayerNorm / SkipLayerNorm (both
outputs) / RMSNorm signatures, fp16 and bf16 (and fp32 for norms), are checked against the op's
float64 reference with NaN-poisoned outputs: a wrong plan is a failure, a plan that does not build
is reported. One plan per op is captured in a CUDA graph and replayed; and a one-node model whose
node records ``cudnn`` runs through the runtime (graphs on) with the right outputs.

Data goes in and out as NumPy arrays of the signature's dtype (bf16 through ml_dtypes, which CuPy 14
accepts); the lowering only reads pointers and 16-bit views, so no CuPy arithmetic runs on bf16.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

import ml_dtypes  # noqa: E402,F401 - registers "bfloat16" with NumPy

from graphopt.lowering import Signature, as_lowering  # noqa: E402
from graphopt.ops import get_schema  # noqa: E402
from graphopt.providers import cudnn as prov  # noqa: E402
from graphopt.providers import cudnn_norm, cudnn_sdpa, cudnn_sdpa_repeat  # noqa: E402

if prov.unavailable():
    pytest.skip(prov.unavailable(), allow_module_level=True)

MAX_PLANS = int(os.environ.get("GRAPHOPT_CUDNN_TEST_PLANS", "4"))
TOL = {"float16": 1e-2, "bfloat16": 2.5e-2, "float32": 1e-4}


def _np_dtype(dt: str):
    return np.dtype(dt)  # "bfloat16" resolves through ml_dtypes


def _host_inputs(sig: Signature, rng, special=None):
    """Random host inputs of the signature's dtypes; ``special`` overrides by index."""
    out = []
    for i, (shape, dt) in enumerate(zip(sig.input_shapes, sig.dtypes)):
        if special and i in special:
            out.append(special[i])
        elif shape is None:
            out.append(None)
        elif dt == "bool":
            m = rng.random(shape) < 0.7
            m[..., 0] = True
            out.append(m)
        else:
            out.append(rng.standard_normal(shape).astype(np.float32).astype(_np_dtype(dt)))
    return out


def _poisoned(shape, dt):
    return cupy.asarray(np.full(shape, np.nan, dtype=np.float32).astype(_np_dtype(dt)))


def _run(low, sig, host, n_out, out_shape):
    dev = [None if a is None else cupy.asarray(a) for a in host]
    outs = [_poisoned(out_shape, sig.dtypes[0]) for _ in range(n_out)]
    low(dev, outs)
    cupy.cuda.get_current_stream().synchronize()
    return [cupy.asnumpy(o).astype(np.float64) for o in outs]


def _compare(got, want, dt) -> str | None:
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if not np.array_equal(np.isfinite(got), np.isfinite(want)):
        return f"{int((~np.isfinite(got)).sum())} outputs not written or not finite (reference: {int((~np.isfinite(want)).sum())})"
    f = np.isfinite(want)
    err = float(np.linalg.norm(got[f] - want[f]) / max(np.linalg.norm(want[f]), 1e-30))
    return None if err <= TOL[dt] else f"normwise relative error {err:.2e} > {TOL[dt]}"


def _reference(op, host, attrs):
    schema = get_schema(op)
    f64 = [None if a is None else (a if a.dtype == bool else a.astype(np.float64)) for a in host]
    return schema.reference(f64 + [None] * (len(schema.inputs) - len(f64)), dict(attrs))


def _check_plans(cands, sig, host=None, n_out=1):
    rng = np.random.default_rng(0)
    host = host if host is not None else _host_inputs(sig, rng)
    want = _reference(sig.op, host, sig.attrs)
    out_shape = want[0].shape
    assert cands[0].applies(sig, (9, 0)) is None, cands[0].applies(sig, (9, 0))
    ok, wrong, unbuilt = 0, [], []
    for cand in cands[:MAX_PLANS]:
        try:
            low = as_lowering(cand.build(sig, "sm_90"))
        except Exception as e:  # noqa: BLE001 - a plan cuDNN lists but cannot build scores inf in the tuner
            unbuilt.append((cand.key(), str(e)[:160]))
            continue
        got = _run(low, sig, host, n_out, out_shape)
        reasons = [r for r in (_compare(g, w, sig.dtypes[0]) for g, w in zip(got, want[:n_out])) if r]
        if reasons:
            wrong.append((cand.key(), reasons))
        else:
            ok += 1
    print(f"{sig.key()}: {ok} plans correct of {min(len(cands), MAX_PLANS)}, {len(unbuilt)} did not build {unbuilt[:2]}")
    return ok, wrong, unbuilt


def _attn(B, H, Sq, Skv, D, dtype, Dv=None, Hk=None, mask=None, mask_dtype=None, **attrs):
    Hk = Hk or H
    q, v = (B, H, Sq, D), (B, Hk, Skv, Dv or D)
    k = (B, Hk, D, Skv) if attrs.get("k_transposed") else (B, Hk, Skv, D)
    if mask is not None:
        attrs.setdefault("mask_kind", "bool" if mask_dtype == "bool" else "additive")
    return Signature.make("Attention", [q, k, v, mask], [dtype] * 3 + [(mask_dtype or dtype) if mask else ""], attrs)


SHAPES = [(2, 3, 1, 7, 64), (1, 2, 7, 7, 64), (2, 4, 128, 128, 64), (1, 3, 129, 129, 128), (3, 5, 33, 65, 64),
          (1, 2, 7, 129, 128), (2, 3, 17, 33, 40)]
DTYPES = ["float16", "bfloat16"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_plans_over_shapes(dtype, shape, causal):
    B, H, Sq, Skv, D = shape
    sig = _attn(B, H, Sq, Skv, D, dtype, causal=causal)
    ok, wrong, unbuilt = _check_plans(cudnn_sdpa.candidates("Attention", sig), sig)
    assert not wrong, wrong
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


FORMS = {
    "scale": dict(scale=0.3),
    "additive_full": dict(mask=(2, 1, 129, 129)),
    "additive_heads": dict(mask=(2, 4, 129, 129)),
    "additive_key_padding": dict(mask=(2, 1, 1, 129)),
    "additive_causal": dict(mask=(129, 129), causal=1),
    "bool_full": dict(mask=(2, 4, 129, 129), mask_dtype="bool"),
    "bool_padding_mask_value": dict(mask=(2, 1, 1, 129), mask_dtype="bool", mask_value=-10000.0),
    "k_transposed": dict(k_transposed=1, scale=0.125),
    "k_transposed_bool_causal": dict(k_transposed=1, mask=(2, 1, 1, 129), mask_dtype="bool", causal=1),
    "one_kv_head": dict(Hk=1),
    "dv_differs": dict(Dv=128),
    # grouped-query attention: K and V with H / kv_groups heads, bound as they are
    "grouped_kv_causal": dict(Hk=2, kv_groups=2, causal=1),
    "grouped_kv_kt_padding": dict(Hk=1, kv_groups=4, k_transposed=1, mask=(2, 1, 1, 129), mask_dtype="bool"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", list(FORMS))
def test_attention_plans_for_every_form(dtype, form):
    sig = _attn(2, 4, 129, 129, 64, dtype, **FORMS[form])
    ok, wrong, unbuilt = _check_plans(cudnn_sdpa.candidates("Attention", sig), sig)
    assert not wrong, wrong
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


GROUPED_FORMS = [f for f, kw in FORMS.items() if "kv_groups" in kw]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", GROUPED_FORMS)
def test_grouped_kv_plans_on_repeated_heads(dtype, form):
    """cudnn_rkv: the plain graph's plans after the heads' repeat into the workspace."""
    sig = _attn(2, 4, 129, 129, 64, dtype, **FORMS[form])
    ok, wrong, unbuilt = _check_plans(cudnn_sdpa_repeat.candidates("Attention", sig), sig)
    assert not wrong, wrong
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


BSHD_FORMS = {
    "gpt2": dict(B=32, H=12, Sq=128, Skv=128, mask=(32, 1, 128, 128), scale=0.125, nan_to_zero=1),
    "odd_causal": dict(B=2, H=3, Sq=37, Skv=37, causal=1),
    "one_kv_head_pad": dict(B=2, H=4, Sq=33, Skv=65, Hk=1, mask=(2, 1, 1, 65), mask_dtype="bool"),
    "gpt2_y_too": dict(B=32, H=12, Sq=128, Skv=128, mask=(32, 1, 128, 128), scale=0.125, nan_to_zero=1, y_bshd=1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", list(BSHD_FORMS))
def test_attention_plans_read_bshd(dtype, form):
    """qkv_bshd=1: Q, K, V as [B, S, H, D] bound as strided cuDNN tensors (and O with y_bshd=1), every
    plan against the reference (which writes Y in the same layout)."""
    kw = dict(BSHD_FORMS[form])
    plain = _attn(kw.pop("B"), kw.pop("H"), kw.pop("Sq"), kw.pop("Skv"), 64, dtype, **kw)
    shapes = [(s[0], s[2], s[1], s[3]) for s in plain.input_shapes[:3]] + list(plain.input_shapes[3:])
    sig = Signature.make("Attention", shapes, list(plain.dtypes), {**dict(plain.attrs), "qkv_bshd": 1})
    ok, wrong, unbuilt = _check_plans(cudnn_sdpa.candidates("Attention", sig), sig)
    assert not wrong, wrong
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


PACKED_FORMS = {
    "gpt2": dict(B=32, H=12, S=128, mask=(32, 1, 128, 128), scale=0.125, nan_to_zero=1, y_bshd=1),
    "bert_bs1": dict(B=1, H=12, S=128, mask=(1, 1, 1, 128)),
    "odd_causal": dict(B=2, H=3, S=37, causal=1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", list(PACKED_FORMS))
def test_attention_plans_read_packed_qkv(dtype, form):
    """qkv_packed=1: Q, K, V the thirds of one [B, S, 3, H, D] input, bound at offsets 0, H*D, 2*H*D with
    rows 3 * H * D apart; every plan against the reference."""
    kw = dict(PACKED_FORMS[form])
    b, h, s = kw.pop("B"), kw.pop("H"), kw.pop("S")
    mask = kw.pop("mask", None)
    if mask is not None:
        kw["mask_kind"] = "additive"
    sig = Signature.make("Attention", [(b, s, 3, h, 64), None, None, mask], [dtype, "", "", dtype if mask else ""],
                         {**kw, "qkv_bshd": 1, "qkv_packed": 1})
    ok, wrong, unbuilt = _check_plans(cudnn_sdpa.candidates("Attention", sig), sig)
    assert not wrong, wrong
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_padding_mask_with_fully_masked_rows_and_nan_to_zero(dtype):
    """A key-padding bool mask where one batch attends to nothing: the op (nan_to_zero=1) gives 0 rows."""
    sig = _attn(2, 2, 128, 128, 64, dtype, mask=(2, 1, 1, 128), mask_dtype="bool", nan_to_zero=1)
    rng = np.random.default_rng(3)
    mask = np.zeros((2, 1, 1, 128), bool)
    mask[0, ..., :77] = True  # batch 0: 77 keys; batch 1: none
    host = _host_inputs(sig, rng, {3: mask})
    ok, wrong, unbuilt = _check_plans(cudnn_sdpa.candidates("Attention", sig), sig, host)
    assert not wrong, wrong
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


def _ln(x, dtype, bias=True, skip=False, skip_bias=False, sum_output=0, eps=1e-5):
    d = x[-1]
    shapes = [x, (d,), (d,) if bias else None, x if skip else None, (d,) if skip_bias else None]
    return Signature.make("LayerNorm", shapes, [dtype if s is not None else "" for s in shapes],
                          {"epsilon": eps, "sum_output": sum_output})


NORM_SHAPES = [(1, 768), (7, 768), (2, 129, 1024), (3, 5, 4096), (5, 96)]
NORM_FORMS = {
    "layernorm": dict(), "no_bias": dict(bias=False), "skip": dict(skip=True),
    "skip_bias_sum": dict(skip=True, skip_bias=True, sum_output=1), "skip_sum_eps": dict(skip=True, sum_output=1, eps=1e-3),
    "rmsnorm": None, "rms_skip_sum": None,
}
# every shape for the plain forms, two shapes for the rest (a run's time bound)
NORM_CASES = [(f, x) for f in NORM_FORMS for x in (NORM_SHAPES if f in ("layernorm", "rmsnorm") else NORM_SHAPES[1:3])]


def _norm_sig(form, x, dtype):
    if form == "rmsnorm":
        return Signature.make("RMSNorm", [x, (x[-1],)], [dtype] * 2, {"epsilon": 1e-6})
    if form == "rms_skip_sum":  # SkipRMSNorm keeping its sum (LLaMA's residual stream)
        return Signature.make("RMSNorm", [x, (x[-1],), x], [dtype] * 3, {"epsilon": 1e-6, "sum_output": 1})
    return _ln(x, dtype, **NORM_FORMS[form])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("form, x", NORM_CASES, ids=[f"{f}-{'x'.join(map(str, x))}" for f, x in NORM_CASES])
def test_norm_plans(dtype, form, x):
    sig = _norm_sig(form, x, dtype)
    n_out = 2 if sig.attr("sum_output", 0) else 1
    ok, wrong, unbuilt = _check_plans(cudnn_norm.candidates(sig.op, sig), sig, n_out=n_out)
    assert not wrong, wrong
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["layernorm", "skip_bias_sum", "rmsnorm", "rms_skip_sum"])
@pytest.mark.parametrize("x", [(3, 100), (2, 7, 37)], ids=["3x100", "2x7x37"])
def test_norm_odd_row_lengths_are_right_or_refused(form, x):
    """Row lengths that are not a multiple of 8: a plan cuDNN offers must be right; none may be offered."""
    sig = _norm_sig(form, x, "float16")
    n_out = 2 if sig.attr("sum_output", 0) else 1
    ok, wrong, unbuilt = _check_plans(cudnn_norm.candidates(sig.op, sig), sig, n_out=n_out)
    assert not wrong, wrong


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["skip_bias_sum", "layernorm", "rmsnorm", "rms_skip_sum"])
def test_norm_training_phase_form_is_right_too(form, monkeypatch):
    """The TRAINING-phase graph (taken where cuDNN offers no INFERENCE plan) with its statistics in the
    workspace gives the same outputs."""
    monkeypatch.setattr(cudnn_norm, "norm_built",
                        lambda sig: prov.listed(sig, cudnn_norm._training_graph, tag="|training"))
    sig = _norm_sig(form, (7, 768), "float16")
    n_out = 2 if sig.attr("sum_output", 0) else 1
    ok, wrong, unbuilt = _check_plans(cudnn_norm.candidates(sig.op, sig), sig, n_out=n_out)
    assert not wrong, wrong
    assert ok >= 1, f"no plan ran: {unbuilt[:3]}"


def _capture_and_compare(low, sig, n_out):
    rng = np.random.default_rng(5)
    host = _host_inputs(sig, rng)
    want = _reference(sig.op, host, sig.attrs)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        ins = [None if a is None else cupy.asarray(a) for a in host]
        ws = cupy.empty(max(1, low.workspace_bytes), dtype=cupy.uint8)
        eager = [_poisoned(want[0].shape, sig.dtypes[0]) for _ in range(n_out)]
        low.launch(ins, eager, ws)
        outs = [_poisoned(want[0].shape, sig.dtypes[0]) for _ in range(n_out)]
        stream.synchronize()
        stream.begin_capture()
        try:
            low.launch(ins, outs, ws)
        finally:
            graph = stream.end_capture()
        for _ in range(2):
            graph.launch(stream)
        stream.synchronize()
    for o, e, w in zip(outs, eager, want):
        assert cupy.array_equal(o.view(cupy.uint8), e.view(cupy.uint8))
        assert _compare(cupy.asnumpy(o).astype(np.float64), w, sig.dtypes[0]) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_plan_captures_in_a_cuda_graph(dtype):
    # the form with the most work around the graph: K transposed and a bool mask into the workspace
    sig = _attn(2, 4, 128, 128, 64, dtype, k_transposed=1, mask=(2, 1, 1, 128), mask_dtype="bool", causal=1,
                nan_to_zero=1)
    _capture_and_compare(as_lowering(cudnn_sdpa.CudnnSdpa("cudnn").build(sig, "sm_90")), sig, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_sdpa_captures_in_a_cuda_graph(dtype):
    """Grouped K/V read as they are, and repeated first (the copies captured with the plan)."""
    sig = _attn(2, 4, 128, 128, 64, dtype, Hk=2, kv_groups=2, causal=1)
    _capture_and_compare(as_lowering(cudnn_sdpa.CudnnSdpa("cudnn").build(sig, "sm_90")), sig, 1)
    _capture_and_compare(as_lowering(cudnn_sdpa_repeat.CudnnSdpaRepeat("cudnn_rkv").build(sig, "sm_90")), sig, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["LayerNorm", "RMSNorm"])
def test_norm_plan_captures_in_a_cuda_graph(op):
    if op == "LayerNorm":
        sig, n_out = _ln((4, 33, 768), "float16", skip=True, skip_bias=True, sum_output=1), 2
    else:
        sig, n_out = _norm_sig("rms_skip_sum", (4, 33, 2048), "float16"), 2
    _capture_and_compare(as_lowering(cudnn_norm.CudnnNorm("cudnn").build(sig, "sm_90")), sig, n_out)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_recorded_cudnn_lowerings_run_in_the_runtime(graphs):
    """One-node models recording ``cudnn`` run through Session(device="cuda"): workspace, the sum output
    and epsilon by value included; the plan summary names no fallback."""
    from graphopt.ops.testing import one_node_model
    from graphopt.runtime import Session, to_numpy

    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 4, 128, 64)).astype(np.float16) for _ in range(3))
    mask = rng.standard_normal((2, 1, 1, 128)).astype(np.float16)
    x, skip = (rng.standard_normal((2, 33, 768)).astype(np.float16) for _ in range(2))
    scale, bias = (rng.standard_normal(768).astype(np.float16) for _ in range(2))
    cases = [
        ("Attention", [("Q", q), ("K", k), ("V", v), ("mask", mask)], {"mask_kind": "additive", "causal": 1}, []),
        ("LayerNorm", [("X", x), ("scale", scale), ("bias", bias), ("skip", skip)], {"epsilon": 1e-5, "sum_output": 1},
         [("S", x.shape)]),
        ("RMSNorm", [("X", x), ("scale", scale)], {"epsilon": 1e-6}, []),
        ("RMSNorm", [("X", x), ("scale", scale), ("skip", skip)], {"epsilon": 1e-6, "sum_output": 1}, [("S", x.shape)]),
    ]
    for op, inputs, attrs, extra in cases:
        model = one_node_model(op, inputs, dict(attrs, lowering="cudnn"), 18,
                               (2, 4, 128, 64) if op == "Attention" else x.shape, extra_outputs=extra)
        sess = Session(model, device="cuda", cuda_graphs=graphs)
        feeds = dict(inputs)
        for _ in range(2):
            got = sess.run(feeds)
        want = _reference(op, [a for _, a in inputs], attrs)
        for name, w in zip(["Y", "S"], want):
            assert _compare(to_numpy(got[name]).astype(np.float64), w, "float16") is None, (op, name)
        notes = " ".join(sess.plan_summary()["notes"])
        assert "fallback" not in notes and "does not apply" not in notes, notes
        if graphs:
            assert not sess.graph_status.startswith("eager"), sess.graph_status
