"""The execution plan on device="numpy": plan-time folding, per-signature caching, liveness,
peak bytes, dynamic plans, fp16, and the errors a user can cause."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from _runtime_helpers import ort_run, rel_err
from graphopt.errors import GraphoptError, UnsupportedModel
from graphopt.runtime import Session


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _shape_chain_model():
    """y = Reshape(x, Concat(Shape(x)[0], -1)) @ W, then Relu: the shape arithmetic must fold away."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((12, 5)).astype(np.float32), "W")
    zero = numpy_helper.from_array(np.array([0], dtype=np.int64), "zero")
    minus1 = numpy_helper.from_array(np.array([-1], dtype=np.int64), "m1")
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "m1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "W"], ["mm"]),
        helper.make_node("Relu", ["mm"], ["y"]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], [w, zero, minus1])


def test_shape_arithmetic_is_folded_and_plans_are_cached_per_signature():
    m = _shape_chain_model()
    sess = Session(m, device="numpy")
    rng = np.random.default_rng(1)
    for n in (2, 2, 5):
        x = rng.standard_normal((n, 3, 4)).astype(np.float32)
        got = sess.run({"x": x})["y"]
        assert rel_err(got, ort_run(m, {"x": x})["y"]) < 1e-6
    summary = sess.plan_summary()
    assert summary["folded_at_plan_time"] == 3  # Shape, Gather, Concat
    assert [s.op for s in sess.last_plan.steps] == ["Reshape", "MatMul", "Relu"]
    assert len(sess._plans) == 2  # batch 2 and batch 5


def test_cached_plan_reruns_on_new_values_not_the_traced_ones():
    m = _shape_chain_model()
    sess = Session(m, device="numpy")
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((3, 3, 4)).astype(np.float32) for _ in range(3)]
    for x in xs:
        assert rel_err(sess.run({"x": x})["y"], ort_run(m, {"x": x})["y"]) < 1e-6


def test_liveness_frees_dead_slots_and_peak_bytes_follow_the_schedule():
    """A chain of 4 elementwise ops on a 1 MiB tensor: x dies after Relu, each activation after its
    reader, so at most two 1 MiB blocks are ever live (5 without the frees)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 1024])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Abs", ["b"], ["c"]), helper.make_node("Exp", ["c"], ["y"])]
    m = _model(nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 1024])])
    sess = Session(m, device="numpy")
    sess.run({"x": np.zeros((256, 1024), np.float32)})
    plan = sess.last_plan
    mib = 256 * 1024 * 4
    assert plan.peak_bytes == 2 * mib
    freed = {s for step in plan.steps for s in step.free}
    out_slot = plan.outputs[0][1]
    assert out_slot not in freed and len(freed) == 4  # x, a, b, c


def test_views_share_their_base_block_in_the_peak():
    """Add(a, Reshape(a)) with a same-shape Reshape: a and its view r are one block, so the peak is
    a + y (x is dead after Relu); counting the view as its own block would give three."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 1024])
    shape = numpy_helper.from_array(np.array([64, 1024], dtype=np.int64), "shape")
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "shape"], ["r"]),
             helper.make_node("Add", ["a", "r"], ["y"])]
    m = _model(nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 1024])], [shape])
    sess = Session(m, device="numpy")
    got = sess.run({"x": np.ones((64, 1024), np.float32)})["y"]
    np.testing.assert_array_equal(got, np.full((64, 1024), 2, np.float32))
    assert sess.last_peak_bytes == 2 * 64 * 1024 * 4


def test_data_dependent_shape_makes_a_dynamic_plan_that_is_rebuilt_every_run():
    """Reshape's shape comes from a graph input (device data): read on the host, never cached."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                       helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    sess = Session(m, device="numpy")
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    assert sess.run({"x": x, "shape": np.array([3, 4])})["y"].shape == (3, 4)
    assert sess.run({"x": x, "shape": np.array([4, 3])})["y"].shape == (4, 3)
    assert sess.last_plan.dynamic and "data-dependent" in sess.last_plan.dynamic
    assert sess._plans == {}


def test_if_with_a_device_condition_runs_both_branches_correctly():
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                       helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    sess = Session(m, device="numpy")
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    np.testing.assert_array_equal(sess.run({"x": x, "c": np.array(True)})["y"], np.maximum(x, 0))
    np.testing.assert_array_equal(sess.run({"x": x, "c": np.array(False)})["y"], -x)


def test_unsupported_ops_are_reported_at_construction_naming_op_and_node():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("NonMaxSuppression", ["a", "a"], ["b"], name="nms_1"),
             helper.make_node("Unique", ["b"], ["y"], name="uniq_node")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(UnsupportedModel) as e:
        Session(m, device="numpy")
    msg = str(e.value)
    assert "NonMaxSuppression" in msg and "'nms_1'" in msg and "Unique" in msg and "'uniq_node'" in msg
    assert "\n" not in msg and "device='cpu'" in msg


def test_a_custom_domain_without_a_function_is_refused_in_one_line():
    nodes = [helper.make_node("Foo", ["x"], ["y"], name="foo_node", domain="acme")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
    with pytest.raises(UnsupportedModel) as e:
        Session(m, device="numpy")
    assert "acme.Foo" in str(e.value) and "'foo_node'" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("feeds, fragment", [
    ({}, "missing input(s) 'x'"),
    ({"x": np.zeros((2, 3, 4), np.float64)}, "dtype float64"),
    ({"x": np.zeros((2, 3, 5), np.float32)}, "shape (2, 3, 5)"),
    ({"x": np.zeros((2, 3, 4), np.float32), "zz": np.zeros(1)}, "unknown input(s) 'zz'"),
])
def test_bad_feeds_give_one_line_errors(feeds, fragment):
    sess = Session(_shape_chain_model(), device="numpy")
    with pytest.raises(GraphoptError) as e:
        sess.run(feeds)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_bad_device_and_dtype_are_refused():
    with pytest.raises(GraphoptError, match="device 'tpu'"):
        Session(_shape_chain_model(), device="tpu")
    with pytest.raises(GraphoptError, match="dtype 'int8'"):
        Session(_shape_chain_model(), device="numpy", dtype="int8")


def test_input_is_not_modified_and_dlpack_inputs_are_accepted():
    m = _shape_chain_model()
    sess = Session(m, device="numpy")
    x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    keep = x.copy()

    class DLPackOnly:  # a foreign tensor that only speaks DLPack (as torch CPU tensors do)
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    got = sess.run({"x": DLPackOnly(x)})["y"]
    np.testing.assert_array_equal(x, keep)
    assert rel_err(got, ort_run(m, {"x": x})["y"]) < 1e-6


def test_fp16_keeps_io_dtypes_and_accumulates_reductions_in_fp32():
    """Softmax over 4096 values in fp16 with fp32 accumulation stays within 1e-3 of fp64."""
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1), helper.make_node("ReduceSum", ["s"], ["y"], keepdims=0)]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4096])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    x = np.random.default_rng(4).standard_normal((2, 4096)).astype(np.float32)
    got = Session(m, device="numpy", dtype="float16").run({"x": x})["y"]
    assert got.dtype == np.float32
    assert abs(float(got) - 2.0) < 2e-3
