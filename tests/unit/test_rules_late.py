"""The late rules (priority -1): conv_alone, gemm_alone and matmul_alone turn a Conv, a Gemm or a
MatMul by a constant weight that no other rule fuses into a CBR / GemmAct without activation, so their
lowerings are tuned; and cbr_residual (a CBR without activation absorbs the residual Add after it).
They fire, they come after every larger rule (whose near-misses --explain still reports), and the
rewritten models compute what the originals did under onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphopt.ir import from_model, to_model
from graphopt.rewrite import RuleSet, apply_rules, load_rules
from graphopt.rewrite.testing import random_feeds, run_ort

SHIPPED = load_rules()
RNG = np.random.default_rng(0)


def _w(name, *shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.2).astype(np.float32), name)


def _model(nodes, outputs, inits, extra_out=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 9, 9])
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in list(outputs) + list(extra_out)]
    g = helper.make_graph(nodes, "g", [x], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_operatorsetid("", 17)])


def _run(model, rules=SHIPPED):
    g = from_model(model)
    report = apply_rules(g, rules, explain=True)
    g.lint()
    out = to_model(g)
    feeds = random_feeds(model)
    for e, a in zip(run_ort(model, feeds), run_ort(out, feeds)):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)
    return g, report


def test_a_lone_conv_becomes_a_cbr_without_activation():
    m = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])], ["y"],
               [_w("w", 6, 4, 3, 3), _w("b", 6)])
    g, report = _run(m)
    assert report.counts == {"conv_alone": 1}
    (n,) = g.nodes()
    assert (n.domain, n.op_type, n.attr("activation"), n.attr("strides")) == ("graphopt", "CBR", "none", [2, 2])


def test_a_conv_read_twice_or_a_graph_output_still_becomes_a_cbr():
    # the Relu cannot be fused (the Conv output has a second consumer); the Conv alone is still tuned
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["r"])],
               ["r"], [_w("w", 6, 4, 1, 1)], extra_out=["y"])
    g, report = _run(m)
    assert report.counts == {"conv_alone": 1}
    assert sorted(n.op_type for n in g.nodes()) == ["CBR", "Relu"]


def test_larger_conv_rules_win_over_conv_alone():
    # ResNet's downsample block: Relu(Add(Conv(main), Conv(downsample)))
    m = _model([helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Conv", ["x", "w2"], ["d"]),
                helper.make_node("Add", ["a", "d"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
               ["y"], [_w("w1", 6, 4, 1, 1), _w("w2", 6, 4, 1, 1)])
    g, report = _run(m)
    assert report.counts == {"conv_alone": 1, "conv_residual_relu": 1}
    cbrs = sorted(n.attr("activation") for n in g.nodes())
    assert cbrs == ["Relu", "none"] and len(g) == 2


def test_cbr_residual_absorbs_the_add_after_a_cbr_without_activation():
    m = _model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"])],
               ["y"], [_w("w", 4, 4, 3, 3)])
    m.graph.node[0].attribute.extend([helper.make_attribute("pads", [1, 1, 1, 1])])
    # conv_alone first (only it), then cbr_residual on the result
    g = from_model(m)
    apply_rules(g, RuleSet([SHIPPED.get("conv_alone")]))
    m2 = to_model(g)
    g2, report = _run(m2, RuleSet([SHIPPED.get("cbr_residual")]))
    assert report.counts == {"cbr_residual": 1}
    (n,) = g2.nodes()
    assert n.op_type == "CBR" and len(n.inputs) == 4 and n.attr("activation") == "none"


def test_cbr_residual_refuses_a_constant_operand():
    m = _model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "k"], ["y"])],
               ["y"], [_w("w", 4, 4, 1, 1), _w("k", 1, 4, 9, 9)])
    g = from_model(m)
    apply_rules(g, RuleSet([SHIPPED.get("conv_alone")]))
    g2, report = _run(to_model(g), RuleSet([SHIPPED.get("cbr_residual")]))
    assert report.counts == {}
    assert any(nm.rule == "cbr_residual" and "constant" in nm.reason for nm in report.near_misses), report.near_misses


def _gemm_model(nodes, inits, x_shape=(3, 8)):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                             opset_imports=[helper.make_operatorsetid("", 17)])


def test_a_lone_gemm_becomes_a_gemmact_without_activation():
    m = _gemm_model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=0.5)], [_w("w", 5, 8), _w("b", 5)])
    g, report = _run(m)
    assert report.counts == {"gemm_alone": 1}
    (n,) = g.nodes()
    assert (n.op_type, n.attr("mode"), n.attr("activation"), n.attr("transB"), n.attr("alpha")) == (
        "GemmAct", "gemm", "none", 1, 0.5)


def test_a_matmul_by_a_constant_becomes_a_gemmact_and_one_by_an_activation_does_not():
    m = _gemm_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("MatMul", ["h", "hT"], ["y"]),
                     helper.make_node("Transpose", ["h"], ["hT"])], [_w("w", 8, 5)])
    g, report = _run(m)
    assert report.counts == {"matmul_alone": 1}
    assert sorted(n.op_type for n in g.nodes()) == ["GemmAct", "MatMul", "Transpose"]


def test_larger_gemm_rules_win_over_the_late_ones():
    m = _gemm_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
                     helper.make_node("Relu", ["a"], ["y"])], [_w("w", 8, 5), _w("b", 5)])
    g, report = _run(m)
    assert report.counts == {"matmul_add_relu": 1}


def test_a_constant_scale_after_a_projection_folds_into_its_weight_and_bias():
    """BART / Whisper's q_proj(x) * scaling: the Mul goes, the GemmAct's constant weight and bias are scaled
    (the originals stay for their other readers), with and without a bias, in both GemmAct modes."""
    cases = [([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
               helper.make_node("Mul", ["a", "s"], ["y"])], [_w("w", 8, 5), _w("b", 5)], "matmul_bias"),
             ([helper.make_node("Gemm", ["x", "w", "b"], ["a"], transB=1, alpha=0.5, beta=2.0),
               helper.make_node("Mul", ["s", "a"], ["y"])], [_w("w", 5, 8), _w("b", 5)], "gemm_alone"),
             ([helper.make_node("Gemm", ["x", "w"], ["a"]), helper.make_node("Mul", ["a", "s"], ["y"])],
              [_w("w", 8, 5)], "gemm_alone")]
    for nodes, inits, first in cases:
        scale = numpy_helper.from_array(np.array(0.3535, np.float32), "s")
        g, report = _run(_gemm_model(nodes, inits + [scale]))
        assert report.counts.get("gemmact_scale") == 1 and report.counts.get(first) == 1, report.counts
        assert [n.op_type for n in g.nodes()] == ["GemmAct"]


def test_scales_that_do_not_fold_stay_with_their_reason():
    """Near-misses: a per-feature vector (not a scalar), a runtime scale, an activation before the scale,
    and a projection whose output is read again (or a graph output)."""
    w, b = _w("w", 8, 5), _w("b", 5)
    proj = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"])]
    vec = numpy_helper.from_array(np.linspace(0.5, 1.5, 5).astype(np.float32), "s")
    one = numpy_helper.from_array(np.array(0.25, np.float32), "s")
    cases = [(proj + [helper.make_node("Mul", ["a", "s"], ["y"])], [w, b, vec], (), "not a scalar"),
             (proj + [helper.make_node("ReduceMax", ["x"], ["s"], keepdims=0), helper.make_node("Mul", ["a", "s"], ["y"])],
              [w, b], (), "not a constant"),
             (proj + [helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Mul", ["r", "s"], ["y"])], [w, b, one], (),
              None),
             (proj + [helper.make_node("Mul", ["a", "s"], ["y"])], [w, b, one], ("a",), "graph output")]
    for nodes, inits, extra, why in cases:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y",) + tuple(extra)]
        m = helper.make_model(helper.make_graph(nodes, "g", [x], outs, inits), opset_imports=[helper.make_operatorsetid("", 17)])
        g, report = _run(m)
        assert "gemmact_scale" not in report.counts, (why, report.counts)
        assert "Mul" in [n.op_type for n in g.nodes()]
        if why:
            reasons = [n.reason for n in report.near_misses if n.rule == "gemmact_scale"]
            assert any(why in r for r in reasons), (why, reasons)


def test_a_scale_that_would_change_the_output_or_lose_weights_stays():
    """A [1] scale of a 0-D projection output makes the product [1]: folding it would change the output's
    rank. An fp16 weight that the scale would overflow stays unscaled too (the Mul stays)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Mul", ["h", "s"], ["y"])], "g", [x], [y],
        [_w("w", 8), numpy_helper.from_array(np.array([0.5], np.float32), "s")]), opset_imports=[helper.make_operatorsetid("", 17)])
    g, report = _run(m)  # the outputs match: the [1] product is still [1]
    assert "gemmact_scale" not in report.counts and "Mul" in [n.op_type for n in g.nodes()]

    h16 = TensorProto.FLOAT16
    x16 = helper.make_tensor_value_info("x", h16, [3, 8])
    y16 = helper.make_tensor_value_info("y", h16, None)
    big = numpy_helper.from_array(np.full((8, 5), 300.0, np.float16), "w")
    m16 = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Mul", ["h", "s"], ["y"])], "g", [x16], [y16],
        [big, numpy_helper.from_array(np.array(500.0, np.float16), "s")]), opset_imports=[helper.make_operatorsetid("", 17)])
    g = from_model(m16)
    report = apply_rules(g, SHIPPED, explain=True)
    assert "gemmact_scale" not in report.counts and "Mul" in [n.op_type for n in g.nodes()]
