"""dead_code: unused nodes (transitively, across subgraphs) and initializers go; the rest stays."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import check_pass, load, model, ops, run, untouched  # noqa: E402

from graphopt.passes import dead_code  # noqa: E402


def test_dead_chain_and_unused_initializer_go(rng):
    nodes = [
        h.make_node("Relu", ["x"], ["y"]),
        h.make_node("Mul", ["x", "w"], ["d1"]),
        h.make_node("Sigmoid", ["d1"], ["d2"]),
        h.make_node("Neg", ["d2"], ["d3"]),
    ]
    m = model(nodes, [("x", [3])], [("y", [3])], {"w": np.ones(3, np.float32), "unused": np.zeros(2, np.float32)})
    g, out = check_pass(dead_code, m, 5, rng=rng)  # 3 nodes + 2 initializers
    assert ops(out) == ["Relu"] and not out.graph.initializer


def test_initializer_that_is_a_graph_input_and_graph_outputs_stay():
    m = model(
        [h.make_node("Relu", ["x"], ["a"]), h.make_node("Neg", ["a"], ["y"])],
        [("x", [3]), ("default", [3])],
        [("y", [3]), ("a", [3])],
        {"default": np.ones(3, np.float32)},
    )
    untouched(dead_code, m)


def test_multi_output_node_with_one_used_output_stays():
    m = model([h.make_node("Split", ["x"], ["p", "q"], axis=0, num_outputs=2)], [("x", [4])], [("p", [2])], opset=18)
    untouched(dead_code, m)


def _branch(nodes, out):
    return h.make_graph(nodes, out + "_g", [], [h.make_tensor_value_info(out, TensorProto.FLOAT, [3])])


def test_dead_if_and_what_only_it_read_go(rng):
    # "s" is read only by the dead If's branch: both go in one call.
    then = _branch([h.make_node("Neg", ["s"], ["t"])], "t")
    els = _branch([h.make_node("Relu", ["s"], ["e"])], "e")
    nodes = [
        h.make_node("Sigmoid", ["x"], ["s"]),
        h.make_node("If", ["cond"], ["dead"], then_branch=then, else_branch=els),
        h.make_node("Relu", ["x"], ["y"]),
    ]
    m = model(nodes, [("cond", [], TensorProto.BOOL), ("x", [3])], [("y", [3])])
    _, out = check_pass(dead_code, m, 2, rng=rng)
    assert ops(out) == ["Relu"]


def test_live_if_keeps_outer_values_and_loses_dead_body_nodes(rng):
    # The then-branch has a dead node that is the only reader of outer "s": both go.
    then = _branch([h.make_node("Neg", ["x"], ["t"]), h.make_node("Exp", ["s"], ["junk"])], "t")
    els = _branch([h.make_node("Relu", ["x"], ["e"])], "e")
    nodes = [h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els)]
    m = model(nodes, [("cond", [], TensorProto.BOOL), ("x", [3])], [("y", [3])])
    g, out = check_pass(dead_code, m, 2, rng=rng)
    assert ops(out) == ["If"]
    then_out = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then_out.node] == ["Neg"]
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "x": rng.standard_normal(3).astype(np.float32)}
        np.testing.assert_allclose(run(out, feeds)[0], run(m, feeds)[0])


def test_value_read_by_a_live_subgraph_stays():
    then = _branch([h.make_node("Neg", ["s"], ["t"])], "t")
    els = _branch([h.make_node("Relu", ["x"], ["e"])], "e")
    nodes = [h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els)]
    m = model(nodes, [("cond", [], TensorProto.BOOL), ("x", [3])], [("y", [3])])
    untouched(dead_code, m)
    g = load(m)
    assert dead_code(g) == 0 and len(g) == 2
