"""The tuning-size shape propagation (graphopt.tune.propagate): the cheap route (fold only the small
inputs of the nodes inference leaves unknown, ``_fold_breaks``) finds the same shapes as folding the
whole copy with the cleanup passes, and ``ShapeValues`` computes shape arithmetic without touching
the graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphopt.tune.propagate as P
from graphopt.ir import load_model
from graphopt.passes.shape_values import ShapeValues
from graphopt.pipeline import optimize_graph
from graphopt.tune.signatures import custom_nodes, default_dim

ROOT = Path(__file__).resolve().parents[2]


def _range_model() -> onnx.ModelProto:
    """y = Range(0, Shape(x)[1], 1): its length is a value that data propagation does not follow."""
    i64 = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [], [v])  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
        helper.make_node("Range", ["zero", "n", "one"], ["r"]),
        helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[i64("zero", 0), i64("one", 1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_values_follow_shape_arithmetic_without_changing_the_graph():
    g = load_model(_range_model())
    before = [n.op_type for n in g.nodes()]
    shapes = {"x": (2, 7), "s": (2,), "n": (), "r": (7,)}  # as inference at these sizes gives them
    values = ShapeValues(g, shapes)
    assert values.value("n").tolist() == 7
    assert values.value("r").tolist() == list(range(7))
    assert values.value("x") is None  # a graph input has no value
    assert [n.op_type for n in g.nodes()] == before
    unknown = ShapeValues(g, {"s": (2,), "n": ()})
    assert unknown.value("n") is None  # Shape of a tensor whose shape is not given
    unknown.update({"x": (1, 3), "s": (2,), "n": ()})
    assert unknown.value("n").tolist() == 3  # tried again once the shape is known
    assert ShapeValues(g, {"x": (2, 7)}).value("n") is None  # a tensor of unknown size is never evaluated


def test_a_range_length_is_propagated_by_folding_its_bounds():
    g = load_model(_range_model())
    out = P.concrete_shapes(g, {"b": 2, "s": 5}, lambda name: 1, wanted=["y"])
    assert out == {"y": (5,)}


def _rewritten(path: Path):
    g = load_model(str(path))
    optimize_graph(g, gpu="none")
    nodes = custom_nodes(g)
    return g, [t for gg, n in nodes for t in n.inputs if t and gg is g]


@pytest.mark.parametrize("name", ["torch/gpt2_torchscript_op14.onnx", "torch/bert_torchscript_op14.onnx",
                                  "coverage/llamadyn_torchscript.onnx", "torch/gpt2eager_torchscript_op13.onnx"])
def test_the_cheap_route_agrees_with_folding_the_whole_copy(name, monkeypatch):
    g, wanted = _rewritten(ROOT / "models" / name)
    default = lambda d: default_dim(d)[0]  # noqa: E731
    fast = P.concrete_shapes(g, {}, default, wanted=wanted)
    monkeypatch.setattr(P, "_fold_breaks", lambda *a: {})  # the cleanup passes on the whole copy only
    slow = P.concrete_shapes(g, {}, default, wanted=wanted)
    assert fast == slow and fast


def test_the_cheap_route_alone_resolves_the_torchscript_gpt2(monkeypatch):
    """No fallback to the cleanup passes on this export (the 20k-node benchmark model is this one, deeper)."""
    g, wanted = _rewritten(ROOT / "models/torch/gpt2_torchscript_op14.onnx")
    monkeypatch.setattr("graphopt.passes.run_cleanup", lambda *a, **k: pytest.fail("fell back to the cleanup passes"))
    out = P.concrete_shapes(g, {}, lambda d: default_dim(d)[0], wanted=wanted)
    assert set(out) == set(wanted) and all(np.prod(s) > 0 for s in out.values())


def test_static_keeps_only_fully_static_tensor_shapes():
    """``_static``: a shape with a symbolic or unknown dim, a tensor without a shape and a non-tensor
    type are left out; ``only`` filters; initializers give their dims unless skipped."""
    dim_unknown = helper.make_tensor_value_info("u", TensorProto.FLOAT, [2, None])
    graph = helper.make_graph(
        [], "g", [], [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [3, 1], [0.0, 1.0, 2.0])],
        value_info=[helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3]),
                    helper.make_tensor_value_info("scalar", TensorProto.INT64, []),
                    helper.make_tensor_value_info("sym", TensorProto.FLOAT, [2, "batch"]), dim_unknown,
                    helper.make_tensor_value_info("noshape", TensorProto.FLOAT, None),
                    helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph)
    assert P._static(model) == {"w": (3, 1), "s": (2, 3), "scalar": (), "out": (4,)}
    assert P._static(model, {"s", "sym", "w"}) == {"w": (3, 1), "s": (2, 3)}
    assert P._static(model, {"s", "w"}, skip_initializers=True) == {"s": (2, 3)}
