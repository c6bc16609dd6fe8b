"""Tuning for real on the GPU: every --shape-profile bucket is profiled on the device, the node records
them, the second optimize is served from the tuning cache, and every visible GPU of the model is used.

Small on purpose (one CBR node, two buckets): the kernels themselves are checked in test_cbr_gpu.py.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("cupy")
from _harness import require_device  # noqa: E402

require_device()


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.1, "w"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32) * 0.1, "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32, 12, 12])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _buckets(model: onnx.ModelProto) -> tuple[list[dict], str, str]:
    (node,) = [n for n in model.graph.node if n.domain == "graphopt"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return (json.loads(attrs["lowering_buckets"]), attrs["lowering"].decode(), attrs["lowering_params"].decode())


def test_every_bucket_is_profiled_on_the_gpu_and_the_second_run_is_cached(tmp_path, monkeypatch):
    import graphopt
    from graphopt.tune import buckets as B
    from graphopt.tune.gpus import detect_devices

    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path / "cache"))
    opt, rep = graphopt.optimize(_model(), gpu="auto", shape_profile="x=N:4,1", verify=True)
    assert rep.mode == "profiled", rep.selection_summary
    assert [row["dims"] for row in rep.lowerings] == [{"N": 1}, {"N": 4}]
    for row in rep.lowerings:
        assert row["mode"] == "profiled", row
        ok = [t for t in row["timings"] if t["status"] == "ok"]
        assert ok, row["timings"]
        best = min(ok, key=lambda t: t["ms"])
        chosen = [t for t in ok if (t["lowering"], t["params"]) == (row["lowering"], row["params"])]
        assert chosen, row  # a candidate that passed
        if "instead of the fastest" not in row["reason"]:  # the layout choice (conversions counted) may differ
            assert (row["lowering"], row["params"]) == (best["lowering"], best["params"])
    recorded, lowering, params = _buckets(opt)
    assert [(r["dims"], r["lowering"], r["params"]) for r in recorded] == \
        [(row["dims"], row["lowering"], row["params"]) for row in rep.lowerings]
    assert (lowering, params) == (recorded[-1]["lowering"], recorded[-1]["params"])  # the largest bucket
    assert B.choose(B.encode([(r["dims"], r["lowering"], r["params"]) for r in recorded]), {"N": 3}) == \
        (recorded[1]["lowering"], recorded[1]["params"])
    ndev = len([d for d in detect_devices() if d.normalized == detect_devices()[0].normalized])
    if ndev > 1:
        assert f"x {ndev}: devices" in rep.selection_summary, rep.selection_summary

    opt2, rep2 = graphopt.optimize(_model(), gpu="auto", shape_profile="x=N:1,4")
    assert rep2.mode == "cached", rep2.selection_summary
    assert _buckets(opt2) == _buckets(opt)


@pytest.mark.gpu
def test_the_tuning_timer_spends_its_budget_not_more():
    """``budget_ms``: a launch 10x over the budget is timed a few times, a fast one at full count."""
    cupy = pytest.importorskip("cupy")
    from _harness import require_device

    require_device()
    from graphopt.kernels.timing import _spin_kernel, cuda_event_timer

    spin = _spin_kernel()
    calls = []

    def slow(ins, outs):  # ~ 20M SM clocks: about 10 ms
        calls.append(1)
        spin((1,), (1,), (np.int64(20_000_000),))

    x = cupy.zeros(16, dtype=cupy.float32)
    times = cuda_event_timer(slow, [x], [x.copy()], budget_ms=20.0, spin_cycles=0)
    assert 3 <= len(times) <= 6 and len(calls) <= 8
    fast = cuda_event_timer(lambda ins, outs: cupy.add(ins[0], 1, out=outs[0]), [x], [x.copy()], budget_ms=20.0)
    assert len(fast) == 20
