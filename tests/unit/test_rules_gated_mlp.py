"""graphopt.GatedMLP: SwiGLU (LLaMA) and GeGLU (T5 v1.1) as the exporters write them become one op;
near-misses (a shared intermediate, a graph output, different inputs, a runtime weight, no
activation) are refused with the reason; the op's reference, function body and xp form agree."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).parent))
from _coverage_util import G, feeds, misses, optimize, ops, run, same_outputs  # noqa: E402

from graphopt.ops import attach_functions, get_schema  # noqa: E402

F, H = TensorProto.FLOAT, TensorProto.FLOAT16
K, N = 12, 19


def gated(act="silu", gate_bias=False, up_bias=False, elem=F, variant="fires", down=True):
    g = G(opset=17)
    dt = np.float16 if elem == H else np.float32
    x = g.input("x", [2, 5, K], elem)
    x2 = g.input("x2", [2, 5, K], elem) if variant == "other_input" else x
    wg = g.rand([K, N], "wg", dt)
    wu = g.input("wu", [K, N], elem) if variant == "runtime_weight" else g.rand([K, N], "wu", dt)
    y = g.op("MatMul", [x, wg], name="gate_proj")
    if gate_bias:
        y = g.op("Add", [y, g.rand([N], "bg", dt)])
    if act == "silu":
        a = g.op("Mul", [y, g.op("Sigmoid", [y])])
    elif act == "gelu_tanh":  # T5's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = g.op("Pow", [y, g.const(3.0, dtype=dt)])
        inner = g.op("Mul", [g.op("Add", [y, g.op("Mul", [cube, g.const(0.044715, dtype=dt)])]),
                             g.const(0.7978845608, dtype=dt)])
        a = g.op("Mul", [g.op("Mul", [y, g.const(0.5, dtype=dt)]), g.op("Add", [g.op("Tanh", [inner]), g.const(1.0, dtype=dt)])])
    else:  # no activation: a bilinear product, not a gated MLP
        a = y
    u = g.op("MatMul", [x2, wu], name="up_proj")
    if up_bias:
        u = g.op("Add", [u, g.rand([N], "bu", dt)])
    h = g.op("Mul", [a, u], name="gate_mul")
    g.output(g.op("MatMul", [h, g.rand([N, K], "wd", dt)], name="down_proj") if down else h)
    if variant == "second_consumer":
        g.output(g.op("Neg", [a]))
    elif variant == "graph_output":
        g.output(u)
    return g.model()


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("gate_bias,up_bias", [(False, False), (True, True), (False, True), (True, False)])
def test_gated_mlp_fuses_with_the_down_projection_left_outside(act, gate_bias, up_bias):
    m = gated(act, gate_bias, up_bias)
    ir, report = optimize(m)
    # the down projection stays outside, as a GemmAct without activation (the late matmul_alone rule)
    assert ops(ir) == ["graphopt.GatedMLP", "graphopt.GemmAct"], report.counts
    node = next(n for n in ir.nodes() if n.op_type == "GatedMLP")
    assert node.attr("activation") == {"silu": "SiLU", "gelu_tanh": "GeluTanh"}[act]
    assert [bool(t) for t in node.inputs[3:]] + [False] * (5 - len(node.inputs)) == [gate_bias, up_bias]
    assert node.doc_string.startswith("graphopt rule=gated_mlp_")
    same_outputs(m, ir)


def test_fp16_swiglu_fuses():
    m = gated("silu", elem=H)
    ir, _ = optimize(m)
    assert ops(ir) == ["graphopt.GatedMLP", "graphopt.GemmAct"]  # down projection: matmul_alone
    same_outputs(m, ir, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("variant,reason", [
    ("second_consumer", "consumers"), ("graph_output", "graph output"), ("other_input", "bound to"),
    ("runtime_weight", "is not a constant")])
def test_near_misses_are_refused_with_the_reason(variant, reason):
    m = gated("silu", variant=variant)
    ir, report = optimize(m, explain=True)
    assert "graphopt.GatedMLP" not in ops(ir)
    assert any(reason in r for r in misses(report, "gated_mlp")), [str(x) for x in report.near_misses]
    same_outputs(m, ir)


def test_a_product_without_activation_is_not_a_gated_mlp():
    m = gated("none", gate_bias=True, up_bias=True)
    ir, report = optimize(m, explain=True)
    assert "graphopt.GatedMLP" not in ops(ir)
    assert any("no activation" in r for r in misses(report, "gated_mlp"))


def _operands(rng, dtype, lead=(3, 7), k=13, n=21, bg=True, bu=True):
    x = rng.standard_normal(lead + (k,)).astype(dtype)
    wg, wu = ((rng.standard_normal((k, n)) * 0.3).astype(dtype) for _ in range(2))
    b1 = rng.standard_normal(n).astype(dtype) if bg else None
    b2 = rng.standard_normal(n).astype(dtype) if bu else None
    return [x, wg, wu, b1, b2]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("act", ["SiLU", "Gelu", "GeluTanh", "Relu", "QuickGelu"])
@pytest.mark.parametrize("bg,bu", [(False, False), (True, True), (False, True)])
def test_xp_impl_matches_the_float64_reference(act, dtype, bg, bu):
    schema = get_schema("GatedMLP")
    ins = _operands(np.random.default_rng(5), dtype, bg=bg, bu=bu)
    (ref,) = schema.reference(ins, {"activation": act})
    (got,) = schema.xp_impl(np, ins, {"activation": act}, np.matmul)
    assert got.dtype == dtype and got.shape == ref.shape == (3, 7, 21)
    tol = 2e-2 if dtype == np.float16 else 1e-4
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("opset", [13, 17, 20])
@pytest.mark.parametrize("act", ["SiLU", "GeluTanh", "Gelu"])
def test_function_body_matches_the_reference_under_onnxruntime(act, opset):
    rng = np.random.default_rng(6)
    x, wg, wu, bg, bu = _operands(rng, np.float32, bg=False)
    node = helper.make_node("GatedMLP", ["x", "wg", "wu", "", "bu"], ["y"], domain="graphopt", activation=act)
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", F, list(x.shape))],
                              [helper.make_tensor_value_info("y", F, None)],
                              [onnx.numpy_helper.from_array(v, n) for n, v in (("wg", wg), ("wu", wu), ("bu", bu))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("graphopt", 1)],
                          ir_version=10)
    m = attach_functions(m)
    (y,) = run(m, {"x": x})
    (ref,) = get_schema("GatedMLP").reference([x, wg, wu, None, bu], {"activation": act})
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_schema_refuses_an_unknown_activation():
    assert "unknown activation" in get_schema("GatedMLP").validate({"activation": "Swish"}, [True] * 3)
