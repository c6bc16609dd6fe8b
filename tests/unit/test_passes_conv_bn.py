"""fold_conv_bn: Conv + inference BatchNormalization -> one Conv; near-misses stay."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import check_pass, model, ops, untouched  # noqa: E402

from graphopt.passes import fold_conv_bn  # noqa: E402


def _bn_params(rng, m):
    return {
        "scale": rng.uniform(0.5, 2.0, m).astype(np.float32),
        "shift": rng.standard_normal(m).astype(np.float32),
        "mean": rng.standard_normal(m).astype(np.float32),
        "var": rng.uniform(0.1, 3.0, m).astype(np.float32),
    }


def _conv_bn(rng, *, spatial=(7, 5), cin=6, cout=4, group=1, bias=True, kernel=3, bn_attrs=None, extra_nodes=(), extra_outputs=(),
             opset=17, w_input=False, bn_outputs=("y",), const_overrides=None):
    k = (kernel,) * len(spatial)
    inits = {"W": (rng.standard_normal((cout, cin // group) + k) * 0.3).astype(np.float32), **_bn_params(rng, cout)}
    conv_inputs = ["x", "W"]
    if bias:
        inits["B"] = rng.standard_normal(cout).astype(np.float32)
        conv_inputs.append("B")
    inits.update(const_overrides or {})
    inputs = [("x", [2, cin, *spatial])]
    if w_input:
        inputs.append(("W", list(inits.pop("W").shape)))
    pads = [1] * (2 * len(spatial))
    nodes = [
        h.make_node("Conv", conv_inputs, ["c"], group=group, pads=pads, strides=[1] * len(spatial)),
        h.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], list(bn_outputs), epsilon=1e-3, **(bn_attrs or {})),
        *extra_nodes,
    ]
    return model(nodes, inputs, [("y", None)] + list(extra_outputs), inits, opset=opset)


@pytest.mark.parametrize(
    "spatial,cin,cout,group,bias",
    [((7, 5), 6, 4, 1, True), ((9, 11), 3, 5, 1, False), ((13,), 4, 6, 2, True), ((6, 7), 8, 8, 8, True), ((5, 3), 6, 9, 3, False)],
)
def test_conv_bn_folds(rng, spatial, cin, cout, group, bias):
    m = _conv_bn(rng, spatial=spatial, cin=cin, cout=cout, group=group, bias=bias)
    _, out = check_pass(fold_conv_bn, m, 1, rng=rng)
    assert ops(out) == ["Conv"]
    conv = out.graph.node[0]
    assert conv.output[0] == "y" and len(conv.input) == 3
    assert "fold_conv_bn" in conv.doc_string


def test_conv_bn_opset9_with_unused_extra_outputs_folds(rng):
    m = _conv_bn(rng, opset=9)
    check_pass(fold_conv_bn, m, 1, rng=rng)


def test_conv_bn_near_misses(rng):
    cases = {
        "training_mode=1": _conv_bn(rng, opset=15, bn_attrs={"training_mode": 1}, bn_outputs=("y", "rm", "rv")),
        "another consumer": _conv_bn(rng, extra_nodes=[h.make_node("Relu", ["c"], ["r"])], extra_outputs=[("r", None)]),
        "graph output": _conv_bn(rng, extra_outputs=[("c", None)]),
        "weight 'W' is not a constant": _conv_bn(rng, w_input=True),
        "spatial=0": _conv_bn(rng, opset=7, bn_attrs={"spatial": 0}, const_overrides={}),
    }
    for expected, m in cases.items():
        reasons = untouched(fold_conv_bn, m)
        assert any(expected in r for r in reasons), (expected, reasons)


def test_conv_bn_non_constant_scale_stays(rng):
    m = _conv_bn(rng)
    # Make "scale" a graph input (its initializer then is only a default, not a constant).
    m.graph.input.append(h.make_tensor_value_info("scale", 1, [4]))
    reasons = untouched(fold_conv_bn, m)
    assert "scale 'scale' is not a constant" in reasons[0]


def test_conv_bn_training_outputs_used_stays(rng):
    m = _conv_bn(rng, opset=15, bn_attrs={"training_mode": 1}, bn_outputs=("y", "rm", "rv"), extra_outputs=[("rm", None)])
    reasons = untouched(fold_conv_bn, m)
    assert "running mean/var" in reasons[0]
