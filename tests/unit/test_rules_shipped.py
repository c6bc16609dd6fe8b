"""Every shipped Conv/Gemm rule (rules/conv.toml, rules/gemm.toml): it fires, its near-misses are refused with
the reason, and the rewritten model computes what the original did under onnxruntime (CPU)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graphopt.ir import from_model, to_model
from graphopt.rewrite import RuleSet, apply_rules, load_rules
from graphopt.rewrite.testing import CONV_ACTS, GEMM_ACTS, family_model, random_feeds, run_ort

SHIPPED = load_rules()

# rule name -> (family the test graph is built from, activation)
CASES: dict[str, tuple[str, str | None]] = {"conv_residual": ("conv_residual", None), "matmul_bias": ("matmul_add", None)}
for _act in CONV_ACTS:
    for _fam in ("conv", "conv_add", "conv_residual", "cbr", "bn"):
        CASES[f"{_fam}_{_act}"] = (_fam, _act)
for _act in GEMM_ACTS:
    for _fam in ("matmul", "matmul_add", "gemm", "gemm_reshape", "gemmact"):
        CASES[f"{_fam}_{_act}"] = (_fam, _act)
WITH_BIAS = sorted(n for n, (fam, _) in CASES.items() if fam in ("conv_add", "matmul_add"))


def _only(name: str) -> RuleSet:
    return RuleSet([SHIPPED.get(name)])


def _rewrite(model: onnx.ModelProto, rules: RuleSet, explain: bool = False):
    g = from_model(model)
    report = apply_rules(g, rules, explain=explain)
    g.lint()
    return g, report


# the late single-node rules and the CBR- / GemmAct-composing ones, tested in tests/unit/test_rules_late.py
SEPARATE = {"conv_alone", "cbr_residual", "gemm_alone", "matmul_alone", "gemmact_scale"}


def test_every_shipped_rule_has_a_test_case():
    # The transformer rule files (norm, gelu, attention) are covered by tests/unit/test_rules_transformer.py.
    assert sorted(list(CASES) + list(SEPARATE)) == sorted(r.name for r in SHIPPED if r.file.endswith(("conv.toml", "gemm.toml")))


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_fires_and_outputs_match(name):
    family, act = CASES[name]
    model = family_model(family, act)
    # Alone: exactly this rule fires, once, and provenance names every original node it replaced.
    g, report = _rewrite(model, _only(name))
    assert report.counts == {name: 1}
    (match,) = report.matches
    doc = f"graphopt rule={name} from={','.join(match.sources)}"
    assert g.node(match.node).outputs == [o.name for o in model.graph.output[:1]]
    assert [n.doc_string for n in g.nodes()] == [doc] * len(g)  # only new nodes are left, all with provenance
    assert [n.op_type for n in g.nodes() if n.domain == "graphopt"] in (["CBR"], ["GemmAct"])
    original = [n.name for n in model.graph.node]
    assert set(match.sources) == set(original) and len(match.sources) >= 2
    assert g.outputs == [o.name for o in model.graph.output]
    # With every shipped rule the graph ends the same way.
    g_all, report_all = _rewrite(model, SHIPPED)
    assert [n.op_type for n in g_all.nodes()] == [n.op_type for n in g.nodes()] and report_all.total >= 1
    # Same outputs under onnxruntime, and the saved model is valid (full check).
    out = to_model(g_all)
    from graphopt.ops import attach_functions

    checked = attach_functions(out)
    onnx.checker.check_model(checked, full_check=True)
    feeds = random_feeds(model)
    expected = run_ort(model, feeds)
    actual = run_ort(out, feeds)
    for e, a in zip(expected, actual):
        assert e.shape == a.shape
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant,reason", [("second_consumer", "consumers ("), ("graph_output", "is a graph output")])
@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_refuses_shared_intermediates(name, variant, reason):
    family, act = CASES[name]
    model = family_model(family, act, variant)
    g, report = _rewrite(model, _only(name), explain=True)
    assert report.counts == {}
    assert len(g) == len(model.graph.node)
    root = next(n.name for n in model.graph.node if model.graph.output[0].name in n.output)
    at_root = [nm for nm in report.near_misses if nm.anchor == root]
    assert [nm.rule for nm in at_root] == [name]
    assert "intermediate" in at_root[0].reason and reason in at_root[0].reason, at_root[0]


@pytest.mark.parametrize("variant,reason", [("bias_not_per_channel", "not per-"), ("bias_not_constant", "is not a constant")])
@pytest.mark.parametrize("name", WITH_BIAS)
def test_rule_refuses_bad_bias(name, variant, reason):
    family, act = CASES[name]
    model = family_model(family, act, variant)
    g, report = _rewrite(model, _only(name), explain=True)
    assert report.counts == {}
    root = next(n.name for n in model.graph.node if model.graph.output[0].name in n.output)
    (nm,) = [nm for nm in report.near_misses if nm.anchor == root]
    assert nm.rule == name and reason in nm.reason, nm
    # The full rule set never fuses such an Add as a bias (a non-constant one may become a residual).
    g_all, report_all = _rewrite(model, SHIPPED)
    assert not any(r.startswith(("conv_add", "matmul_add", "matmul_bias")) for r in report_all.counts)
    feeds = random_feeds(model)
    for e, a in zip(run_ort(model, feeds), run_ort(to_model(g_all), feeds)):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)
