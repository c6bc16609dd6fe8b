"""``pipeline._census``: the report's node count and op histograms from one walk equal what walking
the graph for each of them gives, subgraph bodies included."""

from __future__ import annotations

from collections import Counter

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from graphopt.ir import load_model
from graphopt.pipeline import _census


def _model():
    body = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                              helper.make_node("GemmAct", ["r", "w"], ["o"], domain="graphopt", activation="Relu")],
                             "body", [], [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2, 2])])
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("GemmAct", ["b", "w"], ["c"], domain="graphopt", activation="Relu"),
             helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=body)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2]),
                                           helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 2]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
                              initializer=[numpy_helper.from_array(np.eye(2, dtype=np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("graphopt", 1)])


def test_census_counts_every_node_and_custom_op_of_every_body():
    graph = load_model(_model())
    count, ops, custom = _census(graph)
    walked = [n for _, n in graph.walk()]
    assert count == len(walked) == 8
    assert ops == dict(sorted(Counter(n.qualified_op for n in walked).items()))
    assert ops == {"If": 1, "Relu": 4, "graphopt.GemmAct": 3}  # then and else bodies: one Relu, one GemmAct each
    assert list(ops) == sorted(ops) and list(custom) == sorted(custom)
    assert custom == {"GemmAct": 3}


def test_census_of_a_graph_without_custom_ops():
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    assert _census(load_model(model)) == (1, {"Relu": 1}, {})
