"""The engine: matching semantics, the fixpoint, provenance, explain, cycles, keep, subgraphs."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.errors import RuleError
from graphopt.ir import from_model, serialize, to_model
from graphopt.rewrite import (
    NearMiss,
    RuleSet,
    apply_rules,
    find_matches,
    load_rules,
    load_rules_module,
    parse_pattern,
    register_builder,
)
from graphopt.rewrite import _matcher
from graphopt.rewrite.testing import (
    CONV_ACTS,
    CONV_FAMILIES,
    GEMM_ACTS,
    GEMM_FAMILIES,
    Builder,
    act_nodes,
    family_model,
    random_feeds,
    run_ort,
)

SHIPPED = load_rules()


def _rules(tmp_path, text: str, name="t.toml") -> RuleSet:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return load_rules(shipped=False, paths=[p])


def _same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, rtol=1e-4):
    feeds = random_feeds(before)
    for e, a in zip(run_ort(before, feeds), run_ort(after, feeds)):
        assert e.shape == a.shape
        np.testing.assert_allclose(a, e, rtol=rtol, atol=1e-5)


def _conv(b: Builder, x: str, cin: int, cout: int, *, bias=True, group=1, k=3, spatial=2) -> str:
    w = b.rand([cout, cin // group] + [k] * spatial)
    inputs = [x, w] + ([b.rand([cout], "b")] if bias else [])
    return b.op("Conv", inputs, pads=[k // 2] * (2 * spatial), group=group)


# -- matching semantics --------------------------------------------------------------------------


@pytest.mark.parametrize("residual_first", [True, False])
def test_commutative_add_matches_both_operand_orders(residual_first):
    b = Builder()
    x, r = b.input("x", [1, 3, 5, 5]), b.input("r", [1, 4, 5, 5])
    c = _conv(b, x, 3, 4)
    b.output(b.op("Relu", [b.op("Add", [r, c] if residual_first else [c, r])]))
    model = b.model()
    g = from_model(model)
    report = apply_rules(g, SHIPPED)
    assert report.counts == {"conv_residual_relu": 1}
    (node,) = g.nodes()
    assert node.inputs[3] == "r"
    _same_outputs(model, to_model(g))


def test_repeated_variable_must_bind_the_same_tensor():
    b = Builder()
    x = b.input("x", [1, 3, 5, 5])
    c1, c2 = _conv(b, x, 3, 4), _conv(b, x, 3, 4)
    b.output(b.op("Mul", [c1, b.op("Sigmoid", [c2])]))  # x * sigmoid(y): not SiLU
    model = b.model()
    g = from_model(model)
    report = apply_rules(g, RuleSet([SHIPPED.get("conv_silu")]), explain=True)
    assert report.counts == {}
    (nm,) = [n for n in report.near_misses if n.rule == "conv_silu"]
    assert "is bound to" in nm.reason or "produces" in nm.reason, nm
    # ... and the same tensor twice is SiLU.
    b2 = Builder()
    x = b2.input("x", [1, 3, 5, 5])
    c = _conv(b2, x, 3, 4)
    b2.output(b2.op("Mul", [b2.op("Sigmoid", [c]), c]))
    g2 = from_model(b2.model())
    assert apply_rules(g2, SHIPPED).counts == {"conv_silu": 1}
    assert g2.nodes()[0].attr("activation") == "SiLU"


def test_optional_input_matches_absent_and_present():
    for bias in (True, False):
        b = Builder()
        x = b.input("x", [1, 2, 6, 6])
        b.output(b.op("Relu", [_conv(b, x, 2, 3, bias=bias)]))
        model = b.model()
        g = from_model(model)
        assert apply_rules(g, SHIPPED).counts == {"conv_relu": 1}
        assert len([t for t in g.nodes()[0].inputs if t]) == (3 if bias else 2)
        _same_outputs(model, to_model(g))


def test_conv_variants_depthwise_1d_strided_and_no_bias_with_folded_add():
    b = Builder()
    x = b.input("x", [2, 4, 9])  # 1-D conv
    c = b.op("Conv", [x, b.rand([4, 1, 3])], pads=[1, 1], group=4, strides=[2])  # depthwise, no bias, strided
    y = b.op("Relu", [b.op("Add", [c, b.rand([1, 4, 1], "c")])])
    b.output(y)
    model = b.model()
    g = from_model(model)
    assert apply_rules(g, SHIPPED).counts == {"conv_add_relu": 1}
    (node,) = g.nodes()
    assert node.attr("group") == 4 and node.attr("strides") == [2]
    assert g.constant_value(node.inputs[2]).shape == (4,)
    _same_outputs(model, to_model(g))


def test_per_channel_rejects_plain_channel_vector_with_reason():
    b = Builder()
    x = b.input("x", [1, 3, 5, 5])
    b.output(b.op("Relu", [b.op("Add", [_conv(b, x, 3, 5), b.rand([5], "c")])]))
    g = from_model(b.model())
    report = apply_rules(g, SHIPPED, explain=True)
    assert report.counts == {"conv_alone": 1}  # the Conv alone is still tuned; the Add is not a bias
    (nm,) = [n for n in report.near_misses if n.rule == "conv_add_relu"]
    assert "broadcasts along the last spatial axis" in nm.reason


def test_clip_bounds_from_attributes_below_opset_11_and_inputs_from_11():
    for opset in (10, 13):
        model = family_model("conv", "clip", opset=opset)
        g = from_model(model)
        assert apply_rules(g, SHIPPED).counts == {"conv_clip": 1}
        node = g.nodes()[0]
        assert (node.attr("clip_min"), node.attr("clip_max")) == (0.0, 6.0)
        _same_outputs(model, to_model(g))
    # A bound that is not a constant is a near-miss, not a fusion.
    b = Builder()
    x, hi = b.input("x", [1, 2, 5, 5]), b.input("hi", [])
    b.output(b.op("Clip", [_conv(b, x, 2, 2), b.const(0.0), hi]))
    report = apply_rules(from_model(b.model()), SHIPPED, explain=True)
    assert report.counts == {"conv_alone": 1}  # the Conv alone; the Clip stays apart
    assert any(n.rule == "conv_clip" and "Clip max 'hi'" in n.reason and "not a constant" in n.reason
               for n in report.near_misses)


def test_gelu_tanh_and_leakyrelu_alpha_carry_over():
    model = family_model("matmul_add", "gelu_tanh", opset=20)
    g = from_model(model)
    assert apply_rules(g, SHIPPED).counts == {"matmul_add_gelu": 1}
    assert g.nodes()[0].attr("activation") == "GeluTanh"
    _same_outputs(model, to_model(g))
    g2 = from_model(family_model("conv", "leakyrelu"))
    apply_rules(g2, SHIPPED)
    assert g2.nodes()[0].attr("act_alpha") == pytest.approx(0.2)


def test_residual_equal_to_the_conv_input_is_fine():
    b = Builder()
    x = b.input("x", [1, 4, 5, 5])
    b.output(b.op("Relu", [b.op("Add", [_conv(b, x, 4, 4), x])]))
    model = b.model()
    g = from_model(model)
    assert apply_rules(g, SHIPPED).counts == {"conv_residual_relu": 1}
    assert g.nodes()[0].inputs[0] == g.nodes()[0].inputs[3] == "x"
    _same_outputs(model, to_model(g))


def test_residual_computed_from_the_conv_output_is_refused():
    # r = Sigmoid(conv): fusing Add(conv, r) would make the fused node read its own output.
    b = Builder()
    x = b.input("x", [1, 4, 5, 5])
    c = _conv(b, x, 4, 4)
    b.output(b.op("Relu", [b.op("Add", [c, b.op("Sigmoid", [c])])]))
    model = b.model()
    g = from_model(model)
    report = apply_rules(g, SHIPPED, explain=True)
    assert "conv_residual_relu" not in report.counts
    assert any(n.rule == "conv_residual_relu" and "has 2 consumers" in n.reason for n in report.near_misses)
    g.lint()
    _same_outputs(model, to_model(g))


def test_cycle_check_refuses_a_builder_tensor_downstream_of_the_root(tmp_path):
    @register_builder("test_downstream", "n", "tensor")
    def _downstream(g, node):
        return g.consumers(node.outputs[0])[0].outputs[0]

    rules = _rules(tmp_path, """
        [[rule]]
        name = "cyclic"
        doc = "reads a tensor computed from its own output"
        pattern = "Relu(Neg(x) as n) as r"
        replace = "Add(x, test_downstream(r))"
    """)
    b = Builder()
    x = b.input("x", [3])
    b.output(b.op("Abs", [b.op("Relu", [b.op("Neg", [x])])]))
    g = from_model(b.model())
    report = apply_rules(g, rules, explain=True)
    assert report.counts == {}
    (nm,) = report.near_misses
    assert "would create a cycle" in nm.reason
    g.lint()


def test_keep_lets_an_intermediate_stay_used(tmp_path):
    rules = _rules(tmp_path, """
        [[rule]]
        name = "relu_conv_keep"
        doc = "fuse even though the Conv output is used elsewhere"
        pattern = "Relu(Conv(x, w, b?) as conv)"
        replace = "graphopt.CBR(x, w, b?, attrs=conv, activation='Relu')"
        keep = ["conv"]
    """)
    b = Builder()
    x = b.input("x", [1, 2, 5, 5])
    c = _conv(b, x, 2, 3)
    b.output(b.op("Relu", [c]))
    b.output(b.op("Neg", [c]))
    model = b.model()
    g = from_model(model)
    assert apply_rules(g, rules).counts == {"relu_conv_keep": 1}
    assert sorted(n.op_type for n in g.nodes()) == ["CBR", "Conv", "Neg"]
    g.lint()
    _same_outputs(model, to_model(g))


# -- the fixpoint --------------------------------------------------------------------------------


def test_rules_that_undo_each_other_hit_the_pass_cap(tmp_path):
    ping = _rules(tmp_path, """
        [[rule]]
        name = "ping"
        doc = "Relu -> Sigmoid"
        pattern = "Relu(Neg(x) as n)"
        replace = "Sigmoid(x)"

        [[rule]]
        name = "pong"
        doc = "Sigmoid -> Relu(Neg): written as two rules through Abs, A -> B -> A"
        pattern = "Sigmoid(x)"
        replace = "Relu(x)"

        [[rule]]
        name = "steady"
        doc = "never fires"
        pattern = "Relu(Abs(x))"
        replace = "Relu(x)"
    """)
    b = Builder()
    x = b.input("x", [3])
    b.output(b.op("Relu", [b.op("Neg", [x])]))
    g = from_model(b.model())
    # ping: Relu(Neg(x)) -> Sigmoid(x); pong: Sigmoid(x) -> Relu(x); then ping no longer matches.
    assert apply_rules(g, ping).counts == {"ping": 1, "pong": 1}
    loop = _rules(tmp_path, """
        [[rule]]
        name = "ping"
        doc = "Relu -> Sigmoid"
        pattern = "Relu(x)"
        replace = "Sigmoid(x)"

        [[rule]]
        name = "pong"
        doc = "Sigmoid -> Relu"
        pattern = "Sigmoid(x)"
        replace = "Relu(x)"
    """, "loop.toml")
    with pytest.raises(RuleError) as info:
        apply_rules(g, loop, max_passes=7)
    msg = str(info.value)
    assert "did not converge after 7 passes" in msg and "still firing: ping, pong" in msg and "--disable" in msg


def test_composition_keeps_provenance_of_the_original_nodes():
    b = Builder()
    x, r = b.input("x", [1, 3, 5, 5]), b.input("r", [1, 4, 5, 5])
    c = _conv(b, x, 3, 4)
    b.output(b.op("Relu", [b.op("Add", [c, r])]))
    model = b.model()
    originals = [n.name for n in model.graph.node]
    g = from_model(model)
    report = apply_rules(g, SHIPPED.without(["conv_residual_relu"]))
    assert report.counts == {"cbr_relu": 1, "conv_residual": 1}
    assert [m.rule for m in report.matches] == ["conv_residual", "cbr_relu"]
    (node,) = g.nodes()
    assert node.doc_string == f"graphopt rule=cbr_relu from={','.join(originals)}"
    assert report.matches[-1].sources == tuple(originals)
    # Pass 1: cbr_relu (sorted before conv_residual at equal priority) finds no CBR yet, then
    # conv_residual fires; pass 2: cbr_relu fires; pass 3 changes nothing.
    assert report.passes == 3
    _same_outputs(model, to_model(g))


def _resnetish(blocks: int) -> onnx.ModelProto:
    b = Builder(seed=3)
    x = b.input("x", [1, 4, 6, 6])
    for i in range(blocks):
        h = b.op("Relu", [_conv(b, x, 4, 4)])
        h = _conv(b, h, 4, 4)
        x = b.op("Relu", [b.op("Add", [h, x] if i % 2 else [x, h])])
        x = act_nodes(b, "silu", _conv(b, x, 4, 4, k=1))
    b.output(x)
    return b.model()


def test_deterministic_same_input_same_bytes():
    outs = []
    for _ in range(2):
        g = from_model(_resnetish(4))
        report = apply_rules(g, SHIPPED, explain=True)
        outs.append((serialize(to_model(g)), report.to_dict()))
    assert outs[0] == outs[1]
    assert outs[0][1]["counts"] == {"conv_relu": 4, "conv_residual_relu": 4, "conv_silu": 4}


def test_matching_is_anchored_and_linear(monkeypatch):
    looked, tried = {}, {}

    def counting(calls, real):
        def wrapper(g, pat, node, *rest):
            calls[node.op_type] = calls.get(node.op_type, 0) + 1
            return real(g, pat, node, *rest)
        return wrapper

    monkeypatch.setattr("graphopt.rewrite._engine.could_match", counting(looked, _matcher.could_match))
    monkeypatch.setattr("graphopt.rewrite._engine.match_root", counting(tried, _matcher.match_root))
    blocks = 12
    g = from_model(_resnetish(blocks))
    n_relu = len(g.nodes_by_op("Relu"))
    rules = RuleSet([SHIPPED.get("conv_relu")])
    report = apply_rules(g, rules)
    assert report.counts == {"conv_relu": blocks}
    # Only Relu nodes are ever looked at, once per pass (two passes: one that fires, one that checks),
    # and only those a Conv feeds get the full match: the skeleton check turns the others away.
    assert looked == {"Relu": n_relu + (n_relu - blocks)}
    assert tried == {"Relu": blocks}


def test_a_rule_whose_ops_the_graph_lacks_is_not_tried(monkeypatch):
    looked = []
    monkeypatch.setattr("graphopt.rewrite._engine.could_match", lambda g, pat, node: looked.append(node) or True)
    b = Builder()
    b.output(b.op("Relu", [b.op("Add", [b.input("x", [1, 4]), b.input("r", [1, 4])])]))
    g = from_model(b.model())
    rule = SHIPPED.get("conv_residual_relu")
    assert rule.ops == {("", "Relu"), ("", "Add"), ("", "Conv")}
    assert apply_rules(g, RuleSet([rule])).counts == {} and looked == []  # no Conv: no candidate looked at
    assert apply_rules(g, RuleSet([rule]), explain=True).counts == {}  # explain still tries (near-misses)


def test_could_match_checks_the_op_skeleton_in_any_operand_order():
    b = Builder()
    x, r = b.input("x", [1, 3, 5, 5]), b.input("r", [1, 4, 5, 5])
    b.output(b.op("Relu", [b.op("Add", [r, _conv(b, x, 3, 4)])]))  # the Conv is the second operand
    g = from_model(b.model())
    (relu,) = g.nodes_by_op("Relu")
    assert _matcher.could_match(g, parse_pattern("Relu(Add(Conv(x, w, b?), c))"), relu)
    assert not _matcher.could_match(g, parse_pattern("Relu(Add(MatMul(x, w), c))"), relu)  # a deeper op differs
    assert not _matcher.could_match(g, parse_pattern("Relu(Conv(x, w, b?))"), relu)
    assert not _matcher.could_match(g, parse_pattern("Relu(Add(x, Conv(x, w)))"), relu)  # Conv has 3 inputs


@pytest.mark.parametrize("family", CONV_FAMILIES + GEMM_FAMILIES)
def test_skeleton_check_refuses_no_match(family):
    # explain=True never uses the skeleton check (a failed attempt is a near-miss to report): the
    # rewrites, and so the bytes, must be the same without it.
    fired = 0
    for act in CONV_ACTS if family in CONV_FAMILIES else GEMM_ACTS:
        for variant in ("fires", "second_consumer"):
            model = family_model(family, act, variant)
            out = []
            for explain in (False, True):
                g = from_model(model)
                report = apply_rules(g, SHIPPED, explain=explain)
                out.append((serialize(to_model(g)), report.counts))
            assert out[0] == out[1], (family, act, variant)
            fired += sum(out[0][1].values())
    assert fired


def test_whole_resnetish_model_outputs_match():
    model = _resnetish(3)
    g = from_model(model)
    apply_rules(g, SHIPPED)
    g.lint()
    assert {n.op_type for n in g.nodes()} == {"CBR"}
    out = to_model(g)
    _same_outputs(model, out)


def test_find_matches_does_not_touch_the_graph():
    model = _resnetish(2)
    g = from_model(model)
    before = serialize(to_model(g))
    matches = find_matches(g, SHIPPED)
    assert serialize(to_model(g)) == before
    assert sorted({m.rule for m in matches}) == ["conv_relu", "conv_residual_relu", "conv_silu"]
    assert len(matches) == 6


def test_subgraphs_are_rewritten():
    cnode_w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 2, 1, 1)).astype(np.float32), "wsub")
    then_nodes = [helper.make_node("Conv", ["x", "wsub"], ["tc"], name="then_conv"),
                  helper.make_node("Relu", ["tc"], ["then_out"], name="then_relu")]
    then_g = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, None)], [cnode_w])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["else_out"], name="else_neg")], "else", [],
                               [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, None)])
    main = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], name="if0", then_branch=then_g, else_branch=else_g)], "main",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(main, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    g = from_model(model)
    report = apply_rules(g, SHIPPED)
    assert report.counts == {"conv_relu": 1}
    (sub,) = [s for s in g.graphs() if s.name == "then"]
    assert [n.op_type for n in sub.nodes()] == ["CBR"] and sub.outputs == ["then_out"]
    out = to_model(g)
    x = np.random.default_rng(1).standard_normal((1, 2, 3, 3)).astype(np.float32)
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "x": x}
        np.testing.assert_allclose(run_ort(out, feeds)[0], run_ort(model, feeds)[0], rtol=1e-5, atol=1e-6)


# -- explain -------------------------------------------------------------------------------------


def test_near_miss_names_the_rule_anchor_and_consumers():
    b = Builder()
    x = b.input("x", [1, 3, 5, 5])
    c = _conv(b, x, 3, 4)
    b.output(b.op("Relu", [c]))
    b.output(b.op("Add", [c, b.input("z", [1, 4, 5, 5])]))
    model = b.model()
    relu = next(n.name for n in model.graph.node if n.op_type == "Relu")
    add = next(n.name for n in model.graph.node if n.op_type == "Add")
    g = from_model(model)
    report = apply_rules(g, SHIPPED, explain=True)
    nm = next(n for n in report.near_misses if n.rule == "conv_relu")
    assert nm == NearMiss("conv_relu", relu, f"intermediate {c!r} has 2 consumers ({relu}, {add})")
    assert str(nm) == f"conv_relu at node {relu!r}: intermediate {c!r} has 2 consumers ({relu}, {add})"
    assert report.to_dict()["near_misses"][0].keys() == {"rule", "anchor", "reason"}
    # Without explain there are no near-misses, and the rewrite is the same.
    g2 = from_model(model)
    quiet = apply_rules(g2, SHIPPED)
    assert quiet.near_misses == [] and quiet.counts == report.counts


# -- user extensions -----------------------------------------------------------------------------


def test_rules_module_registers_constraints_on_opt_in(tmp_path, monkeypatch):
    (tmp_path / "my_rule_ext.py").write_text(textwrap.dedent("""
        from graphopt.rewrite import register_constraint

        @register_constraint("is_named", "nv")
        def is_named(g, node, name):
            '''node has the given name.'''
            return None if node.name == name else f"{node.name!r} is not {name!r}"
    """))
    text = """
        [[rule]]
        name = "only_named"
        doc = "d"
        pattern = "Relu(Neg(x) as n)"
        where = ["is_named(n, 'wanted')"]
        replace = "Sigmoid(x)"
    """
    p = tmp_path / "ext.toml"
    p.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuleError, match="unknown constraint is_named"):
        load_rules(shipped=False, paths=[p])
    load_rules_module("my_rule_ext")
    rules = load_rules(shipped=False, paths=[p])
    assert rules.names() == ["only_named"]
    with pytest.raises(RuleError, match="cannot import rules module 'no_such_mod_x'"):
        load_rules_module("no_such_mod_x")
    sys.modules.pop("my_rule_ext", None)


def test_a_crashing_user_constraint_names_the_rule(tmp_path):
    from graphopt.rewrite import register_constraint

    @register_constraint("test_boom", "t")
    def _boom(g, t):
        raise ZeroDivisionError("boom")

    rules = _rules(tmp_path, """
        [[rule]]
        name = "boomer"
        doc = "d"
        pattern = "Relu(Neg(x))"
        where = ["test_boom(x)"]
        replace = "Sigmoid(x)"
    """)
    b = Builder()
    x = b.input("x", [2])
    b.output(b.op("Relu", [b.op("Neg", [x])]))
    with pytest.raises(RuleError, match=r"rule 'boomer': constraint test_boom\(x\) raised ZeroDivisionError: boom"):
        apply_rules(from_model(b.model()), rules)


def test_outer_scope_use_of_an_intermediate_blocks_the_fusion():
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 2, 1, 1)).astype(np.float32), "w")
    then_g = helper.make_graph([helper.make_node("Neg", ["c"], ["t"], name="then_neg")], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"], name="else_abs")], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    main = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("Relu", ["c"], ["y"], name="relu"),
         helper.make_node("If", ["cond"], ["z"], name="if0", then_branch=then_g, else_branch=else_g)], "main",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [w])
    g = from_model(helper.make_model(main, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    report = apply_rules(g, SHIPPED, explain=True)
    assert report.counts == {"conv_alone": 1}  # the Conv alone; the Relu stays apart
    assert NearMiss("conv_relu", "relu", "intermediate 'c' has 2 consumers (relu, if0)") in report.near_misses


def test_value_info_survives_and_shape_like_types_nested_outputs():
    model = family_model("gemm_reshape", "relu")
    inferred = onnx.shape_inference.infer_shapes(model)
    g = from_model(inferred)
    gemm_out = g.nodes_by_op("Gemm")[0].outputs[0]
    relu_out = g.nodes_by_op("Relu")[0].outputs[0]
    gemm_vi, relu_vi = g.value_info(gemm_out), g.value_info(relu_out)
    assert gemm_vi.shape == (3, 5) and relu_vi.shape == (1, 3, 5)
    assert apply_rules(g, SHIPPED).counts == {"gemm_reshape_relu": 1}
    gemm_act, reshape = g.nodes()
    assert (gemm_act.op_type, reshape.op_type) == ("GemmAct", "Reshape")
    assert reshape.outputs == [relu_out] and g.value_info(relu_out) == relu_vi
    assert g.value_info(gemm_act.outputs[0]) == gemm_vi
    _same_outputs(model, to_model(g))
