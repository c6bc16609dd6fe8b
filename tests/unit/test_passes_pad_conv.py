"""fold_pad_into_conv: zero constant Pad of spatial axes -> Conv pads; near-misses stay."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import check_pass, model, ops, untouched  # noqa: E402

from graphopt.passes import fold_pad_into_conv  # noqa: E402


def _pad_conv(rng, pads, *, opset=17, mode="constant", value=None, axes=None, spatial=(6, 7), conv_attrs=None, extra_nodes=(),
              extra_outputs=(), group=1, cin=4, cout=6):
    rank = 2 + len(spatial)
    inits = {"W": (rng.standard_normal((cout, cin // group) + (3,) * len(spatial)) * 0.3).astype(np.float32)}
    if opset < 11:
        pad = h.make_node("Pad", ["x"], ["p"], mode=mode, pads=pads, **({"value": value} if value is not None else {}))
    else:
        inits["pads"] = np.array(pads, np.int64)
        pad_inputs = ["x", "pads"]
        if value is not None or axes is not None:
            pad_inputs.append("cv" if value is not None else "")
            if value is not None:
                inits["cv"] = np.array(value, np.float32)
        if axes is not None:
            pad_inputs.append("axes")
            inits["axes"] = np.array(axes, np.int64)
        pad = h.make_node("Pad", pad_inputs, ["p"], mode=mode)
    conv = h.make_node("Conv", ["p", "W"], ["y"], group=group, **(conv_attrs or {}))
    assert rank
    return model([pad, conv, *extra_nodes], [("x", [2, cin, *spatial])], [("y", None)] + list(extra_outputs), inits, opset=opset)


@pytest.mark.parametrize(
    "pads,opset,axes,conv_attrs",
    [
        ([0, 0, 1, 2, 0, 0, 3, 1], 17, None, {}),
        ([0, 0, 1, 1, 0, 0, 1, 1], 13, None, {"pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2]}),
        ([0, 0, 2, 0, 0, 0, 1, 3], 10, None, {"strides": [2, 2]}),
        ([2, 1, 0, 3], 18, [2, 3], {"pads": [0, 1, 1, 0]}),
        ([1, 2, 0, 1], 18, [-1, -2], {}),
        ([0, 0, 1, 0, 0, 0, 2, 1], 17, None, {"auto_pad": "VALID", "strides": [2, 1]}),
    ],
)
def test_pad_folds(rng, pads, opset, axes, conv_attrs):
    m = _pad_conv(rng, pads, opset=opset, axes=axes, conv_attrs=conv_attrs)
    _, out = check_pass(fold_pad_into_conv, m, 1, rng=rng)
    assert ops(out) == ["Conv"]


def test_pad_folds_1d_grouped_with_explicit_zero_value(rng):
    m = _pad_conv(rng, [0, 0, 2, 0, 0, 5], spatial=(9,), value=0.0, group=2)
    check_pass(fold_pad_into_conv, m, 1, rng=rng)


def test_near_misses(rng):
    cases = {
        "'reflect'": _pad_conv(rng, [0, 0, 1, 1, 0, 0, 1, 1], mode="reflect"),
        "'edge'": _pad_conv(rng, [0, 0, 1, 1, 0, 0, 1, 1], opset=10, mode="edge"),
        "not 0": _pad_conv(rng, [0, 0, 1, 1, 0, 0, 1, 1], value=1.5),
        "batch or channel": _pad_conv(rng, [0, 1, 1, 1, 0, 0, 1, 1], cin=3),
        "negative": _pad_conv(rng, [0, 0, 2, 1, 0, 0, -1, 1]),
        "auto_pad": _pad_conv(rng, [0, 0, 1, 1, 0, 0, 1, 1], conv_attrs={"auto_pad": "SAME_UPPER"}),
        "another consumer": _pad_conv(rng, [0, 0, 1, 1, 0, 0, 1, 1], extra_nodes=[h.make_node("Relu", ["p"], ["r"])], extra_outputs=[("r", None)]),
        "graph output": _pad_conv(rng, [0, 0, 1, 1, 0, 0, 1, 1], extra_outputs=[("p", None)]),
    }
    for expected, m in cases.items():
        reasons = untouched(fold_pad_into_conv, m)
        assert any(expected in r for r in reasons), (expected, reasons)
