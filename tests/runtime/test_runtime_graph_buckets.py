"""CUDA graphs for dynamic shapes, the bookkeeping (fake CuPy, whose capture is replaced by a recorder):
one graph per distinct input shape, captured on its second run and replayed after, up to the bound;
past it, eager with the reason in graph_status; the --shape-profile bucket each graph serves."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from graphopt.errors import UsageError


def _dynamic_model(buckets: list | None = None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    if buckets is not None:  # a graphopt node that records per-bucket lowerings (never run here)
        sub = helper.make_node("RMSNorm", ["x", "x"], ["unused"], domain="graphopt",
                               lowering_buckets=json.dumps(buckets))
        nodes.append(sub)
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("graphopt", 1)])


class _Recorder:
    """Stands in for graphs.CapturedRun: "captures" by remembering the plan, "replays" by running it."""

    captured: list = []

    def __init__(self, plan):
        self.plan = plan
        self.replays = 0

    @classmethod
    def capture(cls, plan, feeds, backend):
        rec = cls(plan)
        cls.captured.append(tuple(a.shape for a in feeds.values()))
        return rec

    copies: list = []

    def replay(self, feeds, stream=None, copy=True):
        self.replays += 1
        type(self).copies.append(copy)
        return [o.copy() for o in self.plan.execute(feeds)]


@pytest.fixture()
def recorder(fake_cuda, monkeypatch):
    from graphopt.runtime import session

    _Recorder.captured, _Recorder.copies = [], []
    monkeypatch.setattr(session, "CapturedRun", _Recorder)
    return _Recorder


def test_one_graph_per_shape_up_to_the_bound_then_eager_with_the_reason(recorder):
    from graphopt.runtime import Session, to_numpy

    sess = Session(_dynamic_model(), device="cuda", max_graphs=2)
    rng = np.random.default_rng(0)
    for batch in (1, 1, 2, 2, 1, 3, 3):
        x = rng.standard_normal((batch, 8)).astype(np.float32)
        got = to_numpy(sess.run({"x": x})["y"])
        np.testing.assert_array_equal(got, -np.maximum(x, 0))
        status = sess.graph_status
    assert recorder.captured == [((1, 8),), ((2, 8),)]  # each on its second run, batch 3 never
    assert status.startswith("eager: 2 CUDA graphs captured, the session's bound (max_graphs=2)"), status
    assert "x 3x8 runs eagerly" in status
    x = np.ones((2, 8), np.float32)
    sess.run({"x": x})
    assert sess.graph_status == "replaying a CUDA graph"
    summary = sess.plan_summary()["cuda_graphs"]
    assert summary["captured"] == 2 and summary["max_graphs"] == 2


def test_the_bound_defaults_to_eight_or_the_profile_bucket_count():
    from graphopt.ir import load_model
    from graphopt.runtime.graphs import DEFAULT_MAX_GRAPHS, GraphBook

    assert GraphBook(load_model(_dynamic_model()), None).max_graphs == DEFAULT_MAX_GRAPHS == 8
    many = [{"dims": {"batch": b}, "lowering": "direct", "params": ""} for b in range(1, 13)]
    book = GraphBook(load_model(_dynamic_model(many)), None)
    assert len(book.buckets) == 12 and book.max_graphs == 12


def test_each_graph_records_the_profile_bucket_it_serves(recorder):
    from graphopt.ir import load_model
    from graphopt.runtime.graphs import GraphBook, bucket_of

    buckets = [{"dims": {"batch": 1}, "lowering": "a", "params": ""},
               {"dims": {"batch": 8}, "lowering": "b", "params": ""},
               {"dims": {"batch": 32}, "lowering": "c", "params": ""}]
    book = GraphBook(load_model(_dynamic_model(buckets)), None)
    assert book.buckets == [{"batch": 1}, {"batch": 8}, {"batch": 32}]
    assert bucket_of(book.buckets, {"batch": 5}) == {"batch": 8}
    assert bucket_of(book.buckets, {"batch": 64}) == {"batch": 32}  # past every bucket: the last
    assert bucket_of([], {"batch": 5}) is None
    book.add((("x", (5, 8), "<f4"),), object(), {"batch": 5})
    book.add((("x", (6, 8), "<f4"),), False, {"batch": 6})  # a failed capture covers nothing
    assert book.summary()["buckets_covered"] == [{"batch": 8}]


def test_a_failed_capture_is_not_counted_against_the_bound(fake_cuda):
    from graphopt.ir import load_model
    from graphopt.runtime.graphs import GraphBook

    book = GraphBook(load_model(_dynamic_model()), 1)
    book.add((("x", (1, 8), "<f4"),), False, {"batch": 1})
    assert book.full((("x", (2, 8), "<f4"),)) is None
    book.add((("x", (2, 8), "<f4"),), object(), {"batch": 2})
    assert "max_graphs=1" in book.full((("x", (3, 8), "<f4"),))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_max_graphs_must_be_a_positive_integer(bad):
    from graphopt.runtime import Session

    with pytest.raises(UsageError, match="max_graphs"):
        Session(_dynamic_model(), device="numpy", max_graphs=bad)


def test_compiled_plans_are_kept_for_a_bounded_number_of_shapes_least_recently_used_first(recorder, monkeypatch):
    from graphopt.runtime import Session, session

    monkeypatch.setattr(session, "PLAN_CACHE", 3)
    sess = Session(_dynamic_model(), device="cuda", max_graphs=1)
    for batch in (1, 1, 2, 3, 4, 5):  # batch 1 gets the one graph: its plan (and arena) stays
        sess.run({"x": np.ones((batch, 8), np.float32)})
    kept = [sig[0][1][0] for sig in sess._plans]
    assert kept == [1, 4, 5], kept
    sess.run({"x": np.ones((4, 8), np.float32)})
    sess.run({"x": np.ones((2, 8), np.float32)})  # traced again; 5 was the least recently used
    assert [sig[0][1][0] for sig in sess._plans] == [1, 4, 2]


def test_static_outputs_are_asked_of_the_replay_only_when_the_session_says_so(recorder):
    """``copy_outputs=False``: a replay hands back the graph's own output buffers (torch.compile's
    reduce-overhead contract: valid until the next run); the default copies them."""
    from graphopt.runtime import Session

    x = np.ones((2, 8), np.float32)
    for flag in (True, False):
        sess = Session(_dynamic_model(), device="cuda", copy_outputs=flag)
        for _ in range(3):
            sess.run({"x": x})
        assert sess.graph_status == "replaying a CUDA graph"
    assert recorder.copies == [True, True, False, False]  # capture on the second run, then replays


def test_a_replay_without_copies_returns_the_graphs_own_buffers():
    from types import SimpleNamespace

    from graphopt.runtime.graphs import CapturedRun

    class _Stream:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    launched = []
    outs = [np.zeros(3), np.ones(2)]
    run = CapturedRun(SimpleNamespace(launch=lambda stream: launched.append(stream)), None, {}, outs, _Stream())
    got = run.replay({}, copy=False)
    assert len(launched) == 1 and all(g is o for g, o in zip(got, outs))


def test_copy_outputs_must_be_a_bool():
    from graphopt.errors import UsageError
    from graphopt.runtime import Session

    with pytest.raises(UsageError, match="copy_outputs"):
        Session(_dynamic_model(), device="numpy", copy_outputs="no")


def test_no_tail_below_the_size_bound_or_when_the_last_step_feeds_another():
    from types import SimpleNamespace

    from graphopt.runtime.graphs import TAIL_MIN_BYTES, fresh_tail

    def plan(fresh, outs_of_last):
        loop = [(None, (0,), (1,), ()), (None, (1,), outs_of_last, ())]
        return SimpleNamespace(loop=loop, fresh_bytes=fresh, template=[], outputs=[("y", 2)], n_slots=3)

    assert fresh_tail(plan({1: TAIL_MIN_BYTES}, (2,))) == 1
    assert fresh_tail(plan({1: TAIL_MIN_BYTES - 1}, (2,))) == 2  # too small to be worth a launch
    assert fresh_tail(plan({1: TAIL_MIN_BYTES}, (1,))) == 2  # writes a value another step could read
    assert fresh_tail(plan({}, (2,))) == 2  # not a lowered step writing new arrays
    assert fresh_tail(plan({0: 1, 1: TAIL_MIN_BYTES}, (2,))) == 1  # step 0 writes slot 1, no graph output
    whole = SimpleNamespace(loop=[(None, (0,), (2,), ())], fresh_bytes={0: TAIL_MIN_BYTES}, template=[],
                            outputs=[("y", 2)], n_slots=3)
    assert fresh_tail(whole) == 1  # a plan that would be all tail keeps its graph
