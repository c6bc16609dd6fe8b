"""fold_transposes: the dynamo exporter's last-two-axes swap through a 3-D view becomes one Transpose, and a
Transpose of a Transpose becomes one (none when they cancel); near-misses stay with their reason."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import check_pass, model, ops, untouched  # noqa: E402

from graphopt.ir import from_model, to_model  # noqa: E402
from graphopt.passes import fold_transposes, run_cleanup  # noqa: E402

BIG, SMALL = np.iinfo(np.int64).max, np.iinfo(np.int64).min
INITS = {"m1": np.array([-1], np.int64), "m2": np.array([-2], np.int64), "big": np.array([BIG], np.int64),
         "small": np.array([SMALL], np.int64), "c7": np.array([7], np.int64), "c16": np.array([16], np.int64)}


def _swap(first=("m1", "s_m2", "s_m1"), second=("s_lead", "s_m1", "s_m2"), extra_reader=None, y_out=False):
    """Relu(x) [batch, 4, seq, 16] -> Reshape to [-1, seq, 16] -> Transpose(0,2,1) -> Reshape to
    [batch, 4, 16, seq] -> Neg, the targets sliced from Shape(x) as the dynamo exporter writes them."""
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Shape", ["r"], ["s"], start=0),
             h.make_node("Slice", ["s", "m2", "m1"], ["s_m2"]), h.make_node("Slice", ["s", "m1", "big"], ["s_m1"]),
             h.make_node("Slice", ["s", "small", "m2"], ["s_lead"]),
             h.make_node("Concat", list(first), ["t1"], axis=0), h.make_node("Reshape", ["r", "t1"], ["v3"]),
             h.make_node("Transpose", ["v3"], ["v3t"], perm=[0, 2, 1]),
             h.make_node("Concat", list(second), ["t2"], axis=0), h.make_node("Reshape", ["v3t", "t2"], ["y"])]
    outputs = [("y", None)] if y_out else [("out", None)]
    if not y_out:
        nodes.append(h.make_node("Neg", ["y"], ["out"]))
    if extra_reader:
        nodes.append(h.make_node("Neg", [extra_reader], ["extra"]))
        outputs.append(("extra", None))
    return model(nodes, [("x", ["batch", 4, "seq", 16])], outputs, INITS, value_info=[("r", ["batch", 4, "seq", 16])])


def _feeds(rng):
    return {"x": rng.standard_normal((2, 4, 7, 16)).astype(np.float32)}


def _perms(m):
    return [list(n.attribute[0].ints) for n in m.graph.node if n.op_type == "Transpose"]


def test_the_dynamo_swap_through_a_3d_view_is_one_transpose(rng):
    for y_out in (False, True):  # y a graph output keeps its name
        _, out = check_pass(fold_transposes, _swap(y_out=y_out), 1, rng=rng, feeds=_feeds(rng))
        assert _perms(out) == [[0, 1, 3, 2]] and ops(out).count("Reshape") == 0


def test_static_targets_fold_too(rng):
    m = model([h.make_node("Relu", ["x"], ["r"]), h.make_node("Reshape", ["r", "a"], ["v3"]),
               h.make_node("Transpose", ["v3"], ["v3t"], perm=[0, 2, 1]), h.make_node("Reshape", ["v3t", "b"], ["y"])],
              [("x", [2, 4, 7, 16])], [("y", None)],
              {"a": np.array([-1, 7, 16], np.int64), "b": np.array([2, 4, 16, 7], np.int64)}, value_info=[("r", [2, 4, 7, 16])])
    _, out = check_pass(fold_transposes, m, 1, rng=rng)
    assert _perms(out) == [[0, 1, 3, 2]]


def test_swaps_that_are_not_stay_with_their_reason():
    cases = [(dict(extra_reader="v3"), "another reader"),
             (dict(extra_reader="v3t"), "another reader"),
             (dict(second=("s_lead", "s_m2", "s_m1")), "last two swapped"),          # back to x's own order
             (dict(first=("m1", "s_m1", "s_m2")), "first Reshape is not"),           # a view of other dims
             (dict(first=("c7", "s_m2", "s_m1")), "first Reshape is not"),           # not -1
             (dict(second=("s_lead", "s_m1", "c7")), "last two swapped")]            # a constant for a symbolic dim
    for kwargs, why in cases:
        reasons = untouched(fold_transposes, _swap(**kwargs))
        assert any(why in r for r in reasons), (kwargs, reasons)


def test_a_target_from_elsewhere_is_not_proof():
    m = _swap()
    for i, node in enumerate(m.graph.node):
        if node.output[0] == "t2":  # the second target from a graph input: nothing says what it holds
            m.graph.node[i].CopyFrom(h.make_node("Identity", ["shape_in"], ["t2"]))
    m.graph.input.append(h.make_tensor_value_info("shape_in", 7, [4]))
    reasons = untouched(fold_transposes, m)
    assert any("not made of" in r for r in reasons), reasons


def _pair(p, q, second_reader=False, out_name="y"):
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Transpose", ["r"], ["t"], **({"perm": p} if p else {})),
             h.make_node("Transpose", ["t"], [out_name], **({"perm": q} if q else {}))]
    outputs = [(out_name, None)]
    if second_reader:
        nodes.append(h.make_node("Neg", ["t"], ["extra"]))
        outputs.append(("extra", None))
    return model(nodes, [("x", [2, 3, 5, 7])], outputs, value_info=[("r", [2, 3, 5, 7])])


def test_a_transpose_of_a_transpose_is_one(rng):
    _, out = check_pass(fold_transposes, _pair([0, 2, 1, 3], [0, 1, 3, 2]), 1, rng=rng)
    assert _perms(out) == [[0, 2, 3, 1]]  # the head split's K^T, as attention_qkv_bshd reads it


def test_transposes_that_cancel_leave_none(rng):
    for p, q in (([0, 2, 3, 1], [0, 3, 1, 2]), (None, None)):  # no perm: reversed axes, twice
        g, out = check_pass(fold_transposes, _pair(p, q), 1, rng=rng)
        run_cleanup(g)  # the inner one has no reader left: dead code takes it
        assert "Transpose" not in ops(to_model(g)), (p, q)
        assert [o.name for o in to_model(g).graph.output] == ["y"]


def test_an_inner_transpose_read_elsewhere_stays():
    reasons = untouched(fold_transposes, _pair([0, 2, 1, 3], [0, 1, 3, 2], second_reader=True))
    assert any("another reader" in r for r in reasons), reasons


def test_cleanup_takes_the_dynamo_k_chain_to_one_head_split_transpose():
    """The whole K^T path of a dynamo attention: head split Transpose(0,2,1,3), then the 3-D swap; after the
    cleanup one Transpose(0,2,3,1) of [B, S, H, D] is left, the form attention_qkv_bshd takes."""
    m = _swap()
    m.graph.node[0].op_type = "Transpose"
    m.graph.node[0].attribute.extend([h.make_attribute("perm", [0, 2, 1, 3])])
    m.graph.input[0].CopyFrom(h.make_tensor_value_info("x", 1, ["batch", "seq", 4, 16]))
    g = from_model(m)
    totals = run_cleanup(g)
    assert totals["fold_transposes"] == 2
    assert _perms(to_model(g)) == [[0, 2, 3, 1]] and ops(to_model(g)) == ["Transpose", "Neg"]
