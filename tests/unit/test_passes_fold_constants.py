"""fold_constants / constants_to_initializers / fold_shape: fold what is small, refuse what is big."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import check_pass, load, model, ops, run, untouched  # noqa: E402

from graphopt.passes import constants_to_initializers, fold_constants, fold_shape  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_constant_chain_folds_and_keeps_output_names(rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)
    nodes = [
        h.make_node("Add", ["a", "b"], ["s"]),  # broadcast
        h.make_node("Constant", [], ["two"], value_float=2.0),
        h.make_node("Mul", ["s", "two"], ["m"]),
        h.make_node("Reshape", ["m", "shape"], ["folded_out"]),
        h.make_node("Add", ["x", "folded_out"], ["y"]),
    ]
    m = model(nodes, [("x", [5, 3])], [("y", [5, 3]), ("folded_out", [5, 3])], {"a": a, "b": b, "shape": np.array([5, 3], np.int64)})
    g, out = check_pass(fold_constants, m, 3, rng=rng)
    assert ops(out) == ["Constant", "Add"]  # Constant nodes are constants_to_initializers' job
    assert "folded_out" in {t.name for t in out.graph.initializer}
    np.testing.assert_allclose(
        {t.name: t for t in out.graph.initializer} and g.constant_value("folded_out"), ((a + b) * 2).reshape(5, 3), rtol=1e-6
    )


def test_multi_output_node_folds(rng):
    nodes = [h.make_node("Split", ["c", "split"], ["p", "q"], axis=0), h.make_node("Add", ["x", "p"], ["y"]), h.make_node("Sub", ["x", "q"], ["z"])]
    m = model(nodes, [("x", [4])], [("y", [4]), ("z", [4])], {"c": rng.standard_normal(8).astype(np.float32), "split": np.array([4, 4], np.int64)})
    _, out = check_pass(fold_constants, m, 1, rng=rng)
    assert ops(out) == ["Add", "Sub"]


def test_small_range_and_constant_of_shape_fold(rng):
    nodes = [
        h.make_node("Range", ["s", "l", "d"], ["r"]),
        h.make_node("ConstantOfShape", ["shp"], ["c"], value=h.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
        h.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        h.make_node("Add", ["rf", "c"], ["k"]),
        h.make_node("Add", ["x", "k"], ["y"]),
    ]
    inits = {"s": np.array(1, np.int64), "l": np.array(12, np.int64), "d": np.array(3, np.int64), "shp": np.array([4], np.int64)}
    _, out = check_pass(fold_constants, m := model(nodes, [("x", [4])], [("y", [4])], inits), 4, rng=rng)
    assert ops(out) == ["Add"]


def test_initializer_that_is_a_graph_input_is_not_a_constant():
    m = model([h.make_node("Neg", ["c"], ["n"]), h.make_node("Add", ["x", "n"], ["y"])], [("x", [3]), ("c", [3])], [("y", [3])], {"c": np.ones(3, np.float32)})
    untouched(fold_constants, m)


def test_random_ops_are_never_folded():
    m = model(
        [h.make_node("RandomNormalLike", ["c"], ["r"]), h.make_node("Add", ["x", "r"], ["y"])],
        [("x", [3])],
        [("y", [3])],
        {"c": np.ones(3, np.float32)},
    )
    reasons = untouched(fold_constants, m)
    assert "never folded" in reasons[0]


def test_fold_inside_if_branch_with_outer_constant(rng):
    then = h.make_graph(
        [h.make_node("Neg", ["c"], ["nc"]), h.make_node("Add", ["x", "nc"], ["t"])], "then", [], [h.make_tensor_value_info("t", TensorProto.FLOAT, [3])]
    )
    els = h.make_graph([h.make_node("Relu", ["x"], ["e"])], "else", [], [h.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
    m = model(
        [h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els)],
        [("cond", [], TensorProto.BOOL), ("x", [3])],
        [("y", [3])],
        {"c": rng.standard_normal(3).astype(np.float32)},
    )
    _, out = check_pass(fold_constants, m, 1, rng=rng)
    feeds = {"cond": np.array(True), "x": rng.standard_normal(3).astype(np.float32)}
    np.testing.assert_allclose(run(out, feeds)[0], run(m, feeds)[0])


def test_limit_is_respected_before_evaluation():
    nodes = [h.make_node("ConstantOfShape", ["shp"], ["c"]), h.make_node("Add", ["x", "c"], ["y"])]
    m = model(nodes, [("x", [1000])], [("y", [1000])], {"shp": np.array([1000], np.int64)})
    reasons = untouched(fold_constants, m, limit_bytes=3999)
    assert "4000 bytes" in reasons[0]
    g = load(m)
    assert fold_constants(g, limit_bytes=4000) == 1


def test_a_relayout_of_a_shared_weight_folds_past_the_per_node_cap(rng):
    """The dynamo exporter's tied lm_head: ``MatMul(x, Transpose(W))`` with W also read by the embedding's
    Gather. A re-layout adds at most its input's bytes, so the per-node cap (for ops that grow a model)
    does not hold it back; W stays for the Gather, and the outputs are unchanged."""
    w = rng.standard_normal((50, 16)).astype(np.float32)  # 3,200 bytes: over the 1,000-byte cap below
    nodes = [h.make_node("Gather", ["w", "ids"], ["emb"]), h.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             h.make_node("MatMul", ["emb", "wt"], ["y"])]
    m = model(nodes, [("ids", [2, 3], TensorProto.INT64)], [("y", [2, 3, 50])], {"w": w})
    feeds = {"ids": np.array([[0, 7, 49], [3, 3, 1]], np.int64)}
    g, out = check_pass(fold_constants, m, 1, feeds=feeds, limit_bytes=1000)
    assert ops(out) == ["Gather", "MatMul"]
    assert {t.name for t in out.graph.initializer} == {"w", "wt"}


def test_a_relayout_still_counts_against_the_runs_total_budget(rng):
    from graphopt.passes import FoldBudget

    nodes = [h.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), h.make_node("MatMul", ["x", "wt"], ["y"]),
             h.make_node("MatMul", ["y", "w"], ["z"])]  # w read twice: the fold would keep both copies
    m = model(nodes, [("x", [2, 16])], [("z", [2, 16])], {"w": rng.standard_normal((50, 16)).astype(np.float32)})
    reasons = untouched(fold_constants, m, limit_bytes=1000, budget=FoldBudget(total_bytes=3199))
    assert "over the folding limit of 3199" in reasons[0], reasons


def test_an_expand_over_the_per_node_cap_is_still_refused():
    nodes = [h.make_node("Expand", ["c", "shp"], ["big"]), h.make_node("Add", ["x", "big"], ["y"])]
    m = model(nodes, [("x", [1000])], [("y", [1000])], {"c": np.ones(1, np.float32), "shp": np.array([1000], np.int64)})
    assert "over the folding limit of 1000" in untouched(fold_constants, m, limit_bytes=1000)[0]


HUGE = {
    "ConstantOfShape": ([h.make_node("ConstantOfShape", ["shp"], ["big"])], {"shp": np.array([2**20, 2**20], np.int64)}),
    "Tile": ([h.make_node("Tile", ["c", "rep"], ["big"])], {"c": np.ones((2, 2), np.float32), "rep": np.array([2**19, 2**19], np.int64)}),
    "Expand": ([h.make_node("Expand", ["c", "shp"], ["big"])], {"c": np.ones((1, 1), np.float32), "shp": np.array([2**20, 2**20], np.int64)}),
}


@pytest.mark.parametrize("op", sorted(HUGE))
def test_2_pow_40_elements_are_refused_instantly(op):
    nodes, inits = HUGE[op]
    nodes = nodes + [h.make_node("ReduceSum", ["big"], ["y"], keepdims=0)]
    m = model(nodes, [], [("y", [])], inits, opset=13)
    start = time.perf_counter()
    reasons = untouched(fold_constants, m)
    assert time.perf_counter() - start < 2.0
    assert any("over the folding limit" in r and str(2**42) in r for r in reasons), reasons


def test_huge_folds_do_not_grow_peak_rss():
    """In a fresh process (so earlier tests do not hide the peak): 2**40-element ConstantOfShape,
    Tile and Expand, and a 2**26-element one (256 MB, which folding without the cap would really
    allocate), all stay unfolded and the peak RSS grows by less than 200 MB."""
    script = textwrap.dedent(
        """
        import resource, sys
        import numpy as np
        from onnx import helper as h, numpy_helper, TensorProto
        from graphopt.ir import from_model
        from graphopt.passes import run_cleanup

        def build(node, inits):
            g = h.make_graph([node, h.make_node("ReduceSum", ["big"], ["y"], keepdims=0)], "g", [],
                             [h.make_tensor_value_info("y", TensorProto.FLOAT, [])],
                             initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
            return h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=7)

        models = [
            build(h.make_node("ConstantOfShape", ["shp"], ["big"]), {"shp": np.array([2**20, 2**20], np.int64)}),
            build(h.make_node("Tile", ["c", "rep"], ["big"]), {"c": np.ones((2, 2), np.float32), "rep": np.array([2**19, 2**19], np.int64)}),
            build(h.make_node("Expand", ["c", "shp"], ["big"]), {"c": np.ones((1, 1), np.float32), "shp": np.array([2**20, 2**20], np.int64)}),
            build(h.make_node("ConstantOfShape", ["shp"], ["big"]), {"shp": np.array([2**13, 2**13], np.int64)}),
        ]
        graphs = [from_model(m) for m in models]
        run_cleanup(from_model(models[0]))  # warm up onnxruntime / shape inference allocations
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for g in graphs:
            totals = run_cleanup(g)
            assert totals["fold_constants"] == 0, totals
            assert [n.op_type for n in g.nodes()] [:1] in (["ConstantOfShape"], ["Tile"], ["Expand"]), g.nodes()
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(f"grown {grown_mb:.1f} MB")
        sys.exit(0 if grown_mb < 200 else 1)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_constants_to_initializers_keeps_names(rng):
    nodes = [
        h.make_node("Constant", [], ["k"], value=h.make_tensor("v", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])),
        h.make_node("Constant", [], ["ki"], value_ints=[3]),
        h.make_node("Reshape", ["x", "ki"], ["xr"]),
        h.make_node("Add", ["xr", "k"], ["y"]),
        h.make_node("Constant", [], ["out_const"], value_float=4.5),
    ]
    m = model(nodes, [("x", [1, 3])], [("y", [3]), ("out_const", [])])
    g, out = check_pass(constants_to_initializers, m, 3, rng=rng)
    assert ops(out) == ["Reshape", "Add"]
    assert sorted(t.name for t in out.graph.initializer) == ["k", "ki", "out_const"]


def test_fold_shape_of_static_tensor(rng):
    nodes = [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("Shape", ["r"], ["s"], start=-1),
        h.make_node("Size", ["r"], ["n"]),
        h.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
        h.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
        h.make_node("Add", ["r", "sf"], ["a"]),
        h.make_node("Add", ["a", "nf"], ["y"]),
    ]
    m = model(nodes, [("x", [2, 7])], [("y", [2, 7])], value_info=[("r", [2, 7])])
    g, out = check_pass(fold_shape, m, 2, rng=rng)
    np.testing.assert_array_equal(g.constant_value("s"), [7])
    assert int(g.constant_value("n")) == 14


def test_fold_shape_leaves_symbolic_shapes():
    m = model([h.make_node("Shape", ["x"], ["y"])], [("x", ["batch", 3])], [("y", [2], TensorProto.INT64)])
    untouched(fold_shape, m)


def test_overflowing_tile_is_refused_as_unknown_size():
    nodes = [h.make_node("Tile", ["c", "rep"], ["big"]), h.make_node("ReduceSum", ["big"], ["y"], keepdims=0)]
    m = model(nodes, [], [("y", [])], {"c": np.ones((2, 2), np.float32), "rep": np.array([2**62, 2**62], np.int64)}, opset=13)
    reasons = untouched(fold_constants, m)
    assert "not known before evaluation" in reasons[0] or "shape inference failed" in reasons[0]


def test_total_budget_stops_folding_deterministically():
    from graphopt.passes import FoldBudget

    nodes = [h.make_node("ConstantOfShape", [f"s{i}"], [f"c{i}"]) for i in range(4)]
    nodes += [h.make_node("Sum", [f"c{i}" for i in range(4)] + ["x"], ["y"])]
    inits = {f"s{i}": np.array([100], np.int64) for i in range(4)}
    m = model(nodes, [("x", [100])], [("y", [100])], inits)
    g = load(m)
    reasons = []
    budget = FoldBudget(total_bytes=1000)  # room for two 400-byte outputs
    assert fold_constants(g, budget=budget, trace=lambda p, n, r: reasons.append(r)) == 2
    assert budget.spent_bytes == 800
    assert [n.op_type for n in g.nodes()] == ["ConstantOfShape", "ConstantOfShape", "Sum"]
    assert "budget" in reasons[0]


def test_constant_read_by_a_subgraph_becomes_an_initializer(rng):
    then = h.make_graph([h.make_node("Add", ["x", "k"], ["t"])], "then", [], [h.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    els = h.make_graph([h.make_node("Sub", ["x", "k"], ["e"])], "else", [], [h.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
    nodes = [
        h.make_node("Constant", [], ["k"], value=h.make_tensor("v", TensorProto.FLOAT, [3], [1.0, -2.0, 3.0])),
        h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els),
    ]
    m = model(nodes, [("cond", [], TensorProto.BOOL), ("x", [3])], [("y", [3])])
    _, out = check_pass(constants_to_initializers, m, 1, rng=rng)
    assert ops(out) == ["If"] and [t.name for t in out.graph.initializer] == ["k"]
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "x": rng.standard_normal(3).astype(np.float32)}
        np.testing.assert_allclose(run(out, feeds)[0], run(m, feeds)[0])


def test_fold_inside_loop_body_and_body_passthrough_identity_stays(rng):
    from graphopt.passes import eliminate_identity

    body = h.make_graph(
        [
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
            h.make_node("Neg", ["k"], ["nk"]),  # k is an outer constant: folds inside the body
            h.make_node("Add", ["acc_in", "nk"], ["acc_out"]),
        ],
        "body",
        [h.make_tensor_value_info("i", TensorProto.INT64, []), h.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         h.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3])],
        [h.make_tensor_value_info("cond_out", TensorProto.BOOL, []), h.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3])],
    )
    nodes = [h.make_node("Loop", ["n", "", "x"], ["y"], body=body)]
    m = model(nodes, [("x", [3])], [("y", [3])], {"n": np.array(3, np.int64), "k": np.array([1.0, 2.0, 0.5], np.float32)})
    _, out = check_pass(fold_constants, m, 1, rng=rng)
    g = load(out)
    assert eliminate_identity(g) == 0  # cond_in is a body input: the Identity must stay


def test_a_tied_lm_head_over_16_mib_becomes_a_gemmact(rng):
    """End to end, at the default cap: the dynamo export's tied lm_head (a 17 MB weight read by the Gather
    and, transposed, by the MatMul) gets a constant weight, so the MatMul fuses into a tunable GemmAct
    instead of running a per-inference Transpose and an untuned MatMul. Outputs verified."""
    import graphopt

    w = (rng.standard_normal((4160, 1024)) * 0.03).astype(np.float32)  # 17.0 MB: over the 16 MiB per-node cap
    nodes = [h.make_node("Gather", ["w", "ids"], ["emb"]), h.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             h.make_node("MatMul", ["emb", "wt"], ["y"])]
    m = model(nodes, [("ids", [1, 4], TensorProto.INT64)], [("y", [1, 4, 4160])], {"w": w})
    out, report = graphopt.optimize(m, gpu="none", verify=True)
    assert [n.op_type for n in out.graph.node] == ["Gather", "GemmAct"]


def test_a_relayout_that_replaces_its_input_is_not_charged_to_the_budget(rng):
    """A Transpose of a weight read nowhere else replaces it (the old one is dead): the model does not grow, so
    neither the per-node cap nor a spent total budget holds it back, and nothing is charged."""
    from graphopt.passes import FoldBudget

    nodes = [h.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), h.make_node("MatMul", ["x", "wt"], ["y"])]
    m = model(nodes, [("x", [2, 16])], [("y", [2, 50])], {"w": rng.standard_normal((50, 16)).astype(np.float32)})
    budget = FoldBudget(total_bytes=0)
    g, out = check_pass(fold_constants, m, 1, limit_bytes=1000, budget=budget)
    assert ops(out) == ["MatMul"] and budget.spent_bytes == 0
