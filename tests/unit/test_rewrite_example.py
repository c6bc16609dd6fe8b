"""The worked example of a user rule (the README's "Writing a fusion rule" uses the same text)."""

from __future__ import annotations

import numpy as np

from graphopt.ir import from_model, to_model
from graphopt.rewrite import apply_rules, check_rule_file, load_rules
from graphopt.rewrite.testing import Builder, random_feeds, run_ort

EXAMPLE_RULE = """\
[[rule]]
name = "conv_minmax_relu6"
doc = "Conv -> Max(0) -> Min(6), ReLU6 as some exporters write it  ==>  graphopt.CBR (Clip)"
pattern = "Min(Max(Conv(x, w, b?) as conv, zero), six)"
where = ["const_near(zero, 0.0)", "const_near(six, 6.0)"]
replace = "graphopt.CBR(x, w, b?, attrs=conv, activation='Clip', clip_min=0.0, clip_max=6.0)"
"""


def _model(low: float):
    b = Builder()
    x = b.input("x", [1, 3, 7, 7])
    conv = b.op("Conv", [x, b.rand([4, 3, 3, 3]), b.rand([4], "b")], pads=[1, 1, 1, 1])
    b.output(b.op("Min", [b.const(6.0, "six"), b.op("Max", [conv, b.const(low, "zero")])]))
    return b.model()


def test_worked_example(tmp_path):
    path = tmp_path / "my_rules.toml"
    path.write_text(EXAMPLE_RULE)
    assert check_rule_file(path) == []
    rules = load_rules(paths=[path])  # the shipped rules plus the new one
    model = _model(0.0)
    graph = from_model(model)
    report = apply_rules(graph, rules, explain=True)
    assert report.counts == {"conv_minmax_relu6": 1}
    (node,) = graph.nodes()
    assert (node.op_type, node.attr("activation"), node.attr("clip_max")) == ("CBR", "Clip", 6.0)
    feeds = random_feeds(model)
    np.testing.assert_allclose(run_ort(to_model(graph), feeds)[0], run_ort(model, feeds)[0], rtol=1e-5, atol=1e-6)
    # A Max(x, 1) is not ReLU6: --explain says why the rule did not fire.
    report = apply_rules(from_model(_model(1.0)), rules, explain=True)
    assert report.counts == {"conv_alone": 1}  # only the late rule: the Conv alone becomes a CBR
    (miss,) = [m for m in report.near_misses if m.rule == "conv_minmax_relu6"]
    assert "const_near(zero, 0.0)" in miss.reason and "is 1, expected 0" in miss.reason
