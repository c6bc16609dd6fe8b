"""The engine's ``outputs`` key (added for SkipLayerNorm's sum output): the new node takes over the
tensor of a matched intermediate that other nodes read or that is a graph output; the loader's
checks of the key; the cycle check when that tensor feeds something the new node reads."""

from __future__ import annotations

import textwrap

import numpy as np
import onnx
import pytest

from graphopt.errors import RuleError
from graphopt.ir import from_model, to_model
from graphopt.ops import attach_functions
from graphopt.rewrite import apply_rules, check_rule_file, load_rules
from graphopt.rewrite.testing import Builder, random_feeds, run_ort

RULE = """
[[rule]]
name = "skip_ln_taking_sum"
doc = "Add -> graphopt.LayerNorm, the sum becomes output S"
pattern = "graphopt.LayerNorm(Add(a, r) as s, scale, bias?) as ln"
outputs = {outputs}
replace = "graphopt.LayerNorm(a, scale, bias?, r, attrs=ln, sum_output=1)"
"""


def _write(tmp_path, text):
    p = tmp_path / "r.toml"
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def _model(bias_from_sum=False, sum_is_output=True):
    b = Builder(17, seed=11)
    a, r = b.input("a", [2, 3, 8]), b.input("r", [2, 3, 8])
    s = b.op("Add", [a, r])
    bias = b.op("Neg", [b.op("ReduceMean", [s], axes=[0, 1], keepdims=0)]) if bias_from_sum else b.rand([8], "bias")
    y = b.op("LayerNorm", [s, b.rand([8], "scale"), bias], domain="graphopt", epsilon=1e-5)
    b.output(y)
    b.output(b.op("Relu", [s]))
    if sum_is_output:
        b.output(s)
    return b.model()


def test_new_node_takes_over_a_shared_intermediate(tmp_path):
    rules = load_rules(shipped=False, paths=[_write(tmp_path, RULE.format(outputs='["s"]'))])
    model = _model()
    g = from_model(model)
    report = apply_rules(g, rules)
    assert report.counts == {"skip_ln_taking_sum": 1}
    g.lint()
    s = model.graph.node[0].output[0]
    ln = next(n for n in g.nodes() if n.op_type == "LayerNorm")
    assert ln.outputs == [model.graph.output[0].name, s] and len(ln.inputs) == 4
    assert [n.op_type for n in g.nodes()] == ["LayerNorm", "Relu"]
    assert g.outputs == [o.name for o in model.graph.output]  # the sum is still a graph output, same name
    out = attach_functions(to_model(g))
    onnx.checker.check_model(out, full_check=True)
    feeds = random_feeds(model)
    for e, got in zip(run_ort(model, feeds), run_ort(out, feeds)):
        np.testing.assert_allclose(got, e, rtol=1e-5, atol=1e-6)


def test_without_outputs_the_shared_sum_blocks_the_rewrite(tmp_path):
    rules = load_rules(shipped=False, paths=[_write(tmp_path, RULE.format(outputs="[]"))])
    g = from_model(_model())
    report = apply_rules(g, rules, explain=True)
    assert report.counts == {}
    assert "is a graph output" in report.near_misses[0].reason


def test_a_taken_tensor_feeding_the_new_node_is_a_cycle(tmp_path):
    rules = load_rules(shipped=False, paths=[_write(tmp_path, RULE.format(outputs='["s"]'))])
    model = _model(bias_from_sum=True, sum_is_output=False)
    g = from_model(model)
    report = apply_rules(g, rules, explain=True)
    assert report.counts == {}
    (nm,) = report.near_misses
    assert "cannot become an output of the new node" in nm.reason and "(a cycle)" in nm.reason
    g.lint()


@pytest.mark.parametrize("outputs,message", [
    ('["x"]', "outputs entry 'x' is not a node capture"),
    ('["ln"]', "is the pattern's root"),
    ('["s", "s"]', "listed twice"),
    ('"s"', "'outputs' must be a list of node captures"),
])
def test_outputs_key_is_checked(tmp_path, outputs, message):
    path = _write(tmp_path, RULE.format(outputs=outputs))
    issues = check_rule_file(path)
    assert len(issues) == 1 and message in issues[0].message, issues
    assert issues[0].line == 5  # the outputs key's line
    with pytest.raises(RuleError, match="skip_ln_taking_sum"):
        load_rules(shipped=False, paths=[path])


def test_outputs_and_keep_exclude_each_other(tmp_path):
    text = RULE.format(outputs='["s"]') + 'keep = ["s"]\n'
    (issue,) = check_rule_file(_write(tmp_path, text))
    assert "both kept and an extra output" in issue.message
