"""Built-in constraints and value builders, one by one, on small graphs."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt.ir import from_model
from graphopt.rewrite import BUILDERS, CONSTRAINTS, BuildFailed, NewConstant
from graphopt.rewrite.testing import Builder

C = CONSTRAINTS
M = 6


def _graph(const_shape, spatial=2, extra=None):
    """x -> Conv(M out channels) -> Add(k) -> Relu, k a constant of ``const_shape``; returns (g, conv, k)."""
    b = Builder()
    x = b.input("x", [1, 3] + [5] * spatial)
    conv = b.op("Conv", [x, b.rand([M, 3] + [3] * spatial)], pads=[1] * (2 * spatial))
    k = b.rand(const_shape, "k") if const_shape is not None else b.input("k", [M])
    out = b.op("Relu", [b.op("Add", [conv, k])])
    b.output(out)
    if extra:
        extra(b, conv)
    g = from_model(b.model())
    return g, g.producer(conv), k


@pytest.mark.parametrize("shape", [[M, 1, 1], [1, M, 1, 1], [1], [], [1, 1, 1, 1]])
def test_per_channel_accepts(shape):
    g, conv, k = _graph(shape)
    assert C["per_channel"].fn(g, k, conv) is None


@pytest.mark.parametrize(
    "shape,fragment",
    [([1, 1, 5, 5], "not per-channel for the 6 output channels"), ([1, M, 5, 5], "not per-channel"),
     ([M], "broadcasts along the last spatial axis"), ([1, 1, 1, 1, 1], "not per-channel"), ([M, 1], "not per-channel")],
)
def test_per_channel_rejects(shape, fragment):
    g, conv, k = _graph(shape)
    reason = C["per_channel"].fn(g, k, conv)
    assert reason and fragment in reason and repr(k) in reason


def test_per_channel_1d_and_non_constant():
    g, conv, k = _graph([1, M, 1], spatial=1)
    assert C["per_channel"].fn(g, k, conv) is None
    g, conv, k = _graph(None)
    assert "is not a constant" in C["per_channel"].fn(g, k, conv)
    assert C["per_channel"].fn(g, None, conv) == "the optional input is absent"


def test_constant_family():
    g, conv, k = _graph([1, M, 1, 1])
    assert C["constant"].fn(g, k) is None
    assert C["constant"].fn(g, "x") == "'x' is not a constant"
    assert C["constant_or_absent"].fn(g, None) is None
    assert C["non_constant"].fn(g, "x") is None
    assert "is a constant" in C["non_constant"].fn(g, k)


def test_scalar_value_in_const_near_rank():
    g, conv, k = _graph([1])
    value = float(g.constant_value(k).reshape(-1)[0])
    assert C["scalar"].fn(g, k) is None
    assert "not a scalar" in C["scalar"].fn(g, conv.inputs[1])
    assert C["value_in"].fn(g, k, value - 1e-3, value + 1e-3) is None
    assert "outside" in C["value_in"].fn(g, k, value + 1, value + 2)
    assert C["const_near"].fn(g, k, value) is None
    assert "expected" in C["const_near"].fn(g, k, value + 1.0)
    assert "elements" in C["const_near"].fn(g, conv.inputs[1], 0.5)
    assert C["rank"].fn(g, conv.inputs[1], 4) is None
    assert "has rank 4, expected 3" in C["rank"].fn(g, conv.inputs[1], 3)
    assert "unknown" in C["rank"].fn(g, conv.outputs[0], 4)


def test_same_shape_single_use_attr_equals_no_auto_pad():
    g, conv, k = _graph([1, M, 1, 1])
    assert C["same_shape"].fn(g, "x", "x") is None
    assert "has shape" in C["same_shape"].fn(g, "x", k)
    assert C["single_use"].fn(g, conv) is None
    g2, conv2, _ = _graph([1, M, 1, 1], extra=lambda b, c: b.output(b.op("Neg", [c])))
    assert "has 2 consumers" in C["single_use"].fn(g2, conv2)
    assert C["attr_equals"].fn(g, conv, "group", 1) is None  # absent: ONNX's default
    assert "group=1, expected 2" in C["attr_equals"].fn(g, conv, "group", 2)
    assert C["attr_equals"].fn(g, conv, "pads", [1, 1, 1, 1]) is None
    assert C["no_auto_pad"].fn(g, conv) is None
    conv.set_attr("auto_pad", "SAME_UPPER")
    assert "auto_pad=SAME_UPPER" in C["no_auto_pad"].fn(g, conv)


def test_residual_shape():
    b = Builder()
    x, r, big = b.input("x", [1, 3, 5, 5]), b.input("r", [1, 4, 5, 5]), b.input("big", [2, 4, 5, 5])
    conv = b.op("Conv", [x, b.rand([4, 3, 3, 3])], pads=[1, 1, 1, 1])
    b.output(b.op("Add", [conv, r]))
    g = from_model(b.model())
    node = g.producer(conv)
    assert C["residual_shape"].fn(g, r, node) is None  # output shape unknown: the Add broadcasts the same
    g.set_value_info(conv, 1, [1, 4, 5, 5])
    assert C["residual_shape"].fn(g, r, node) is None
    assert "does not broadcast" in C["residual_shape"].fn(g, big, node)


def test_per_feature():
    b = Builder()
    a = b.input("a", [2, 3, 4])
    mm = b.op("MatMul", [a, b.rand([4, 7])])
    ok1, ok2, bad = b.rand([7], "c"), b.rand([1, 1, 7], "c"), b.rand([3, 7], "c")
    b.output(mm)
    g = from_model(b.model())
    node = g.producer(mm)
    assert C["per_feature"].fn(g, ok1, node) is None
    assert C["per_feature"].fn(g, ok2, node) is None
    assert "not per-feature for the 7 outputs" in C["per_feature"].fn(g, bad, node)


def test_add_bias_with_and_without_conv_bias():
    g, conv, k = _graph([1, M, 1, 1])
    out = BUILDERS["add_bias"].fn(g, None, k, conv)
    assert isinstance(out, NewConstant) and out.value.shape == (M,) and out.value.dtype == np.float32
    np.testing.assert_array_equal(out.value, g.constant_value(k).reshape(M))
    b = Builder()
    x = b.input("x", [1, 3, 5, 5])
    bias = b.rand([M], "b")
    conv_out = b.op("Conv", [x, b.rand([M, 3, 1, 1]), bias])
    k2 = b.rand([M, 1, 1], "k")
    b.output(b.op("Add", [conv_out, k2]))
    g2 = from_model(b.model())
    out = BUILDERS["add_bias"].fn(g2, bias, k2, g2.producer(conv_out))
    np.testing.assert_allclose(out.value, g2.constant_value(bias) + g2.constant_value(k2).reshape(M), rtol=1e-7)
    g3, conv3, k3 = _graph([1])  # a one-element constant adds to every channel
    out = BUILDERS["add_bias"].fn(g3, None, k3, conv3)
    np.testing.assert_array_equal(out.value, np.full(M, g3.constant_value(k3).reshape(-1)[0], np.float32))


def _act_node(op, *extra_inputs, opset=17, **attrs):
    b = Builder(opset)
    x = b.input("x", [4])
    ins = [x] + [b.const(v) if isinstance(v, float) else v for v in extra_inputs]
    y = b.op(op, ins, **attrs)
    b.output(y)
    g = from_model(b.model())
    return g, g.producer(y)


@pytest.mark.parametrize(
    "op,inputs,attrs,opset,expected",
    [
        ("Relu", (), {}, 17, {"activation": "Relu"}),
        ("Sigmoid", (), {}, 17, {"activation": "Sigmoid"}),
        ("HardSwish", (), {}, 17, {"activation": "HardSwish"}),
        ("LeakyRelu", (), {}, 17, {"activation": "LeakyRelu", "act_alpha": 0.01}),
        ("LeakyRelu", (), {"alpha": 0.3}, 17, {"activation": "LeakyRelu", "act_alpha": pytest.approx(0.3)}),
        ("Clip", (0.0, 6.0), {}, 17, {"activation": "Clip", "clip_min": 0.0, "clip_max": 6.0}),
        ("Clip", ("", 6.0), {}, 17, {"activation": "Clip", "clip_max": 6.0}),
        ("Clip", (), {"min": -1.0, "max": 1.0}, 10, {"activation": "Clip", "clip_min": -1.0, "clip_max": 1.0}),
        ("Clip", (), {}, 10, {"activation": "Clip"}),
        ("Gelu", (), {}, 20, {"activation": "Gelu"}),
        ("Gelu", (), {"approximate": "tanh"}, 20, {"activation": "GeluTanh"}),
    ],
)
def test_activation_of(op, inputs, attrs, opset, expected):
    g, node = _act_node(op, *inputs, opset=opset, **attrs)
    assert BUILDERS["activation_of"].fn(g, node) == expected


def test_activation_of_refuses_unknown_and_gate_activation():
    g, node = _act_node("Tanh")
    with pytest.raises(BuildFailed, match="Tanh .* is not a supported activation"):
        BUILDERS["activation_of"].fn(g, node)
    g, node = _act_node("HardSigmoid", alpha=0.25, beta=0.4)
    out = BUILDERS["gate_activation"].fn(g, node)
    assert out == {"activation": "HardSigmoidMul", "act_alpha": pytest.approx(0.25), "act_beta": pytest.approx(0.4)}
    g, node = _act_node("Sigmoid")
    assert BUILDERS["gate_activation"].fn(g, node) == {"activation": "SiLU"}


def test_half_precision():
    """No shipped rule asks it since the attention layout rules apply in fp32 too; user rules may."""
    from onnx import TensorProto

    b = Builder()
    h = b.input("h", [2, 3], TensorProto.FLOAT16)
    bf = b.input("bf", [2, 3], TensorProto.BFLOAT16)
    f = b.input("f", [2, 3])
    for x in (h, bf, f):
        b.output(b.op("Identity", [x]))
    g = from_model(b.model())
    assert C["half_precision"].fn(g, h) is None and C["half_precision"].fn(g, bf) is None
    assert "is float, not float16/bfloat16" in C["half_precision"].fn(g, f)
