"""Activations the rules now take: Conv -> GELU (Whisper, Wav2Vec2), MobileNetV3's Conv -> HardSigmoid
gate and Gemm -> HardSwish classifier, CLIP's QuickGELU, and a standalone BatchNormalization ->
activation (DenseNet's pre-activation) as a 1x1 depthwise CBR; positive and near-miss cases, and
onnxruntime equality of the optimized graph. The new activations' array-module (xp) forms are
checked against the float64 references."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

sys.path.insert(0, str(Path(__file__).parent))
from _coverage_util import G, misses, optimize, ops, same_outputs  # noqa: E402

from graphopt.ops import get_schema  # noqa: E402
from graphopt.ops.activations import ACTIVATIONS  # noqa: E402

F = TensorProto.FLOAT


def _gelu_erf(g, y):
    e = g.op("Erf", [g.op("Div", [y, g.const(1.4142135623730951)])])
    return g.op("Mul", [g.op("Mul", [y, g.op("Add", [e, g.const(1.0)])]), g.const(0.5)])


def _quick(g, y, k=1.702):
    return g.op("Mul", [y, g.op("Sigmoid", [g.op("Mul", [y, g.const(k)])])])


def test_conv1d_gelu_erf_becomes_one_cbr():
    g = G(opset=17)
    x = g.input("x", [2, 3, 17])
    y = g.op("Conv", [x, g.rand([5, 3, 3]), g.rand([5], "b")], pads=[1, 1], strides=[2])
    g.output(_gelu_erf(g, y))
    m = g.model()
    ir, report = optimize(m)
    assert ops(ir) == ["graphopt.CBR"], report.counts
    assert ir.nodes()[0].attr("activation") == "Gelu"
    same_outputs(m, ir)


def test_conv_native_gelu_opset20_becomes_one_cbr():
    g = G(opset=20)
    x = g.input("x", [2, 3, 9, 9])
    g.output(g.op("Gelu", [g.op("Conv", [x, g.rand([4, 3, 3, 3])], pads=[1, 1, 1, 1])], approximate="tanh"))
    m = g.model()
    ir, _ = optimize(m)
    assert ops(ir) == ["graphopt.CBR"] and ir.nodes()[0].attr("activation") == "GeluTanh"
    same_outputs(m, ir)


def test_conv_gelu_with_the_conv_output_read_again_keeps_them_apart():
    g = G(opset=17)
    x = g.input("x", [2, 3, 17])
    y = g.op("Conv", [x, g.rand([5, 3, 3])], pads=[1, 1])
    g.output(_gelu_erf(g, y))
    g.output(g.op("Neg", [y]))
    m = g.model()
    ir, report = optimize(m, explain=True)
    # the Conv alone becomes a CBR without activation (conv_alone); the GELU stays apart
    assert "graphopt.Gelu" in ops(ir) and all(n.attr("activation") == "none" for n in ir.nodes() if n.op_type == "CBR")
    assert any("consumers" in r for r in misses(report, "conv_gelu_op"))
    same_outputs(m, ir)


def test_conv_add_gelu_with_a_non_per_channel_constant_is_refused():
    g = G(opset=17)
    x = g.input("x", [2, 3, 17])
    y = g.op("Add", [g.op("Conv", [x, g.rand([5, 3, 3])], pads=[1, 1]), g.rand([1, 1, 17], "c")])
    g.output(_gelu_erf(g, y))
    m = g.model()
    ir, report = optimize(m, explain=True)
    assert all(n.attr("activation") == "none" for n in ir.nodes() if n.op_type == "CBR")
    assert any("not per-channel" in r for r in misses(report, "conv_add_gelu_op"))
    same_outputs(m, ir)


def se_block(variant="fires"):
    """MobileNetV3's squeeze-excitation: pool -> Conv -> Relu -> Conv -> HardSigmoid -> Mul(x, gate)."""
    g = G(opset=17)
    x = g.input("x", [2, 8, 7, 7])
    p = g.op("GlobalAveragePool", [x])
    h = g.op("Relu", [g.op("Conv", [p, g.rand([4, 8, 1, 1]), g.rand([4], "b")])])
    c2 = g.op("Conv", [h, g.rand([8, 4, 1, 1]), g.rand([8], "b")])
    gate = g.op("HardSigmoid", [c2], alpha=1.0 / 6.0, beta=0.5)
    g.output(g.op("Mul", [x, gate]))
    if variant == "graph_output":
        g.output(c2)
    return g.model()


def test_mobilenetv3_squeeze_excitation_gate_fuses():
    m = se_block()
    ir, report = optimize(m)
    assert ops(ir) == ["GlobalAveragePool", "Mul", "graphopt.CBR", "graphopt.CBR"], report.counts
    acts = sorted(n.attr("activation") for n in ir.nodes() if n.op_type == "CBR")
    assert acts == ["HardSigmoid", "Relu"]
    gate = next(n for n in ir.nodes() if n.op_type == "CBR" and n.attr("activation") == "HardSigmoid")
    assert gate.attr("act_alpha") == pytest.approx(1 / 6) and gate.attr("act_beta") == pytest.approx(0.5)
    same_outputs(m, ir)


def test_squeeze_excitation_gate_with_the_conv_a_graph_output_is_refused():
    m = se_block("graph_output")
    ir, report = optimize(m, explain=True)
    assert "HardSigmoid" in ops(ir)
    assert any("graph output" in r for r in misses(report, "conv_hardsigmoid"))
    same_outputs(m, ir)


def test_mobilenetv3_classifier_gemm_hardswish_fuses():
    g = G(opset=17)
    x = g.input("x", [2, 16])
    h = g.op("HardSwish", [g.op("Gemm", [x, g.rand([24, 16]), g.rand([24], "b")], transB=1)])
    g.output(g.op("Gemm", [h, g.rand([10, 24]), g.rand([10], "b")], transB=1))
    m = g.model()
    ir, report = optimize(m)
    assert "HardSwish" not in ops(ir), report.counts
    assert any(n.op_type == "GemmAct" and n.attr("activation") == "HardSwish" for n in ir.nodes())
    same_outputs(m, ir)


def clip_mlp(k=1.702, second_consumer=False):
    """CLIP's MLP: fc1 (MatMul + bias) -> QuickGELU -> fc2."""
    g = G(opset=17)
    x = g.input("x", [2, 5, 12])
    h = g.op("Add", [g.op("MatMul", [x, g.rand([12, 20])]), g.rand([20], "b")])
    a = _quick(g, h, k)
    g.output(g.op("Add", [g.op("MatMul", [a, g.rand([20, 12])]), g.rand([12], "b")]))
    if second_consumer:
        g.output(g.op("Neg", [h]))
    return g.model()


def test_clip_quick_gelu_is_the_gemm_epilogue():
    m = clip_mlp()
    ir, report = optimize(m)
    assert ops(ir) == ["graphopt.GemmAct", "graphopt.GemmAct"], report.counts
    assert sorted(n.attr("activation") for n in ir.nodes()) == ["QuickGelu", "none"]
    same_outputs(m, ir)


def test_quick_gelu_alone_is_a_gelu_op_and_a_wrong_slope_is_refused():
    m = clip_mlp(second_consumer=True)  # the bias output is read again: GemmAct stays without epilogue
    ir, report = optimize(m, explain=True)
    gelu = [n for n in ir.nodes() if n.op_type == "Gelu"]
    assert len(gelu) == 1 and gelu[0].attr("approximate") == "quick", ops(ir)
    same_outputs(m, ir)
    m = clip_mlp(k=1.5)
    ir, report = optimize(m, explain=True)
    assert "Sigmoid" in ops(ir)
    assert any("expected 1.702" in r for r in misses(report, "gelu_quick"))
    same_outputs(m, ir)


def densenet_layer(variant="fires"):
    """DenseNet's pre-activation layer: Concat -> BN -> ReLU -> Conv1x1 -> BN -> ReLU -> Conv3x3."""
    g = G(opset=17)
    a, b = g.input("a", [2, 4, 6, 6]), g.input("b", [2, 3, 6, 6])
    x = g.op("Concat", [a, b], axis=1)

    def bn(t, c):
        mean = g.input(g.name("mean"), [c]) if variant == "mean_input" else g.rand([c], "mean")
        return g.op("BatchNormalization", [t, g.rand([c], "s"), g.rand([c], "bb"), mean,
                                            g.const(g.rng.random(c) + 0.5, "var")], epsilon=1e-5)

    h = g.op("Relu", [bn(x, 7)])
    h = g.op("Conv", [h, g.rand([6, 7, 1, 1])])
    h = g.op("Relu", [bn(h, 6)])
    g.output(g.op("Conv", [h, g.rand([5, 6, 3, 3])], pads=[1, 1, 1, 1]))
    return g.model()


def test_densenet_pre_activation_bn_relu_becomes_a_depthwise_cbr():
    m = densenet_layer()
    ir, report = optimize(m)
    # (the Conv no rule fuses becomes a CBR without activation: conv_alone)
    assert ops(ir) == ["Concat", "graphopt.CBR", "graphopt.CBR", "graphopt.CBR"], report.counts
    # the second BN follows a Conv: folded into it by cleanup; the first one is the per-channel CBR
    dw = next(n for n in ir.nodes() if n.op_type == "CBR" and n.attr("group", 1) == 7)
    assert dw.attr("kernel_shape") == [1, 1] and dw.attr("activation") == "Relu"
    same_outputs(m, ir)


def test_bn_with_a_runtime_mean_is_refused_with_the_reason():
    m = densenet_layer("mean_input")
    ir, report = optimize(m, explain=True)
    assert "BatchNormalization" in ops(ir)
    assert any("not a constant" in r for r in misses(report, "bn_relu"))
    same_outputs(m, ir)


def test_bn_on_a_rank2_tensor_is_refused():
    g = G(opset=17)
    x = g.input("x", [3, 6])
    bn = g.op("BatchNormalization", [x, g.rand([6], "s"), g.rand([6], "b"), g.rand([6], "m"),
                                     g.const(np.ones(6), "v")])
    g.output(g.op("Relu", [bn]))
    m = g.model()
    ir, report = optimize(m, explain=True)
    assert "BatchNormalization" in ops(ir)
    assert any("rank 2" in r for r in misses(report, "bn_relu"))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_xp_forms_match_the_float64_reference(name, dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 37)) * 4).astype(dtype)
    attrs = {"Clip": {"clip_min": -1.0, "clip_max": 2.5}, "LeakyRelu": {"act_alpha": 0.1},
             "HardSigmoid": {"act_alpha": 1 / 6, "act_beta": 0.5}}.get(name, {})
    got = ACTIVATIONS[name].xp(np, x.astype(np.float32), attrs).astype(dtype)
    ref = ACTIVATIONS[name].numpy(x, attrs)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("approx", ["none", "tanh", "quick"])
def test_gelu_xp_impl_matches_the_reference(approx, dtype):
    schema = get_schema("Gelu")
    x = (np.random.default_rng(4).standard_normal((5, 33)) * 3).astype(dtype)
    (got,) = schema.xp_impl(np, [x], {"approximate": approx}, np.matmul)
    (ref,) = schema.reference([x], {"approximate": approx})
    assert got.dtype == dtype and got.shape == x.shape
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol)
