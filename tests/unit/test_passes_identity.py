"""eliminate_identity / eliminate_dropout: copies go, graph-output names stay, near-misses stay."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import check_pass, load, model, ops, run, untouched  # noqa: E402

from graphopt.passes import eliminate_dropout, eliminate_identity  # noqa: E402


def test_identity_in_chain_is_removed(rng):
    m = model(
        [h.make_node("Relu", ["x"], ["r"]), h.make_node("Identity", ["r"], ["i"]), h.make_node("Sigmoid", ["i"], ["y"])],
        [("x", [3, 5])],
        [("y", [3, 5])],
    )
    _, out = check_pass(eliminate_identity, m, 1, rng=rng)
    assert ops(out) == ["Relu", "Sigmoid"]


def test_identity_to_graph_output_keeps_the_output_name(rng):
    # r is also read by Neg: after the rewrite Relu writes "y" and Neg reads "y".
    m = model(
        [h.make_node("Relu", ["x"], ["r"]), h.make_node("Identity", ["r"], ["y"]), h.make_node("Neg", ["r"], ["z"])],
        [("x", [2, 7])],
        [("y", [2, 7]), ("z", [2, 7])],
    )
    _, out = check_pass(eliminate_identity, m, 1, rng=rng)
    assert ops(out) == ["Relu", "Neg"]
    assert out.graph.node[0].output[0] == "y"
    assert [o.name for o in out.graph.output] == ["y", "z"]
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT


def test_identity_chain_to_output(rng):
    m = model(
        [h.make_node("Relu", ["x"], ["r"]), h.make_node("Identity", ["r"], ["a"]), h.make_node("Identity", ["a"], ["y"])],
        [("x", [3])],
        [("y", [3])],
    )
    _, out = check_pass(eliminate_identity, m, 2, rng=rng)
    assert ops(out) == ["Relu"]


def test_identity_of_graph_input_to_output_stays():
    m = model([h.make_node("Identity", ["x"], ["y"])], [("x", [3])], [("y", [3])])
    reasons = untouched(eliminate_identity, m)
    assert "not produced by a node" in reasons[0]


def test_identity_between_two_graph_outputs_stays():
    m = model(
        [h.make_node("Relu", ["x"], ["r"]), h.make_node("Identity", ["r"], ["y"])],
        [("x", [3])],
        [("r", [3]), ("y", [3])],
    )
    reasons = untouched(eliminate_identity, m)
    assert "both graph outputs" in reasons[0]


def test_identity_of_initializer_to_output_stays():
    m = model(
        [h.make_node("Identity", ["c"], ["y"]), h.make_node("Relu", ["x"], ["z"])],
        [("x", [3])],
        [("y", [3]), ("z", [3])],
        {"c": np.ones(3, np.float32)},
    )
    untouched(eliminate_identity, m)


def _if_model(then_nodes, then_out, else_nodes, else_out, outer_nodes=(), shape=(4,)):
    then = h.make_graph(then_nodes, "then", [], [h.make_tensor_value_info(then_out, TensorProto.FLOAT, list(shape))])
    els = h.make_graph(else_nodes, "else", [], [h.make_tensor_value_info(else_out, TensorProto.FLOAT, list(shape))])
    return model(
        list(outer_nodes) + [h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els)],
        [("cond", [], TensorProto.BOOL), ("x", list(shape))],
        [("y", list(shape))],
    )


def test_identity_inside_if_branch_reading_outer_scope(rng):
    # then: Identity(outer r) -> t1 -> Neg -> t2 (branch output) ; else: Identity(x) -> e (branch output: stays)
    m = _if_model(
        [h.make_node("Identity", ["r"], ["t1"]), h.make_node("Neg", ["t1"], ["t2"])],
        "t2",
        [h.make_node("Identity", ["x"], ["e"])],
        "e",
        outer_nodes=[h.make_node("Relu", ["x"], ["r"])],
    )
    _, out = check_pass(eliminate_identity, m, 1, rng=rng)
    then = next(a.g for a in out.graph.node[1].attribute if a.name == "then_branch")
    assert [n.op_type for n in then.node] == ["Neg"] and then.node[0].input[0] == "r"
    for cond in (True, False):  # both branches match the original
        feeds = {"cond": np.array(cond), "x": rng.standard_normal(4).astype(np.float32)}
        np.testing.assert_allclose(run(out, feeds)[0], run(m, feeds)[0])


def test_identity_output_renamed_inside_subgraph_reader(rng):
    # An outer Identity whose output is read only from inside a branch: the branch follows the rewire.
    m = _if_model(
        [h.make_node("Neg", ["i"], ["t"])], "t",
        [h.make_node("Relu", ["i"], ["e"])], "e",
        outer_nodes=[h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("Identity", ["s"], ["i"])],
    )
    g, out = check_pass(eliminate_identity, m, 1, rng=rng)
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "x": rng.standard_normal(4).astype(np.float32)}
        np.testing.assert_allclose(run(out, feeds)[0], run(m, feeds)[0])


# ---------------------------------------------------------------- Dropout


def _dropout_model(dropout_inputs, *, opset=13, mask=False, mask_output=False, inits=None, extra_inputs=(), attrs=None):
    outputs = ["d", "mask"] if mask else ["d"]
    nodes = [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("Dropout", ["r"] + list(dropout_inputs), outputs, **(attrs or {})),
        h.make_node("Sigmoid", ["d"], ["y"]),
    ]
    outs = [("y", [3, 5])]
    if mask_output:
        outs.append(("mask", [3, 5], TensorProto.BOOL))
    return model(nodes, [("x", [3, 5])] + list(extra_inputs), outs, inits or {}, opset=opset)


def test_dropout_without_training_mode_is_removed(rng):
    _, out = check_pass(eliminate_dropout, _dropout_model([]), 1, rng=rng)
    assert ops(out) == ["Relu", "Sigmoid"]


def test_dropout_with_constant_false_training_mode_and_unused_mask(rng):
    m = _dropout_model(["ratio", "tm"], mask=True, inits={"ratio": np.array(0.5, np.float32), "tm": np.array(False)})
    _, out = check_pass(eliminate_dropout, m, 1, rng=rng)
    assert ops(out) == ["Relu", "Sigmoid"]


def test_dropout_opset10_is_removed(rng):
    check_pass(eliminate_dropout, _dropout_model([], opset=10), 1, rng=rng)


def test_dropout_near_misses_stay():
    cases = {
        "true": _dropout_model(["ratio", "tm"], inits={"ratio": np.array(0.5, np.float32), "tm": np.array(True)}),
        "not a constant": _dropout_model(["", "tm"], extra_inputs=[("tm", [], TensorProto.BOOL)]),
        "mask output": _dropout_model([], mask=True, mask_output=True),
    }
    for expected, m in cases.items():
        reasons = untouched(eliminate_dropout, m)
        assert expected in reasons[0], (expected, reasons)


def test_dropout_opset6_needs_is_test():
    reasons = untouched(eliminate_dropout, _dropout_model([], opset=6))
    assert "is_test" in reasons[0]
    g = load(_dropout_model([], opset=6, attrs={"is_test": 1}))
    assert eliminate_dropout(g) == 1
    assert [n.op_type for n in g.nodes()] == ["Relu", "Sigmoid"]
