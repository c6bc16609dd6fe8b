"""The packed-QKV attention rules (rules/attention.toml): GPT-2's Split of one projection and BERT's three
projections of one input become graphopt.Attention(qkv_packed=1) reading [B, S, 3, H, D]; and the
Shape rewrites that free the head splits of dynamic exports (shape_of_split, shape_of_projection,
shape_of_head_split). Positive cases, near misses, and the outputs against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from graphopt.ir import to_model
from graphopt.ops import attach_functions
from graphopt.rewrite import RuleSet, load_rules
from graphopt.rewrite.testing import Builder, random_feeds, rewrite_inferred, run_ort

SHIPPED = load_rules()
PACKED_RULES = ["attention_qkv_packed_gemms", "attention_qkv_packed_split", "shape_of_head_split",
                "shape_of_projection", "shape_of_split"]
B, S, H, D, K = 2, 5, 3, 4, 8
F16 = TensorProto.FLOAT16


def _only(*names):
    return RuleSet([SHIPPED.get(n) for n in names])


_rewrite = rewrite_inferred  # the model with its inferred shapes, as the optimize pipeline sees it


def _same_outputs(model, g, seed=1):
    out = attach_functions(to_model(g))
    onnx.checker.check_model(out, full_check=True)
    feeds = random_feeds(model, seed)
    for e, a in zip(run_ort(model, feeds), run_ort(out, feeds)):
        assert e.shape == a.shape and e.dtype == a.dtype
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=3e-2, atol=3e-2)


def _heads(b, t, name):
    return b.op("Reshape", [t, b.const([B, S, H, D], name, np.int64)])


def _attention(b, q, k, v, **extra):
    m = b.input("m", [B, 1, 1, S], F16)
    return b.op("Attention", [q, k, v, m], domain="graphopt", qkv_bshd=1, mask_kind="additive", scale=0.5, **extra)


def packed_split_model(variant="fires"):
    """x [B, S, 3 * H * D] Split in three on the last axis, each third split into heads, one attention."""
    b = Builder(17, seed=21)
    x = b.input("x", [B, S, 3 * H * D], F16)
    axis = 1 if variant == "axis" else 2
    src = b.op("Transpose", [x], perm=[0, 2, 1]) if variant == "axis" else x
    split = onnx.helper.make_node("Split", [src], ["q3", "k3", "v3"], name="split", axis=axis)
    b.nodes.append(split)
    # variant "axis": [B, 3HD, S] cut on axis 1, each [B, HD, S] third then viewed as [B, S, H, D]
    q, k, v = (_heads(b, t, f"s{i}") for i, t in enumerate(("q3", "k3", "v3")))
    b.output(b.op("Neg", [_attention(b, q, k, v, y_bshd=1)]))
    if variant == "second_consumer":
        b.output(b.op("Neg", ["k3"]))
    return b.model()


def packed_gemms_model(variant="fires"):
    """Three GemmAct projections of one x, each split into heads, one attention (BERT's query/key/value)."""
    b = Builder(17, seed=22)
    rng = np.random.default_rng(5)
    x = b.input("x", [B, S, K], F16)
    outs = []
    for i in range(3):
        w = (b.input("wk", [K, H * D], F16) if variant == "weight_input" and i == 1
             else b.const(rng.standard_normal((K, H * D)) / np.sqrt(K), f"w{i}", np.float16))
        ins = [x, w]
        if variant != "no_bias" and not (variant == "some_bias" and i == 2):
            ins.append(b.const(rng.standard_normal(H * D), f"b{i}", np.float16))
        act = {"activation": "Relu"} if variant == "activation" and i == 1 else {}
        outs.append(b.op("GemmAct", ins, domain="graphopt", mode="matmul", **act))
    q, k, v = (_heads(b, t, f"s{i}") for i, t in enumerate(outs))
    b.output(b.op("Neg", [_attention(b, q, k, v)]))
    if variant == "second_consumer":
        b.output(b.op("Neg", [outs[0]]))
    return b.model()


def shape_of_split_model(variant="fires"):
    b = Builder(17, seed=23)
    x = b.input("x", [B, 6, 3 * H * D])
    b.nodes.append(onnx.helper.make_node("Split", [x], ["p0", "p1", "p2"], name="split", axis=1 if variant == "axis" else -1))
    for p in ("p0", "p1", "p2"):
        b.output(b.op("Neg", [p]))
    b.output(b.op("Shape", ["p1"], **({"start": 1} if variant == "slice" else {})))
    return b.model()


def shape_of_projection_model(variant="fires"):
    b = Builder(17, seed=24)
    x = b.input("x", [B, S, K])
    w = b.input("w", [K, 6]) if variant == "weight_input" else b.const(np.ones((K, 6)), "w")
    y = b.op("GemmAct", [x, w], domain="graphopt", mode="matmul")
    b.output(b.op("Neg", [y]))
    b.output(b.op("Shape", [y]))
    return b.model()


def shape_of_head_split_model(variant="fires"):
    b = Builder(17, seed=25)
    x = b.input("x", [B, S, H * D])
    target = [B * S, 1, H, D] if variant == "leading" else [B, S, H, D]
    r = b.op("Reshape", [x, b.const(target, "t", np.int64)])
    b.output(b.op("Neg", [r]))
    b.output(b.op("Shape", [r]))
    return b.model()


def dynamic_head_split_model(variant="fires"):
    """A dynamic export's head split: the target's B and S read from Shape(x) (or, near miss, from an
    unrelated tensor y with other symbolic dims)."""
    b = Builder(17, seed=26)
    x = b.input("x", ["b", "s", H * D])
    y = b.input("y", ["c", "t", 5])
    src = y if variant == "other_tensor" else x
    shape = b.op("Shape", [src])
    dims = [b.op("Unsqueeze", [b.op("Gather", [shape, b.const(i, f"i{i}", np.int64)], axis=0), b.const([0], f"a{i}", np.int64)])
            for i in (0, 1)]
    target = b.op("Concat", dims + [b.const([H], "h", np.int64), b.const([D], "d", np.int64)], axis=0)
    r = b.op("Reshape", [x, target])
    b.output(b.op("Neg", [r]))
    b.output(b.op("Shape", [r]))
    b.output(b.op("Neg", [y]))
    return b.model()


CASES = {
    "attention_qkv_packed_split": packed_split_model,
    "attention_qkv_packed_gemms": packed_gemms_model,
    "shape_of_split": shape_of_split_model,
    "shape_of_projection": shape_of_projection_model,
    "shape_of_head_split": shape_of_head_split_model,
}


def test_every_packed_rule_has_a_case():
    assert sorted(CASES) == PACKED_RULES
    assert set(PACKED_RULES) <= {r.name for r in SHIPPED}


@pytest.mark.parametrize("name", PACKED_RULES)
def test_rule_fires_alone_and_with_every_rule(name):
    model = CASES[name]()
    g, report = _rewrite(model, _only(name))
    assert report.counts == {name: 1}
    assert g.outputs == [o.name for o in model.graph.output]
    _same_outputs(model, g)
    g_all, report_all = _rewrite(model, SHIPPED)
    assert report_all.counts.get(name) == 1, report_all.counts
    _same_outputs(model, g_all, seed=2)


def test_the_split_goes_and_the_attention_reads_the_packed_projection():
    g, _ = _rewrite(packed_split_model(), _only("attention_qkv_packed_split"))
    from graphopt.passes import dead_code

    dead_code(g)
    (att,) = [n for n in g.nodes() if n.op_type == "Attention"]
    assert (att.attr("qkv_packed"), att.attr("qkv_bshd"), att.attr("y_bshd"), att.attr("scale")) == (1, 1, 1, 0.5)
    assert att.inputs[1:3] == ["", ""] and att.inputs[3] == "m"
    reshape = g.producer(att.inputs[0])
    assert reshape.op_type == "Reshape" and reshape.inputs[0] == "x"
    assert g.constant_value(reshape.inputs[1]).tolist() == [0, 0, 3, H, D]
    assert sorted(n.op_type for n in g.nodes()) == ["Attention", "Neg", "Reshape"]


@pytest.mark.parametrize("variant", ["fires", "no_bias"])
def test_three_projections_become_one_gemm_with_concatenated_weights(variant):
    model = packed_gemms_model(variant)
    g, report = _rewrite(model, _only("attention_qkv_packed_gemms"))
    assert report.counts == {"attention_qkv_packed_gemms": 1}
    (gemm,) = [n for n in g.nodes() if n.op_type == "GemmAct"]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    projections = [n for n in model.graph.node if n.op_type == "GemmAct"]
    w = g.constant_value(gemm.inputs[1])
    np.testing.assert_array_equal(w, np.concatenate([inits[n.input[1]] for n in projections], axis=1))
    if variant == "fires":
        np.testing.assert_array_equal(g.constant_value(gemm.inputs[2]),
                                      np.concatenate([inits[n.input[2]] for n in projections]))
    else:
        assert len([t for t in gemm.inputs if t]) == 2
    _same_outputs(model, g)


NEAR_MISSES = [
    ("attention_qkv_packed_split", lambda: packed_split_model("second_consumer"), "has other consumers"),
    ("attention_qkv_packed_split", lambda: packed_split_model("axis"), "cuts axis 1, not the last one"),
    ("attention_qkv_packed_gemms", lambda: packed_gemms_model("some_bias"), "only some of the projections have a bias"),
    ("attention_qkv_packed_gemms", lambda: packed_gemms_model("activation"), "differ in their attributes"),
    ("attention_qkv_packed_gemms", lambda: packed_gemms_model("weight_input"), "is not a constant 2-D tensor"),
    ("attention_qkv_packed_gemms", lambda: packed_gemms_model("second_consumer"), "has 2 consumers"),
    ("shape_of_split", lambda: shape_of_split_model("axis"), "cuts axis 1, not the last one"),
    ("shape_of_split", lambda: shape_of_split_model("slice"), "takes a slice of the shape (start=1)"),
    ("shape_of_projection", lambda: shape_of_projection_model("weight_input"), "is not a constant"),
    ("shape_of_head_split", lambda: shape_of_head_split_model("leading"), "changes the leading dims"),
    ("shape_of_head_split", lambda: dynamic_head_split_model("other_tensor"), "dim 0 of its target is not provably its input's"),
]


@pytest.mark.parametrize("rule,build,reason", NEAR_MISSES, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(NEAR_MISSES)])
def test_near_miss_is_refused_with_its_reason(rule, build, reason):
    model = build()
    g, report = _rewrite(model, _only(rule), explain=True)
    assert report.counts == {}
    reasons = [nm.reason for nm in report.near_misses if nm.rule == rule]
    assert any(reason in r for r in reasons), reasons
    g_all, report_all = _rewrite(model, SHIPPED)
    assert rule not in report_all.counts
    _same_outputs(model, g_all)


@pytest.mark.parametrize("name", ["shape_of_split", "shape_of_projection", "shape_of_head_split"])
def test_the_shape_rules_nested_nodes_are_typed(name):
    """Every tensor a shape rule makes has the type a whole-model inference gives it (int64 of a known
    length), so re-optimizing the output adds no value_info and stays byte-identical."""
    g, _ = _rewrite(CASES[name](), _only(name))
    made = [n for n in g.nodes() if n.op_type in ("Shape", "Slice", "Gather", "Concat")]
    assert made
    for n in made:
        for t in n.outputs:
            assert g.dtype(t) == TensorProto.INT64 and g.shape(t) is not None and len(g.shape(t)) == 1, (n.op_type, t)


def test_a_dynamic_head_split_reading_its_input_shape_is_proved():
    model = dynamic_head_split_model()
    g, report = _rewrite(model, _only("shape_of_head_split"))
    assert report.counts == {"shape_of_head_split": 1}
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, H * D)).astype(np.float32),
             "y": np.zeros((3, 7, 5), np.float32)}
    out = attach_functions(to_model(g))
    for e, a in zip(run_ort(model, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(a, e)
