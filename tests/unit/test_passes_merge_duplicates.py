"""merge_duplicates: a node that repeats an earlier one (same op, attributes and inputs, small constants
by value) goes and its readers read the first; near-misses stay, with the reason where one exists."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import check_pass, model, ops, untouched  # noqa: E402

from graphopt.passes import merge_duplicates  # noqa: E402


def _init(name, value, dtype=np.float32):
    return name, np.asarray(value, dtype=dtype)


def test_per_layer_mask_copies_merge_into_one_and_downstream_follows(rng):
    """GPT-2's export: every layer makes Where(mask, 0, -inf) from its own copies of 0 and -inf."""
    nodes, outs = [], []
    for i in range(3):
        nodes.append(h.make_node("Where", ["m", f"zero{i}", f"ninf{i}"], [f"w{i}"]))
        nodes.append(h.make_node("Add", ["x", f"w{i}"], [f"a{i}"]))
        nodes.append(h.make_node("Neg", [f"a{i}"], [f"y{i}"]))
        outs.append((f"y{i}", [2, 4]))
    inits = [_init(f"zero{i}", [0.0]) for i in range(3)] + [_init(f"ninf{i}", [-1e4]) for i in range(3)]
    m = model(nodes, [("m", [2, 4], TensorProto.BOOL), ("x", [2, 4])], outs, inits)
    _, out = check_pass(merge_duplicates, m, 4, rng=rng)  # two Wheres, then two Adds; the Negs write outputs
    assert ops(out) == ["Where", "Add", "Neg", "Neg", "Neg"]


def test_different_attributes_values_and_random_ops_stay():
    m = model(
        [h.make_node("Softmax", ["x"], ["a"], axis=0), h.make_node("Softmax", ["x"], ["b"], axis=1),
         h.make_node("Add", ["x", "c1"], ["c"]), h.make_node("Add", ["x", "c2"], ["d"]),
         h.make_node("RandomNormalLike", ["x"], ["r1"]), h.make_node("RandomNormalLike", ["x"], ["r2"])],
        [("x", [2, 3])], [("a", [2, 3]), ("b", [2, 3]), ("c", [2, 3]), ("d", [2, 3]), ("r1", [2, 3]), ("r2", [2, 3])],
        [_init("c1", [1.0]), _init("c2", [2.0])])
    assert untouched(merge_duplicates, m) == []


def test_a_duplicate_that_writes_a_graph_output_stays_and_says_why():
    m = model([h.make_node("Relu", ["x"], ["a"]), h.make_node("Relu", ["x"], ["b"])],
              [("x", [2, 3])], [("a", [2, 3]), ("b", [2, 3])])
    assert any("writes a graph output" in r for r in untouched(merge_duplicates, m))


def test_duplicates_inside_a_subgraph_merge_there(rng):
    body = h.make_graph([h.make_node("Neg", ["x"], ["n1"]), h.make_node("Neg", ["x"], ["n2"]),
                         h.make_node("Add", ["n1", "n2"], ["t"])],
                        "then", [], [h.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = h.make_graph([h.make_node("Relu", ["x"], ["e"])], "else", [], [h.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    m = model([h.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=other)],
              [("cond", [], TensorProto.BOOL), ("x", [2, 3])], [("y", [2, 3])])
    _, out = check_pass(merge_duplicates, m, 1, rng=rng, feeds={"cond": np.array(True), "x": rng.standard_normal((2, 3)).astype(np.float32)})
    then = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then.node] == ["Neg", "Add"] and list(then.node[1].input) == ["n1", "n1"]
