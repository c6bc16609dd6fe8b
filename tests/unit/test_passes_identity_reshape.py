"""eliminate_identity_reshape: a Reshape whose target is its input's own dims (read through Shape,
Gather, Unsqueeze, Concat and constants) goes; one that could change the shape stays, with the reason."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import check_pass, model, ops, untouched  # noqa: E402

from graphopt.passes import eliminate_identity_reshape  # noqa: E402

I64 = TensorProto.INT64


def _sdpa_tail(dims=("g0", "m1", "c128", "c64"), allowzero=0, x_shape=("batch", 12, 128, 64)):
    """Relu(x) -> Reshape(., Concat(dims)) -> Neg, the target built as the SDPA export builds it."""
    inits = {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "ax": np.array([0], np.int64),
             "m1": np.array([-1], np.int64), "c12": np.array([12], np.int64), "c128": np.array([128], np.int64),
             "c64": np.array([64], np.int64), "c0": np.array([0], np.int64), "c99": np.array([99], np.int64)}
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Shape", ["r"], ["s"]),
             h.make_node("Gather", ["s", "i0"], ["g0s"], axis=0), h.make_node("Unsqueeze", ["g0s", "ax"], ["g0"]),
             h.make_node("Gather", ["s", "i1"], ["g1s"], axis=0), h.make_node("Unsqueeze", ["g1s", "ax"], ["g1"]),
             h.make_node("Concat", list(dims), ["target"], axis=0),
             h.make_node("Reshape", ["r", "target"], ["y"], allowzero=allowzero), h.make_node("Neg", ["y"], ["out"])]
    return model(nodes, [("x", list(x_shape))], [("out", None)], inits,
                 value_info=[("r", list(x_shape))])


def _feeds(rng):
    return {"x": rng.standard_normal((2, 12, 128, 64)).astype(np.float32)}


def test_the_sdpa_exports_reshape_to_its_own_shape_goes(rng):
    for dims in (("g0", "m1", "c128", "c64"), ("g0", "g1", "c128", "m1"), ("c0", "c12", "m1", "c64")):
        _, out = check_pass(eliminate_identity_reshape, _sdpa_tail(dims), 1, rng=rng, feeds=_feeds(rng))
        assert "Reshape" not in ops(out)


def test_reshapes_that_may_change_the_shape_stay_with_their_reason():
    cases = [(("g1", "m1", "c128", "c64"), 0, "dim 0 of its target"),       # dims out of order
             (("g0", "m1", "c99", "c64"), 0, "dim 2 of its target"),         # a different static dim
             (("g0", "m1", "m1", "c64"), 0, "more than one -1"),
             (("g0", "m1", "c128"), 0, "has 3 dims"),
             (("c0", "c12", "m1", "c64"), 1, "dim 0 of its target")]          # allowzero: 0 is a real 0
    for dims, allowzero, why in cases:
        assert any(why in r for r in untouched(eliminate_identity_reshape, _sdpa_tail(dims, allowzero))), (dims, why)


def test_a_gather_of_a_2d_constant_is_not_a_list_of_dims():
    """Gather(C [2, 2], 0) is C's first row, two values: read as one term it made [6, 1, 4] look like x's [6, 4]."""
    from onnx import helper as oh

    nodes = [oh.make_node("Relu", ["x"], ["r"]), oh.make_node("Gather", ["c2", "i0"], ["row"], axis=0),
             oh.make_node("Concat", ["row", "c4"], ["target"], axis=0), oh.make_node("Reshape", ["r", "target"], ["y"])]
    m = model(nodes, [("x", [6, 4])], [("y", None)],
              {"c2": np.array([[6, 1], [0, 0]], np.int64), "i0": np.array(0, np.int64), "c4": np.array([4], np.int64)},
              value_info=[("r", [6, 4])])
    assert untouched(eliminate_identity_reshape, m)
