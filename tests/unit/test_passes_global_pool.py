"""reduce_to_global_pool: the dynamo exporter's ReduceMean over every spatial axis becomes GlobalAveragePool
(ReduceMax: GlobalMaxPool), with the same outputs; near-misses (a LayerNorm's last-axis mean, keepdims=0,
some spatial axes only, runtime axes, integers, unknown rank) stay with their reason."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import check_pass, model, ops, untouched  # noqa: E402

from graphopt.passes import reduce_to_global_pool  # noqa: E402


def _reduce(op="ReduceMean", axes=(-1, -2), shape=(2, 3, 5, 7), opset=18, keepdims=1, elem=TensorProto.FLOAT,
            axes_name="ax", y_out=False):
    """x -> Reduce(axes, keepdims) -> (Relu ->) y; opset 18 takes the axes as an input, earlier ones as an attribute."""
    attrs = {"keepdims": keepdims}
    inits = {}
    if opset >= 18:
        inputs = ["x", axes_name] if axes is not None else ["x"]
        if axes is not None and axes_name == "ax":
            inits["ax"] = np.array(axes, np.int64)
    else:
        inputs = ["x"]
        if axes is not None:
            attrs["axes"] = list(axes)
    nodes = [h.make_node(op, inputs, ["m" if not y_out else "y"], **attrs)]
    if not y_out:
        nodes.append(h.make_node("Relu", ["m"], ["y"]))
    graph_inputs = [("x", list(shape), elem)] + ([("ax", [len(axes)], TensorProto.INT64)] if axes_name != "ax" else [])
    return model(nodes, graph_inputs, [("y", None, elem)], inits, opset=opset)


@pytest.mark.parametrize("op, pool", [("ReduceMean", "GlobalAveragePool"), ("ReduceMax", "GlobalMaxPool")])
@pytest.mark.parametrize("opset", [13, 17, 18, 20])
def test_a_reduction_over_every_spatial_axis_is_a_global_pool(op, pool, opset, rng):
    for axes, shape in (((-1, -2), (2, 3, 5, 7)), ((2, 3), (1, 4, 6, 6)), ((4, 2, 3), (2, 3, 4, 5, 3))):
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        _, out = check_pass(reduce_to_global_pool, _reduce(op, axes, shape, opset), 1, feeds=feeds)
        assert ops(out) == [pool, "Relu"]


def test_a_graph_output_keeps_its_name_and_fp16_folds(rng):
    feeds = {"x": rng.standard_normal((2, 3, 4, 4)).astype(np.float16)}
    _, out = check_pass(reduce_to_global_pool, _reduce(elem=TensorProto.FLOAT16, shape=(2, 3, 4, 4), y_out=True), 1,
                        feeds=feeds, rtol=1e-3, atol=1e-3)
    assert ops(out) == ["GlobalAveragePool"] and [o.name for o in out.graph.output] == ["y"]


@pytest.mark.parametrize("kwargs, why", [
    (dict(axes=(-1,), shape=(2, 8, 16)), "rank"),                   # a LayerNorm's mean over the last axis
    (dict(axes=(2,), shape=(2, 8, 16)), "rank"),
    (dict(keepdims=0), "keepdims=0"),
    (dict(axes=(-1,)), "not every spatial axis"),                   # one of two spatial axes
    (dict(axes=(1, 2, 3)), "not every spatial axis"),               # channels too
    (dict(axes=None), "reduces over all axes"),                     # every axis
    (dict(axes=None, opset=17), "reduces over all axes"),
    (dict(axes_name="runtime"), "not a constant"),
    (dict(elem=TensorProto.INT32), "not float16, float or double"),
])
def test_near_misses_stay_with_their_reason(kwargs, why):
    reasons = untouched(reduce_to_global_pool, _reduce(**kwargs))
    assert any(why in r for r in reasons), reasons


def test_an_unknown_rank_stays():
    m = _reduce()
    m.graph.input[0].type.tensor_type.ClearField("shape")
    del m.graph.output[0].type.tensor_type.shape.dim[:]
    m.graph.output[0].type.tensor_type.ClearField("shape")
    reasons = untouched(reduce_to_global_pool, m)
    assert any("rank" in r for r in reasons), reasons
