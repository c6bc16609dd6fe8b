"""graphopt.runtime.host_time: the host-time method every report shares. The device is held by a
hold kernel before each timed run, synchronisation happens only outside the timed region, a hold
that ended before the run did is lengthened and the run timed again, and the figures are per step."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from _runtime_helpers import random_feeds
from graphopt.runtime import host_time

ROOT = Path(__file__).resolve().parents[2]


class _Event:
    def __init__(self, log, done):
        self.log, self._done = log, done

    @property
    def done(self):
        self.log.append("query")
        return self._done


class _Sess:
    """A session stand-in on "cuda" that logs what the measurement does, in order."""

    device = "cuda"

    def __init__(self):
        self.log: list = []
        self.last_plan = SimpleNamespace(steps=[object()] * 10)
        self.backend = SimpleNamespace(stream="s", cupy=SimpleNamespace(asarray=lambda v: v))

    def run(self, feeds):
        self.log.append("run")

    def synchronize(self):
        self.log.append("sync")


def _hold(sess, done_pattern):
    holds = []
    pattern = iter(done_pattern)

    def hold(stream, us):
        assert stream == "s"
        holds.append(us)
        sess.log.append("hold")
        return _Event(sess.log, next(pattern, False))

    return hold, holds


def test_each_timed_run_starts_behind_a_hold_and_synchronises_only_outside():
    sess = _Sess()
    hold, holds = _hold(sess, [])
    h = host_time.measure(sess, {"x": 1}, repeats=3, hold=hold, warmup=2, idle=False)
    timed = sess.log[4:]  # after the warm-up runs (run, sync) x 2
    assert sess.log[:4] == ["run", "sync", "run", "sync"]
    assert timed == ["sync", "hold", "run", "query", "sync"] * 3
    assert h.held and len(h.wall_us) == len(h.cpu_us) == 3 and h.steps == 10
    assert h.us_per_step == pytest.approx(min(h.wall_us) / 10)
    d = h.to_dict()
    assert d["gpu_held"] and d["runs"] == 3 and d["host_us_per_node"] == pytest.approx(round(min(h.wall_us) / 10, 2))
    assert d["host_idle_gpu_us_per_node"] is None and "held" in d["method"]


def test_a_hold_that_ended_early_is_lengthened_and_the_run_timed_again():
    sess = _Sess()
    hold, holds = _hold(sess, [True, True, False])  # the first two holds ended before the run returned
    h = host_time.measure(sess, {}, repeats=1, hold=hold, warmup=1, idle=False)
    assert len(holds) == 3 and holds[0] == host_time.MIN_HOLD_US and holds[1] > holds[0] and holds[2] > holds[1]
    assert h.held and len(h.wall_us) == 1


def test_a_hold_that_never_lasts_is_reported():
    sess = _Sess()
    hold, _ = _hold(sess, [True] * 100)
    h = host_time.measure(sess, {}, repeats=2, hold=hold, warmup=1, idle=False)
    assert not h.held and not h.to_dict()["gpu_held"] and len(h.wall_us) == 2


def test_the_idle_gpu_figure_is_the_same_run_without_the_hold():
    sess = _Sess()
    hold, _ = _hold(sess, [])
    h = host_time.measure(sess, {}, repeats=2, hold=hold, warmup=1, idle=True)
    assert len(h.idle_wall_us) == 2 and h.to_dict()["host_idle_gpu_us_per_node"] is not None
    assert sess.log[2:] == ["sync", "hold", "run", "query", "sync", "sync", "run", "sync"] * 2


def test_a_numpy_session_is_timed_without_a_hold_and_per_op_adds_up():
    from graphopt.runtime import Session
    from graphopt.runtime.bench import host_overhead_us

    path = ROOT / "models" / "resnet_style.onnx"
    feeds = random_feeds(onnx.load(path), np.random.default_rng(0))
    sess = Session(path, device="numpy")
    h = host_time.measure(sess, feeds, repeats=3)
    assert h.hold_us == 0 and h.held is False and h.us_per_step > 0 and h.steps == len(sess.last_plan.steps)
    us, steps = host_overhead_us(sess, feeds, repeats=2)
    assert us > 0 and steps == h.steps
    rows = host_time.per_op(sess, feeds, repeats=2)
    assert sum(n for _, n, _ in rows) == h.steps and all(t > 0 for _, _, t in rows)
    assert rows == sorted(rows, key=lambda r: -r[2])
