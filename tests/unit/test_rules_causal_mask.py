"""attention_causal_mask: a graphopt.Attention whose mask is a constant causal mask (transformers' decoder
exports with static shapes fold it: an additive [B, 1, S, S] of 0 and the dtype's minimum) becomes causal=1
without the mask; near-misses (a runtime mask, a padding mask folded in, a finite fill, a mask broadcast over
the query rows, a bool mask with a finite mask_value) keep it, with the reason; the rewritten graph computes
what the original did under onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.ir import to_model
from graphopt.ops import attach_functions, get_schema
from graphopt.rewrite import RuleSet, load_rules
from graphopt.rewrite.testing import Builder, random_feeds, rewrite_inferred, run_ort

RULE = "attention_causal_mask"
SHIPPED = load_rules()
B, H, SQ, SKV, D = 2, 3, 5, 7, 4


def causal_model(kind="additive", variant="fires", fp16=False, packed=False):
    """One graphopt.Attention reading a constant mask [B, 1, SQ, SKV] (top-left causal unless ``variant`` says)."""
    elem, np_t = (TensorProto.FLOAT16, np.float16) if fp16 else (TensorProto.FLOAT, np.float32)
    b = Builder(17, seed=21)
    skv = SQ if packed else SKV  # packed: self-attention
    future = np.arange(skv)[None, :] > np.arange(SQ)[:, None]
    keep = np.broadcast_to(~future, (B, 1, SQ, skv)).copy()
    if variant == "padding":  # batch entry 1 also masks key 2 from query 3 on: not the causal mask alone
        keep[1, :, 3:, 2] = False
    attrs = {}
    if kind == "bool":
        mask = b.const(keep, "m", np.bool_)
        if variant == "finite_fill":
            attrs["mask_value"] = -1e4
    else:
        low = {"finite_fill": -1e4}.get(variant, float(np.finfo(np_t).min) if variant != "inf" else -math.inf)
        value = np.where(keep, 0.0, low)
        if variant == "rows_broadcast":
            value = value[:, :, -1:, :]  # [B, 1, 1, SKV]: every query row sees the same keys
        mask = b.input("m", list(value.shape), elem) if variant == "runtime" else b.const(value, "m", np_t)
    if packed:
        qkv = b.input("qkv", [B, SQ, 3, H, D], elem)
        ins = [qkv, "", "", mask]
        attrs.update(qkv_bshd=1, qkv_packed=1)
    else:
        ins = [b.input("q", [B, H, SQ, D], elem), b.input("k", [B, H, SKV, D], elem), b.input("v", [B, H, SKV, D], elem), mask]
    b.output(b.op("Attention", ins, domain="graphopt", mask_kind=kind, scale=0.5, **attrs))
    return b.model()


_rewrite = rewrite_inferred  # the model with its inferred shapes, as the optimize pipeline sees it


def _same_outputs(model, g, fp16=False):
    out = attach_functions(to_model(g))
    onnx.checker.check_model(out, full_check=True)
    feeds = random_feeds(model, 3)
    tol = 3e-2 if fp16 else 1e-5
    for e, a in zip(run_ort(attach_functions(model), feeds), run_ort(out, feeds)):
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("kind,variant,fp16", [("additive", "fires", False), ("additive", "inf", False),
                                               ("additive", "fires", True), ("bool", "fires", False)])
def test_constant_causal_mask_becomes_causal(kind, variant, fp16):
    model = causal_model(kind, variant, fp16)
    for rules in (RuleSet([SHIPPED.get(RULE)]), SHIPPED):
        g, report = _rewrite(model, rules)
        assert report.counts == {RULE: 1}, report.counts
        (node,) = g.nodes()
        assert (node.attr("causal"), node.attr("mask_kind"), node.attr("mask_value"), len(node.inputs)) == (1, "none", None, 3)
        assert node.attr("scale") == 0.5  # the other attributes are kept
        _same_outputs(model, g, fp16)


def test_packed_attention_keeps_its_absent_k_and_v():
    """GPT-2's packed form (K and V absent): the op's reference gives the same output before and after."""
    model = causal_model(packed=True)
    g, report = _rewrite(model, RuleSet([SHIPPED.get(RULE)]))
    (node,) = g.nodes()
    assert report.counts == {RULE: 1} and node.inputs == [model.graph.input[0].name] and node.attr("qkv_packed") == 1
    schema = get_schema("Attention")
    before = model.graph.node[0]
    mask = numpy_helper.to_array(model.graph.initializer[0])
    qkv = np.random.default_rng(4).standard_normal((B, SQ, 3, H, D))
    attrs = {a.name: helper.get_attribute_value(a) for a in before.attribute}
    want = schema.reference([qkv, None, None, mask], {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()})
    got = schema.reference([qkv], node.attrs_dict())
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


@pytest.mark.parametrize("kind,variant,reason", [
    ("additive", "runtime", "is not a constant"),
    ("additive", "padding", "is not 0 everywhere at or below the diagonal"),
    ("additive", "finite_fill", "does not mask a score exactly as causal=1 does"),
    ("additive", "rows_broadcast", "does not give each query row its own keys"),
    ("bool", "padding", "is not the causal mask"),
    ("bool", "finite_fill", "mask_value=-10000 adds a finite score"),
])
def test_near_misses_keep_the_mask(kind, variant, reason):
    model = causal_model(kind, variant)
    g, report = _rewrite(model, RuleSet([SHIPPED.get(RULE)]), explain=True)
    assert report.counts == {}
    assert any(reason in m.reason for m in report.near_misses if m.rule == RULE), [m.reason for m in report.near_misses]
    (node,) = g.nodes()
    assert node.attr("mask_kind") == kind and len(node.inputs) == 4
