"""graphopt.RoPE: rotate_half (LLaMA) and rotate_every_two (GPT-J) rotary embeddings as the exporters
write them become one op; near-misses (wrong slice bounds, another axis, an enlarging table, a
shared intermediate, a graph output, an odd head dim) are refused with the reason; the reference,
the function body (onnxruntime) and the xp form agree."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
from _coverage_util import G, misses, optimize, ops, run, same_outputs  # noqa: E402

from graphopt.ops import attach_functions, get_schema  # noqa: E402

F, H = TensorProto.FLOAT, TensorProto.FLOAT16
BIG = np.iinfo(np.int64).max


def _slice(g, x, start, end, step=1, axis=-1):
    i = lambda v: g.const(np.array([v]), "i", np.int64)  # noqa: E731
    return g.op("Slice", [x, i(start), i(end), i(axis), i(step)])


def rope(form="half", d=8, variant="fires", elem=F, table_input=False, split=None):
    """``split``: X is the head split of a [2, 5, 3 * d] projection, Reshape to [B, S, H, D] then Transpose
    with this perm ([0, 2, 1, 3]: LLaMA's q.view(B, S, H, D).transpose(1, 2)) before the rotation."""
    g = G(opset=17)
    dt = np.float16 if elem == H else np.float32
    if split is None:
        x = g.input("x", [2, 3, 5, d], elem)
    else:
        proj = g.input("proj", [2, 5, 3 * d], elem)
        heads = g.op("Reshape", [proj, g.const(np.array([2, 5, 3, d]), "heads", np.int64)])
        x = g.op("Transpose", [heads], perm=split)
        if variant == "split_read_again":
            g.output(g.op("Neg", [x]))
    tshape = [1, 1, 5, d] if variant != "enlarging_table" else [4, 1, 1, 1, d]
    if table_input:
        cos, sin = g.input("cos", tshape, elem), g.input("sin", tshape, elem)
    else:
        cos, sin = g.rand(tshape, "cos", dt), g.rand(tshape, "sin", dt)
    h = d // 2
    if form == "half":
        hi = _slice(g, x, h + (1 if variant == "wrong_bound" else 0), BIG)
        lo = _slice(g, x, 0, h + (1 if variant == "wrong_bound" else 0), axis=3 if variant == "positive_axis" else -1)
        rot = g.op("Concat", [g.op("Neg", [hi]), lo], axis=-1)
    else:
        odd, even = _slice(g, x, 1, BIG, 2), _slice(g, x, 0, BIG, 2)
        ax = g.const(np.array([-1]), "ax", np.int64)
        pairs = g.op("Concat", [g.op("Unsqueeze", [g.op("Neg", [odd]), ax]), g.op("Unsqueeze", [even, ax])], axis=-1)
        rot = g.op("Reshape", [pairs, g.const(np.array([2, 3, 5, d]), "shape", np.int64)])
    y = g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rot, sin])])
    g.output(y)
    if variant == "second_consumer":
        g.output(g.op("Neg", [rot]))
    return g.model()


@pytest.mark.parametrize("form", ["half", "interleaved"])
@pytest.mark.parametrize("table_input", [False, True])
def test_rope_fuses(form, table_input):
    m = rope(form, table_input=table_input)
    ir, report = optimize(m)
    assert ops(ir) == ["graphopt.RoPE"], report.counts
    assert ir.nodes()[0].attr("interleaved", 0) == (form == "interleaved")
    same_outputs(m, ir)


@pytest.mark.parametrize("form", ["half", "interleaved"])
def test_head_split_transpose_goes_into_the_op(form):
    """rope_x_bshd: the op reads the [B, S, H, D] head split and writes [B, H, S, D]; no Transpose is left."""
    m = rope(form, split=[0, 2, 1, 3])
    ir, report = optimize(m)
    assert ops(ir) == ["Reshape", "graphopt.RoPE"], report.counts
    assert report.counts.get("rope_x_bshd") == 1
    node = next(n for n in ir.nodes() if n.op_type == "RoPE")
    assert node.attr("x_bshd") == 1 and node.attr("interleaved", 0) == (form == "interleaved")
    same_outputs(m, ir)


@pytest.mark.parametrize("perm,variant,reason", [
    ([0, 2, 1, 3], "split_read_again", "consumers"),
    ([2, 0, 1, 3], "fires", "has perm [2, 0, 1, 3], expected [0, 2, 1, 3]"),
])
def test_head_split_near_misses_keep_the_transpose(perm, variant, reason):
    m = rope(split=perm, variant=variant)
    ir, report = optimize(m, explain=True)
    assert "Transpose" in ops(ir) and "graphopt.RoPE" in ops(ir)
    assert any(reason in r for r in misses(report, "rope_x_bshd")), [str(x) for x in report.near_misses]
    same_outputs(m, ir)


def test_fp16_rope_fuses():
    m = rope(elem=H)
    ir, _ = optimize(m)
    assert ops(ir) == ["graphopt.RoPE"]
    same_outputs(m, ir, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("form,variant,reason", [
    ("half", "wrong_bound", "not 4::1"), ("half", "enlarging_table", "rank 5 > the rank 4"), ("half", "second_consumer", "consumers"),
    ("interleaved", "second_consumer", "consumers"), ("interleaved", "enlarging_table", "rank 5")])
def test_near_misses_are_refused_with_the_reason(form, variant, reason):
    m = rope(form, variant=variant)
    ir, report = optimize(m, explain=True)
    assert "graphopt.RoPE" not in ops(ir)
    assert any(reason in r for r in misses(report, "rope")), [str(x) for x in report.near_misses]
    same_outputs(m, ir)


def test_positive_axis_fuses_too():
    m = rope(variant="positive_axis")
    ir, _ = optimize(m)
    assert ops(ir) == ["graphopt.RoPE"]
    same_outputs(m, ir)


def test_rotation_over_another_axis_is_refused():
    g = G(opset=17)
    x = g.input("x", [2, 3, 8, 8])
    rot = g.op("Concat", [g.op("Neg", [_slice(g, x, 4, BIG, axis=2)]), _slice(g, x, 0, 4, axis=2)], axis=2)
    g.output(g.op("Add", [g.op("Mul", [x, g.rand([8, 8], "c")]), g.op("Mul", [rot, g.rand([8, 8], "s")])]))
    m = g.model()
    ir, report = optimize(m, explain=True)
    assert "graphopt.RoPE" not in ops(ir)
    assert any("not the last" in r for r in misses(report, "rope")), [str(x) for x in report.near_misses]
    same_outputs(m, ir)


def test_odd_head_dim_is_refused():
    g = G(opset=17)
    x = g.input("x", [2, 4, 7])
    rot = g.op("Concat", [g.op("Neg", [_slice(g, x, 3, BIG)]), _slice(g, x, 0, 3)], axis=-1)  # 4 + 3 = 7
    g.output(g.op("Add", [g.op("Mul", [x, g.rand([7], "c")]), g.op("Mul", [rot, g.rand([7], "s")])]))
    m = g.model()
    ir, report = optimize(m, explain=True)
    assert "graphopt.RoPE" not in ops(ir)
    assert any("not even" in r for r in misses(report, "rope"))
    same_outputs(m, ir)


def _operands(rng, dtype, lead=(3, 5, 7), d=10):
    x = rng.standard_normal(lead + (d,)).astype(dtype)
    cos = rng.standard_normal((1, 1, lead[2], d)).astype(dtype)
    sin = rng.standard_normal((1, 1, lead[2], d)).astype(dtype)
    return [x, cos, sin]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_xp_impl_matches_the_float64_reference(interleaved, dtype):
    schema = get_schema("RoPE")
    ins = _operands(np.random.default_rng(7), dtype)
    (ref,) = schema.reference(ins, {"interleaved": interleaved})
    (got,) = schema.xp_impl(np, ins, {"interleaved": interleaved}, np.matmul)
    assert got.dtype == dtype and got.shape == ins[0].shape
    tol = 5e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol)


def test_reference_rotates_as_documented():
    x = np.arange(4, dtype=np.float64).reshape(1, 4)
    one, zero = np.ones((1, 4)), np.zeros((1, 4))
    rot = lambda i: get_schema("RoPE").reference([x, zero, one], {"interleaved": i})[0]  # noqa: E731
    assert rot(0).tolist() == [[-2, -3, 0, 1]] and rot(1).tolist() == [[-1, 0, -3, 2]]
    assert get_schema("RoPE").reference([x, one, zero], {})[0].tolist() == x.tolist()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_x_bshd_rotates_the_swapped_heads(dtype):
    """x_bshd=1: the reference, the xp form and the output shape are those of the op on Transpose(X, 0,2,1,3)."""
    schema = get_schema("RoPE")
    x, cos, sin = _operands(np.random.default_rng(9), dtype)
    xs = np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # [B, S, H, D]
    for interleaved in (0, 1):
        attrs = {"interleaved": interleaved, "x_bshd": 1}
        (want,) = schema.reference([x, cos, sin], {"interleaved": interleaved})
        (ref,) = schema.reference([xs, cos, sin], attrs)
        (got,) = schema.xp_impl(np, [xs, cos, sin], attrs, np.matmul)
        assert np.array_equal(ref, want) and got.shape == x.shape and got.flags.c_contiguous
        tol = 5e-3 if dtype == np.float16 else 1e-5
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol)
    assert schema.output_shapes([xs.shape, cos.shape, sin.shape], {"x_bshd": 1}) == [x.shape]
    assert schema.overload({"x_bshd": 1, "interleaved": 1}, [True] * 3) == "interleaved_bshd"
    assert "x_bshd=2 must be 0 or 1" in schema.validate({"x_bshd": 2}, [True] * 3)
    with pytest.raises(Exception, match="rank-4"):
        schema.reference([x[0], cos[0], sin[0]], {"x_bshd": 1})


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("x_bshd", [0, 1])
def test_function_body_matches_the_reference_under_onnxruntime(interleaved, opset, x_bshd):
    x, cos, sin = _operands(np.random.default_rng(8), np.float32)
    y_shape = list(x.shape)
    if x_bshd:
        x = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    node = helper.make_node("RoPE", ["x", "cos", "sin"], ["y"], domain="graphopt", interleaved=interleaved, x_bshd=x_bshd)
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", F, list(x.shape))],
                              [helper.make_tensor_value_info("y", F, y_shape)],
                              [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")])
    m = attach_functions(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                                 helper.make_opsetid("graphopt", 1)], ir_version=10))
    onnx.checker.check_model(m)
    (y,) = run(m, {"x": x})
    (ref,) = get_schema("RoPE").reference([x, cos, sin], {"interleaved": interleaved, "x_bshd": x_bshd})
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
