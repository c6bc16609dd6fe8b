"""graphopt.runtime.bench: feeds at a batch size, error rows instead of exceptions, the time budget,
statistics, the top-ops table."""

from __future__ import annotations

import time

import numpy as np
import pytest
from onnx import TensorProto, helper

from graphopt.errors import GraphoptError
from graphopt.runtime import bench as rb


def _model(dims):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims),
                           helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_bench_feeds_set_the_batch_and_respect_shapes():
    feeds = rb.bench_feeds(_model(["N", 3, 5]), 4, {"ids": [4, 7]})
    assert feeds["x"].shape == (4, 3, 5) and feeds["x"].dtype == np.float32
    assert feeds["ids"].shape == (4, 7) and feeds["ids"].dtype == np.int64
    assert rb.bench_feeds(_model(["N", 3]), 2)["ids"].shape == (2, rb.DEFAULT_DIM)
    with pytest.raises(GraphoptError, match="fixed batch dimension 1"):
        rb.bench_feeds(_model([1, 3]), 8)


def test_time_runs_records_errors_and_statistics():
    def boom():
        raise RuntimeError("kernel exploded\nsecond line")

    t = rb.time_runs("x", 2, boom)
    assert t.error == "RuntimeError: kernel exploded" and t.median_ms is None and t.to_dict()["runs"] == 0
    seq = iter([0.001, 0.003, 0.002] + [0.002] * 10)
    t = rb.time_runs("y", 8, lambda: time.sleep(next(seq)), warmup=0, repeats=3)
    assert len(t.times_s) == 3 and t.median_ms == pytest.approx(np.median(t.times_s) * 1e3)
    assert t.throughput == pytest.approx(8 / (t.median_ms / 1e3))
    assert t.p90_ms >= t.median_ms


def test_time_budget_stops_long_rows():
    t = rb.time_runs("slow", 1, lambda: time.sleep(0.05), warmup=0, repeats=100, budget_s=0.12)
    assert 1 <= len(t.times_s) < 10 and "time budget" in t.note


def test_top_ops_sorts_and_shares():
    rows = rb.top_ops({"Conv": 0.003, "Relu": 0.001, "Add": 0.0}, n=2)
    assert rows == [("Conv", pytest.approx(3.0), pytest.approx(75.0)), ("Relu", pytest.approx(1.0), pytest.approx(25.0))]
