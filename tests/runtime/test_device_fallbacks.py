"""No graphopt op runs on the host with device="cuda": every built-in op's device fallback (written
against ``xp``) equals its float64 reference, on the CPU with xp = numpy; through the fake CuPy, an
optimized transformer runs with no custom step reading device data back; an op with no device
implementation is refused at Session(...), naming the node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from _runtime_helpers import ort_run, random_feeds, rel_err
from graphopt.ops import get_schema
from graphopt.runtime import ops_custom
from graphopt.runtime.onnx_ops.registry import OpContext, numpy_matmul

ROOT = Path(__file__).resolve().parents[2]
TOL = {np.float32: 2e-5, np.float16: 5e-3}


def _ctx():
    return OpContext(np, None, 0, {}, None, numpy_matmul)


def _check(op, inputs, attrs, dtype):
    ins = [None if a is None else a.astype(dtype) if a.dtype.kind == "f" else a for a in inputs]
    want = get_schema(op).reference([None if a is None else a.astype(np.float64) if a.dtype.kind == "f" else a
                                     for a in ins], attrs)
    got = ops_custom.device_impl(op)(_ctx(), ins, attrs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == dtype and g.shape == w.shape
        finite = np.isfinite(w)
        assert np.array_equal(np.isfinite(g), finite)
        assert rel_err(g[finite].astype(np.float64), w[finite]) <= TOL[dtype], (op, attrs)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("form", ["plain", "bias", "skip", "skip_bias_sum", "skip_broadcast_sum"])
def test_layer_norm_device_fallback(dtype, form):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 37))
    scale, bias = rng.standard_normal(37), rng.standard_normal(37)
    skip = rng.standard_normal((1, 5, 37) if "broadcast" in form else (3, 5, 37))
    sb = rng.standard_normal(37)
    ins = {"plain": [x, scale], "bias": [x, scale, bias], "skip": [x, scale, bias, skip],
           "skip_bias_sum": [x, scale, bias, skip, sb], "skip_broadcast_sum": [x, scale, None, skip, sb]}[form]
    _check("LayerNorm", ins, {"epsilon": 1e-5, "sum_output": int(form.endswith("sum"))}, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rms_norm_and_gelu_device_fallbacks(dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 7, 45))
    _check("RMSNorm", [x, rng.standard_normal(45)], {"epsilon": 1e-6}, dtype)
    for skip in (rng.standard_normal((2, 7, 45)), rng.standard_normal((1, 7, 45))):  # SkipRMSNorm, with its sum
        _check("RMSNorm", [x, rng.standard_normal(45), skip], {"epsilon": 1e-6, "sum_output": 1}, dtype)
    for approx in ("none", "tanh"):
        _check("Gelu", [x * 3], {"approximate": approx}, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("attrs", [
    {}, {"causal": 1}, {"scale": 0.3, "k_transposed": 1}, {"mask_kind": "additive"},
    {"mask_kind": "bool"}, {"mask_kind": "bool", "mask_value": -1e4, "causal": 1},
    {"mask_kind": "bool", "nan_to_zero": 1}, {"kv_groups": 3, "causal": 1},
    {"kv_groups": 3, "k_transposed": 1, "mask_kind": "additive"},
], ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "plain")
def test_attention_device_fallback(dtype, attrs):
    rng = np.random.default_rng(3)
    b, h, sq, skv, d = 2, 3, 7, 11, 16
    hkv = h // attrs.get("kv_groups", 1)  # grouped-query: K and V with H / kv_groups heads
    q, v = rng.standard_normal((b, h, sq, d)), rng.standard_normal((b, hkv, skv, d))
    k = rng.standard_normal((b, hkv, d, skv) if attrs.get("k_transposed") else (b, hkv, skv, d))
    kind = attrs.get("mask_kind", "none")
    mask = None
    if kind == "additive":
        mask = rng.standard_normal((b, 1, 1, skv))
    elif kind == "bool":
        mask = rng.random((b, 1, sq, skv)) < 0.7
        if attrs.get("nan_to_zero"):
            mask[0, 0, 1] = False  # one fully masked row: NaN, then zeroed
        else:
            mask[..., 0] = True
    _check("Attention", [q, k, v] + ([mask] if mask is not None else []), attrs, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("attrs", [{}, {"causal": 1, "y_bshd": 1}, {"mask_kind": "additive"}], ids=["plain", "causal_y", "mask"])
def test_packed_attention_device_fallback(dtype, attrs):
    """qkv_packed=1: Q, K, V the thirds of one [B, S, 3, H, D] input, K and V absent."""
    rng = np.random.default_rng(6)
    b, s, h, d = 2, 9, 3, 16
    mask = rng.standard_normal((b, 1, 1, s)) if attrs.get("mask_kind") else None
    _check("Attention", [rng.standard_normal((b, s, 3, h, d)), None, None] + ([mask] if mask is not None else []),
           {**attrs, "qkv_bshd": 1, "qkv_packed": 1}, dtype)


@pytest.mark.parametrize("name", ["torch/gpt2_torchscript_op14.onnx", "torch/bert_torchscript_op14.onnx"])
def test_fp16_packed_qkv_transformers_run_on_the_device(fake_cuda, name):
    """In fp16 the GPT-2 / BERT exports' attention reads its packed projection (qkv_packed=1); through
    the fake CuPy the optimized model runs with no host step and matches onnxruntime on the original."""
    import graphopt
    from graphopt.runtime import Session, to_numpy

    path = str(ROOT / "models" / name)
    opt, _ = graphopt.optimize(path, gpu="none", precision="fp16")
    packed = [n for n in opt.graph.node if n.op_type == "Attention"
              and any(a.name == "qkv_packed" and a.i == 1 for a in n.attribute)]
    assert packed and not [n for n in opt.graph.node if n.op_type == "Split"]
    feeds = random_feeds(opt, np.random.default_rng(4))
    want = ort_run(path, feeds)
    sess = Session(opt, device="cuda", cuda_graphs=False)
    got = sess.run(feeds)
    assert "host" not in " ".join(sess.plan_summary()["notes"])
    for k, w in want.items():
        assert rel_err(to_numpy(got[k]).astype(np.float64), w) <= 3e-2, k


@pytest.mark.parametrize("name", ["transformer_block.onnx", "torch/gpt2_dynamo_op18.onnx",
                                  "torch/bert_torchscript_op14.onnx"])
def test_optimized_transformers_never_copy_to_the_host(fake_cuda, monkeypatch, name):
    import graphopt
    from graphopt.runtime import Session, to_numpy

    path = str(ROOT / "models" / name)
    opt, _ = graphopt.optimize(path, gpu="none")
    assert {n.op_type for n in opt.graph.node if n.domain == "graphopt"} & {"LayerNorm", "Attention"}
    feeds = random_feeds(opt, np.random.default_rng(4))
    want = ort_run(path, feeds)
    sess = Session(opt, device="cuda", cuda_graphs=False)
    sess.run(feeds)  # plan built
    notes = " ".join(sess.plan_summary()["notes"])
    assert "host" not in notes, notes
    copies = []
    real = fake_cuda.asnumpy
    monkeypatch.setattr(fake_cuda, "asnumpy", lambda a, stream=None: copies.append(a.shape) or real(a))
    got = sess.run(feeds)
    assert copies == [], f"device->host copies inside the run: {copies}"
    for k, w in want.items():
        assert rel_err(to_numpy(got[k]), w) <= 1e-3, k


def test_an_op_without_a_device_implementation_is_refused_at_session(fake_cuda):
    from graphopt.ops import register_schema, unregister_schema
    from graphopt.ops.schema import OpSchema
    from graphopt.runtime import Session
    from graphopt.runtime.backend import RuntimeFailure

    schema = OpSchema(name="HostOnly", inputs=(("X", False),), attributes={}, doc="test op",
                      _check=lambda a, p: None, _overload=lambda a, p, d: "base", _needs_dtype=lambda a, p: False,
                      _body=lambda o, opset: None, _reference=lambda ins, a: [np.asarray(ins[0]) * 2])
    register_schema(schema)
    try:
        node = helper.make_node("HostOnly", ["x"], ["y"], domain="graphopt", name="the_node")
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("graphopt", 1)])
        with pytest.raises(RuntimeFailure, match="the_node.*HostOnly.*no device implementation"):
            Session(m, device="cuda", cuda_graphs=False).run({"x": np.ones((2, 3), np.float32)})
    finally:
        unregister_schema("HostOnly")


@pytest.mark.parametrize("op,shapes,attrs,want", [
    ("LayerNorm", [(2, 128, 768), (768,), (768,), (2, 128, 768), None], {"sum_output": 1}, (2, 128, 768)),
    ("RMSNorm", [(3, 5, 37), (37,)], {}, (3, 5, 37)),
    ("Attention", [(2, 12, 7, 64), (2, 12, 9, 64), (2, 12, 9, 32), None], {}, (2, 12, 7, 32)),
    ("Attention", [(2, 12, 7, 64), (2, 3, 9, 64), (2, 3, 9, 32), None], {"kv_groups": 4}, (2, 12, 7, 32)),
    ("GemmAct", [(2, 7, 768), (768, 3072), (3072,)], {"mode": "matmul"}, (2, 7, 3072)),
    ("CBR", [(2, 8, 9, 11), (16, 8, 3, 3), (16,), None], {"pads": [1, 1, 1, 1]}, (2, 16, 9, 11)),
])
def test_lowering_output_buffer_shapes(op, shapes, attrs, want):
    """The buffer the runtime allocates for a lowering's output (a wrong one made every GPT-2
    LayerNorm kernel refuse its Y on the H200)."""
    from graphopt.kernels.registry import signature_of

    dtypes = ["float16" if s is not None else "" for s in shapes]
    sig = signature_of(op, shapes, dtypes, attrs)
    assert tuple(ops_custom.output_shape(op, shapes, attrs, sig)) == want
