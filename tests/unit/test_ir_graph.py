"""The IR's mutation API keeps producer/consumer links consistent and refuses broken states."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.errors import InvalidGraph
from graphopt.ir import Graph, from_model, to_model


def _chain_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Sigmoid", ["a"], ["b"], name="sig"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    g = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_links_and_queries():
    g = from_model(_chain_model())
    assert [n.name for n in g.consumers("a")] == ["sig", "add"]
    assert g.producer("b").name == "sig"
    assert g.producer("x") is None
    assert g.is_graph_output("y") and g.is_graph_input("x")
    assert [n.name for n in g.nodes_by_op("Add")] == ["add"]
    assert g.nx.has_edge("relu", "sig", key="a") and g.nx.has_edge("relu", "add", key="a")
    g.lint()


def test_remove_node_refused_while_used():
    g = from_model(_chain_model())
    with pytest.raises(InvalidGraph, match="still used by 'add'"):
        g.remove_node(g.node("sig"))
    with pytest.raises(InvalidGraph, match="graph output"):
        g.remove_node(g.node("add"))


def test_replace_all_uses_then_remove():
    g = from_model(_chain_model())
    assert g.replace_all_uses("b", "a") == 1
    assert g.node("add").inputs == ["a", "a"]
    assert g.consumers("b") == []
    g.remove_node(g.node("sig"))
    assert not g.nx.has_node("sig")
    g.lint()
    m = to_model(g)
    onnx.checker.check_model(m, full_check=True)


def test_replace_subgraph_keeps_output_names_and_refuses_leaks():
    g = from_model(_chain_model())
    with pytest.raises(InvalidGraph, match="read by 'add'"):
        g.replace_subgraph([g.node("relu"), g.node("sig")], [dict(op_type="Relu", inputs=["x"], outputs=["b"])])
    assert len(g) == 3  # nothing changed
    new = g.replace_subgraph(
        [g.node("sig"), g.node("add")],
        [dict(op_type="Mul", inputs=["a", "a"], outputs=["y"], doc_string="fused")],
    )
    assert g.producer("y") is new[0] and g.outputs == ["y"]
    assert [n.op_type for n in g.nodes()] == ["Relu", "Mul"]
    g.lint()


def test_unique_names_never_collide_with_lookalikes():
    m = _chain_model()
    # Existing names that look like generated ones.
    m.graph.node.append(helper.make_node("Identity", ["y"], ["Relu_1"], name="Relu"))
    m.graph.output.append(helper.make_tensor_value_info("Relu_1", TensorProto.FLOAT, [2, 3]))
    g = from_model(m)
    seen = set()
    for _ in range(50):
        n = g.add_node("Relu", ["x"])
        assert n.name not in seen and n.outputs[0] not in seen
        assert n.name not in ("Relu", "relu") and n.outputs[0] not in ("Relu_1", "a", "b", "x", "y")
        seen.update([n.name, n.outputs[0]])


def test_lint_catches_cycle_dangling_duplicates():
    g = from_model(_chain_model())
    g.set_node_input(g.node("relu"), 0, "y")  # y depends on relu -> cycle
    with pytest.raises(InvalidGraph, match="cycle"):
        g.lint()
    g = from_model(_chain_model())
    g.set_node_input(g.node("sig"), 0, "nowhere")
    with pytest.raises(InvalidGraph, match="'nowhere'"):
        g.lint()
    m = _chain_model()
    m.graph.output.append(m.graph.output[0])
    with pytest.raises(InvalidGraph, match="more than once"):
        from_model(m).lint()
    m = _chain_model()
    m.graph.node.append(helper.make_node("Relu", ["x"], ["a"], name="relu2"))
    with pytest.raises(InvalidGraph, match="produced by two nodes"):
        from_model(m)


@pytest.mark.parametrize("inputs", [1, 9])  # a short input list is searched as it is, a long one as a set
def test_lint_catches_a_stale_consumer_link(inputs):
    names = [f"x{i}" for i in range(inputs)]
    g = from_model(helper.make_model(helper.make_graph(
        [helper.make_node("Sum", names, ["y"], name="sum")], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])))
    node = g.node("sum")
    g.lint()
    g._consumers.setdefault("x0_other", {})["sum"] = None  # a link the node does not read
    with pytest.raises(InvalidGraph, match="stale consumer link 'x0_other' -> 'sum'"):
        g.lint()
    del g._consumers["x0_other"]
    g._consumers["x0"]["ghost"] = None  # a link from a node that is gone
    with pytest.raises(InvalidGraph, match="stale consumer link 'x0' -> 'ghost'"):
        g.lint()
    assert node.inputs[0] == "x0"


def test_toposort_is_stable_and_deterministic():
    m = _chain_model()
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend([nodes[2], nodes[0], nodes[1]])  # out of order but acyclic
    g = from_model(m)
    assert [n.name for n in g.toposort().nodes()] == ["relu", "sig", "add"]
    assert to_model(from_model(m)).SerializeToString() == to_model(from_model(m)).SerializeToString()


def _if_model():
    """An If whose branches read the outer tensor `w` (outer-scope reference)."""
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    then_g = helper.make_graph(
        [helper.make_node("Add", ["xr", "w"], ["t_out"], name="then_add")],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [2, 3])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Sub", ["xr", "w"], ["e_out"], name="else_sub")],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [2, 3])],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["xr"], name="relu"),
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [w],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_outer_scope_reference_counts_as_a_consumer():
    g = from_model(_if_model())
    assert [n.name for n in g.consumers("xr")] == ["if"]
    assert [n.name for n in g.consumers("w")] == ["if"]
    with pytest.raises(InvalidGraph, match="still used by 'if'"):
        g.remove_node(g.node("relu"))
    walked = [(sub.name, n.name) for sub, n in g.walk()]
    # depth first, bodies in attribute order (onnx.helper sorts attributes: else_branch first)
    assert walked == [("g", "relu"), ("g", "if"), ("else", "else_sub"), ("then", "then_add")]
    then_g = g.node("if").attr("then_branch")
    assert then_g.parent is g and then_g.constant_value("w") is not None
    assert then_g.constant_value("xr") is None
    # Renaming an outer tensor reaches into the bodies.
    g.add_node("Identity", ["x"], ["x2"], name="ident")
    g.replace_all_uses("xr", "x2")
    assert g.node("if").attr("then_branch").node("then_add").inputs == ["x2", "w"]
    g.lint()


def test_attributes_round_trip_as_python_values():
    g = Graph("g")
    g._inputs.append("x")
    n = g.add_node("Conv", ["x", "w"], name="c", attrs=dict(strides=[2, 2], group=3, auto_pad="NOTSET"))
    assert n.attr("strides") == [2, 2] and n.attr("group") == 3 and n.attr("auto_pad") == "NOTSET"
    n.set_attr("alpha", np.float32(0.5))
    assert n.attr("alpha") == 0.5
    assert n.attrs_dict() == {"strides": [2, 2], "group": 3, "auto_pad": "NOTSET", "alpha": 0.5}
