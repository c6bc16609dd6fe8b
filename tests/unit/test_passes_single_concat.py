"""eliminate_single_concat: a Concat of one input (TorchScript's KV-cache update with an empty past) is a copy
of it and goes, a graph output keeping its name; a Concat of two inputs, or one whose axis is out of range,
stays with the reason."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import check_pass, model, ops, untouched  # noqa: E402

from graphopt.passes import CLEANUP_ORDER, eliminate_single_concat  # noqa: E402


def _cache_update(inputs=("k",), axis=-2, out_is_graph_output=False):
    """Relu(x) -> Concat(inputs, axis) -> Neg (or the Concat as the graph output)."""
    nodes = [h.make_node("Relu", ["x"], ["k"]), h.make_node("Relu", ["x"], ["k2"]),
             h.make_node("Concat", list(inputs), ["cat"], axis=axis)]
    if not out_is_graph_output:
        nodes.append(h.make_node("Neg", ["cat"], ["out"]))
    return model(nodes, [("x", [2, 2, 5, 4])], [("cat" if out_is_graph_output else "out", None)],
                 value_info=[("k", [2, 2, 5, 4]), ("k2", [2, 2, 5, 4])])


def test_a_concat_of_one_input_goes(rng):
    feeds = {"x": rng.standard_normal((2, 2, 5, 4)).astype(np.float32)}
    for axis in (-2, 0, 3):
        _, out = check_pass(eliminate_single_concat, _cache_update(axis=axis), 1, rng=rng, feeds=feeds)
        assert "Concat" not in ops(out)
    _, out = check_pass(eliminate_single_concat, _cache_update(out_is_graph_output=True), 1, rng=rng, feeds=feeds)
    assert [o.name for o in out.graph.output] == ["cat"] and "Concat" not in ops(out)


def test_concats_that_are_not_copies_stay_with_their_reason():
    assert any("a Concat of 2 inputs" in r for r in untouched(eliminate_single_concat, _cache_update(("k", "k2"))))
    # an axis out of range: the loader's shape inference refuses such a model; the pass would keep it too
    from types import SimpleNamespace

    from graphopt.passes.single_concat import _single_reason

    g = SimpleNamespace(value_info=lambda t: SimpleNamespace(shape=(2, 2, 5, 4)))
    node = SimpleNamespace(inputs=["k"], has_attr=lambda a: True, attr=lambda a: 4)
    assert _single_reason(g, node) == "axis 4 is out of range for rank 4"


def test_it_runs_with_the_other_copies_first():
    assert CLEANUP_ORDER.index("eliminate_single_concat") < CLEANUP_ORDER.index("fold_constants")
