"""The NumPy shape-op evaluator (graphopt.passes._shape_ops) computes exactly what onnxruntime does,
and hands everything it does not handle to the general path."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt.ir import Node
from graphopt.passes import _evaluate as E
from graphopt.passes._shape_ops import evaluate_shape_op

I64 = np.int64
BIG = np.iinfo(np.int64).max
SMALL = np.iinfo(np.int64).min


def _node(op: str, n_in: int, **attrs) -> Node:
    node = Node(op, [f"i{k}" for k in range(n_in)], ["y"], name="n")
    for k, v in attrs.items():
        node.set_attr(k, v)
    return node


def _general(node: Node, values: dict, opset: int):
    """The general path: shape inference, then onnxruntime (what folding did before)."""
    model, feeds = E._build(node, values, opset)
    E._infer(model)
    return E._run_ort(model, feeds)


CASES = [
    ("Unsqueeze", [np.array(7, I64), np.array([0], I64)], {}),
    ("Unsqueeze", [np.arange(6, dtype=I64).reshape(2, 3), np.array([-1, 0], I64)], {}),
    ("Squeeze", [np.arange(3, dtype=I64).reshape(1, 3, 1), np.array([0, -1], I64)], {}),
    ("Squeeze", [np.array([5], I64), np.array([0], I64)], {}),
    ("Gather", [np.array([2, 128, 32], I64), np.array(0, I64)], {}),
    ("Gather", [np.array([2, 128, 32], I64), np.array([-1, 0], I64)], {}),
    ("Gather", [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([[1], [-4]], np.int32)], {"axis": 1}),
    ("Concat", [np.array([1], I64), np.array([2, 3], I64), np.array([4], I64)], {"axis": 0}),
    ("Concat", [np.ones((2, 1), np.int32), np.zeros((2, 2), np.int32)], {"axis": -1}),
    ("Slice", [np.arange(10, dtype=I64), np.array([2], I64), np.array([BIG], I64)], {}),
    ("Slice", [np.arange(10, dtype=I64), np.array([-1], I64), np.array([SMALL], I64), np.array([0], I64),
               np.array([-1], I64)], {}),
    ("Slice", [np.arange(10, dtype=I64), np.array([-3], I64), np.array([-1], I64)], {}),
    ("Slice", [np.arange(10, dtype=I64), np.array([8], I64), np.array([1], I64), np.array([0], I64),
               np.array([-3], I64)], {}),
    ("Slice", [np.arange(24, dtype=I64).reshape(2, 3, 4), np.array([1, 0], I64), np.array([3, -1], I64),
               np.array([-1, 1], I64), np.array([2, 1], I64)], {}),
    ("Slice", [np.arange(5, dtype=I64), np.array([7], I64), np.array([9], I64)], {}),  # empty
    ("Identity", [np.linspace(-1, 1, 33, dtype=np.float32)], {}),  # a small weight passed through
    ("Identity", [np.array(3, I64)], {}),
    ("Identity", [np.ones((2, 0, 3), np.float16)], {}),
    ("ConstantOfShape", [np.array([4], I64)], {"value": np.array([1], I64)}),
    ("ConstantOfShape", [np.array([], I64)], {"value": np.array([True])}),  # no dims: a scalar
    ("ConstantOfShape", [np.array([2, 0, 3], I64)], {}),  # float32 zeros by default; empty
    ("ConstantOfShape", [np.array([2, 3], I64)], {"value": np.array([0.5], np.float16)}),
    ("Mul", [np.ones(4, I64), np.array(-1, I64)], {}),  # broadcast
    ("Add", [np.array([[1], [2]], I64), np.array([10, 20, 30], I64)], {}),
    ("Sub", [np.array([7, 8], I64), np.array([-(2**31) + 1], I64)], {}),
    ("Reshape", [np.arange(24, dtype=I64).reshape(2, 3, 4), np.array([0, -1], I64)], {}),
    ("Reshape", [np.arange(6, dtype=np.float32), np.array([3, 1, -1], I64)], {}),
    ("Reshape", [np.arange(6, dtype=I64).reshape(2, 3), np.array([0, 3, 1], I64)], {}),  # 0 copies a dim
    ("Reshape", [np.zeros((0, 3), I64), np.array([0, 0], I64)], {"allowzero": 1}),
    ("Reshape", [np.array(5, I64), np.array([1, 1], I64)], {}),
    ("Equal", [np.array([[1], [2]], I64), np.array([1, 2, 3], I64)], {}),
    ("Equal", [np.array([True, False]), np.array(True)], {}),
    ("Where", [np.array([True, False, True]), np.array([1, 2, 3], I64), np.array(-1, I64)], {}),
    ("Where", [np.array([[True], [False]]), np.array([1.5], np.float32), np.array([[2.5, 3.5]], np.float32)], {}),
]


@pytest.mark.parametrize("op,inputs,attrs", CASES, ids=[f"{c[0]}{i}" for i, c in enumerate(CASES)])
def test_same_as_onnxruntime(op, inputs, attrs):
    node = _node(op, len(inputs), **attrs)
    values = {f"i{k}": a for k, a in enumerate(inputs)}
    fast = evaluate_shape_op(node, values, 14)
    assert fast is not None
    (want,) = _general(node, values, 14)
    assert fast[0].dtype == want.dtype and fast[0].shape == want.shape
    assert np.array_equal(fast[0], want)


def test_identity_output_is_a_copy():
    x = np.arange(4, dtype=np.float32)
    (out,) = evaluate_shape_op(_node("Identity", 1), {"i0": x}, 14)
    out[0] = 9
    assert x[0] == 0  # the folded value never aliases its input's


def test_repeated_input_is_read_twice():
    node = Node("Concat", ["a", "a"], ["y"], name="n")
    node.set_attr("axis", 0)
    (out,) = evaluate_shape_op(node, {"a": np.array([1, 2], I64)}, 14)
    assert out.tolist() == [1, 2, 1, 2]


@pytest.mark.parametrize("op,inputs,attrs,opset", [
    ("Gather", [np.array([1, 2], I64), np.array([2], I64)], {}, 14),  # index out of range
    ("Unsqueeze", [np.array([1], I64), np.array([0, 0], I64)], {}, 14),  # repeated axis
    ("Squeeze", [np.arange(3, dtype=I64), np.array([0], I64)], {}, 14),  # dim is not 1
    ("Squeeze", [np.ones((1, 1), I64)], {}, 14),  # no axes: left to the general path
    ("Unsqueeze", [np.array([1], I64)], {"axes": [0]}, 11),  # legacy attribute form
    ("Slice", [np.arange(4, dtype=I64), np.array([0], I64), np.array([2], I64), np.array([0], I64),
               np.array([0], I64)], {}, 14),  # zero step
    ("Concat", [np.array([1], I64), np.array([1], np.int32)], {"axis": 0}, 14),  # mixed dtypes
    ("Add", [np.array([1], np.float32), np.array([1], np.float32)], {}, 14),  # float arithmetic
    ("Mul", [np.array([2**31], I64), np.array([2], I64)], {}, 14),  # could overflow: left to onnxruntime
    ("Mul", [np.array([2], I64), np.array([2], np.int32)], {}, 14),  # mixed dtypes
    ("Add", [np.array([1], I64), np.array([1], I64)], {}, 6),  # legacy broadcast attribute
    ("ConstantOfShape", [np.array([2, -1], I64)], {}, 14),  # negative dim
    ("ConstantOfShape", [np.array([4097], I64)], {}, 14),  # large output: the general path caps it
    ("ConstantOfShape", [np.array([2], np.int32)], {}, 14),  # shape must be int64
    ("ConstantOfShape", [np.array([2], I64)], {"value": np.array([1, 2], I64)}, 14),  # value of two elements
    ("Acos", [np.array([1], I64)], {}, 14),  # not a shape op
    ("Reshape", [np.arange(6, dtype=I64), np.array([4, -1], I64)], {}, 14),  # not divisible
    ("Reshape", [np.arange(6, dtype=I64), np.array([-1, -1], I64)], {}, 14),  # two -1
    ("Reshape", [np.arange(6, dtype=I64), np.array([6, 0], I64)], {}, 14),  # 0 beyond the input's rank
    ("Reshape", [np.arange(6, dtype=I64), np.array([0, -1], I64)], {"allowzero": 1}, 14),  # 0 and -1
    ("Reshape", [np.arange(6, dtype=I64), np.array([-2, 3], I64)], {}, 14),  # invalid dim
    ("Reshape", [np.arange(6, dtype=I64), np.array([4], I64)], {}, 14),  # wrong element count
    ("Equal", [np.array([1.0], np.float32), np.array([1.0], np.float32)], {}, 14),  # float comparison
    ("Equal", [np.array([1], I64), np.array([1], np.int32)], {}, 14),  # mixed dtypes
    ("Where", [np.array([1], I64), np.array([1], I64), np.array([2], I64)], {}, 14),  # condition not bool
    ("Where", [np.array([True]), np.array([1], I64), np.array([2], np.int32)], {}, 14),  # mixed dtypes
    ("Where", [np.ones((100, 1), bool), np.ones((1, 100), I64), np.array(0, I64)], {}, 14),  # large output
    ("Equal", [np.ones((100, 1), I64), np.ones((1, 100), I64)], {}, 14),  # large output
    ("Mul", [np.ones((100, 1), I64), np.ones((1, 100), I64)], {}, 14),  # large output
    ("Add", [np.ones(3, I64), np.ones(2, I64)], {}, 14),  # shapes that do not broadcast
    ("Gather", [np.zeros(5000, I64), np.array([0], I64)], {}, 14),  # large input
])
def test_declines(op, inputs, attrs, opset):
    node = _node(op, len(inputs), **attrs)
    assert evaluate_shape_op(node, {f"i{k}": a for k, a in enumerate(inputs)}, opset) is None


def test_optional_input_left_out_declines():
    node = Node("Slice", ["x", "s", "e", "", "st"], ["y"], name="n")
    values = {"x": np.arange(4, dtype=I64), "s": np.array([0], I64), "e": np.array([2], I64), "st": np.array([1], I64)}
    assert evaluate_shape_op(node, values, 14) is None
