"""fold_conv_mul_add: per-channel constant Mul/Div/Add/Sub after a Conv go into W and B."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import check_pass, model, ops, untouched  # noqa: E402

from graphopt.passes import fold_conv_mul_add  # noqa: E402


def _conv_op(rng, op, c_shape, *, conv_first=True, spatial=(5, 7), cin=3, cout=4, group=1, bias=True, c_input=False,
             extra_nodes=(), extra_outputs=(), c_value=None, extra_inits=None):
    k = (3,) * len(spatial)
    inits = {"W": (rng.standard_normal((cout, cin // group) + k) * 0.3).astype(np.float32)}
    conv_inputs = ["x", "W"]
    if bias:
        inits["B"] = rng.standard_normal(cout).astype(np.float32)
        conv_inputs.append("B")
    c = c_value if c_value is not None else rng.uniform(0.5, 2.0, c_shape).astype(np.float32)
    inputs = [("x", [2, cin, *spatial])]
    if c_input:
        inputs.append(("c", list(c.shape)))
    else:
        inits["c"] = c
    inits.update(extra_inits or {})
    operands = ["conv", "c"] if conv_first else ["c", "conv"]
    nodes = [h.make_node("Conv", conv_inputs, ["conv"], group=group), h.make_node(op, operands, ["y"]), *extra_nodes]
    return model(nodes, inputs, [("y", None)] + list(extra_outputs), inits)


@pytest.mark.parametrize(
    "op,c_shape,conv_first",
    [
        ("Mul", (1, 4, 1, 1), True),
        ("Mul", (4, 1, 1), False),
        ("Mul", (), True),
        ("Mul", (1,), False),
        ("Add", (1, 4, 1, 1), False),
        ("Add", (4, 1, 1), True),
        ("Add", (), True),
        ("Div", (4, 1, 1), True),
        ("Sub", (1, 4, 1, 1), True),
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_per_channel_constant_folds(rng, op, c_shape, conv_first, bias):
    m = _conv_op(rng, op, c_shape, conv_first=conv_first, bias=bias)
    _, out = check_pass(fold_conv_mul_add, m, 1, rng=rng)
    assert ops(out) == ["Conv"] and out.graph.node[0].output[0] == "y"


def test_conv1d_grouped(rng):
    m = _conv_op(rng, "Mul", (6, 1), spatial=(11,), cin=4, cout=6, group=2)
    check_pass(fold_conv_mul_add, m, 1, rng=rng)


def test_chain_mul_then_add_folds_both(rng):
    c2 = rng.standard_normal((4, 1, 1)).astype(np.float32)
    m = _conv_op(rng, "Mul", (1, 4, 1, 1), extra_nodes=[h.make_node("Add", ["y", "c2"], ["z"])], extra_outputs=[("z", None)], extra_inits={"c2": c2})
    m.graph.output.pop(0)  # only z is an output: y becomes internal
    _, out = check_pass(fold_conv_mul_add, m, 2, rng=rng)
    assert ops(out) == ["Conv"]


def test_near_misses(rng):
    cases = {
        # [1,1,H,W] varies over space, [C] over the last axis (W == C here), [2,C,1,1] over the batch
        "not per-channel": _conv_op(rng, "Mul", (1, 1, 3, 5)),
        "does not broadcast along the 4 channels": _conv_op(rng, "Add", (4,), spatial=(5, 6)),
        "along the 4 channels only": _conv_op(rng, "Mul", (2, 4, 1, 1)),
        "exceeds the Conv output rank": _conv_op(rng, "Mul", (1, 1, 4, 1, 1)),
        "is not a constant": _conv_op(rng, "Mul", (1, 4, 1, 1), c_input=True),
        "another consumer": _conv_op(rng, "Mul", (1, 4, 1, 1), extra_nodes=[h.make_node("Relu", ["conv"], ["r"])], extra_outputs=[("r", None)]),
        "graph output": _conv_op(rng, "Add", (1, 4, 1, 1), extra_outputs=[("conv", None)]),
        "has a zero": _conv_op(rng, "Div", (4, 1, 1), c_value=np.array([1, 2, 0, 3], np.float32).reshape(4, 1, 1)),
    }
    for expected, m in cases.items():
        reasons = untouched(fold_conv_mul_add, m)
        assert any(expected in r for r in reasons), (expected, reasons)


def test_constant_minus_conv_is_not_folded(rng):
    # c - conv is not conv - c; Sub/Div are folded only with the Conv on the left.
    untouched(fold_conv_mul_add, _conv_op(rng, "Sub", (1, 4, 1, 1), conv_first=False))
    untouched(fold_conv_mul_add, _conv_op(rng, "Div", (1, 4, 1, 1), conv_first=False))
