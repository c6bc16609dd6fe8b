"""graphopt.runtime.host_time: the host-time method every report shares. The device is held by a
hold kernel before each timed run, synchronisation happens only outside the timed region, a hold
that ended before the run did is lengthened and the run timed again, and the figures are per step."""

from __future__ import annotations

import time
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


class _Stream:
    def __eq__(self, other):
        return other == "s"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Plan:
    """Ten steps; those named in ``waits`` sleep ``wait_s`` while the GPU is held (a step that
    waits for the device), then the device counts as caught up. With ``queue`` = q, any step
    behind a hold with q steps enqueued since that hold waits too (a full launch queue)."""

    def __init__(self, sess, waits=(), wait_s=0.005, queue=None, pace_s=0.0008):
        self.sess, self.waits, self.wait_s, self.queue, self.pace_s = sess, set(waits), wait_s, queue, pace_s
        self.steps = [SimpleNamespace(label=f"Op n{i}", lowering="lw" if i in self.waits else None, run=self._step(i))
                      for i in range(10)]

    def _step(self, i):
        def run(ins):
            sess = self.sess
            full = self.queue is not None and sess.enqueued >= self.queue
            paced = getattr(sess, "paced", False)
            if sess.held and (i in self.waits or full):
                time.sleep(self.wait_s)
                # paced: the hold ended but the work behind it still fills the queue
                sess.held, sess.enqueued = False, (self.queue if paced and i not in self.waits else 0)
            elif full and paced:
                time.sleep(self.pace_s)  # a slot frees after one launch's device time: a wait under the threshold
            elif sess.held:
                sess.enqueued += 1
            return []
        return run

    def execute(self, feeds, profile=None):
        for step in self.steps:
            step.run([]) if profile is None else profile(step, [])
        return []


class _Sess:
    """A session stand-in on "cuda" that logs what the measurement does, in order."""

    device = "cuda"

    def __init__(self, waits=(), queue=None):
        self.log: list = []
        self.held = False
        self.enqueued = 0  # steps enqueued behind the current hold
        self.last_plan = _Plan(self, waits, queue=queue)
        self.backend = SimpleNamespace(stream=_Stream(), cupy=SimpleNamespace(asarray=lambda v: v))

    def _convert_feeds(self, feeds):
        return feeds

    def run(self, feeds):
        self.log.append("run")
        self.last_plan.execute(feeds)

    def synchronize(self):
        self.log.append("sync")
        if (self.held or self.enqueued) and self.log.count("hold") and getattr(self, "drains", False):
            self.held, self.enqueued = False, 0


def _hold(sess, done_pattern):
    holds = []
    pattern = iter(done_pattern)

    def hold(stream, us):
        assert stream == "s"
        holds.append(us)
        sess.log.append("hold")
        queue = sess.last_plan.queue
        if getattr(sess, "paced", False) and not sess.held and queue is not None and sess.enqueued >= queue:
            return _Event(sess.log, next(pattern, False))  # behind a full queue: it holds nothing yet
        sess.held, sess.enqueued = True, 0
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
    assert h.blocking == [] and "blocking_steps" not in h.to_dict()  # no step waited: none is named
    assert not h.queue_limited and "host_us_per_node_wall" not in h.to_dict()  # nothing explains it: the wall stands


def test_a_run_that_waits_out_the_longest_hold_is_not_retried_and_the_repeats_shrink():
    """GPT-2 bs1 on 2026-12-05: every run waited out the hold, and 20 repeats of 8 attempts at up to
    0.5 s took 83 s of the e2e budget (torch.compile was then skipped). Once the longest hold ends
    early, no run is retried and 3 runs are timed in all."""
    sess = _Sess()
    hold, holds = _hold(sess, [True] * 1000)
    h = host_time.measure(sess, {}, repeats=20, hold=hold, warmup=1, idle=False)
    assert not h.held and len(h.wall_us) == 3
    timed = [u for u in holds if u != host_time.BLOCK_HOLD_US]  # less the blocking-step finder's
    assert len(timed) == 10 and timed.count(host_time.MAX_HOLD_US) == 2  # the doubling once, then one try a run


def test_every_step_that_waits_for_the_device_is_named_in_run_order():
    """The GPT-2 bs1 row of 2026-12-05 had gpu_held false and 2,396 us per node: one step per run
    waited out the whole hold. The finder holds the GPU again after each waiting step, so the second
    one is found too, and steps that do not wait are not named."""
    sess = _Sess(waits=(3, 7))
    hold, holds = _hold(sess, [])
    found = host_time.blocking_steps(sess, {}, hold=hold, hold_us=2000.0)
    assert [b["step"] for b in found] == ["Op n3", "Op n7"] and all(b["lowering"] == "lw" for b in found)
    assert all(b["us"] > 1000.0 for b in found) and holds[:3] == [2000.0] * 3  # before the run, after each waiting step
    assert all(b["cause"] == host_time.SYNC for b in found)  # each waits again as the first step behind a fresh hold
    assert host_time.blocking_steps(_Sess(), {}, hold=_hold(_Sess(), [])[0], hold_us=2000.0) == []
    d = host_time.HostTime(steps=10, wall_us=[1.0], cpu_us=[1.0], blocking=found).to_dict()
    assert d["blocking_steps"] == found


def test_a_step_that_waits_only_behind_a_full_launch_queue_is_told_apart():
    """GPT-2 bs1 on the H200 (2026-12-05): the 66th replayed step graph waited out every hold, 20 ms
    or 100 ms alike, and not at all without step replay. A step that does not wait when it runs first
    behind a fresh hold waited for queue room, not for the device."""
    sess = _Sess(queue=4)
    sess.drains = True
    hold, _ = _hold(sess, [])
    found = host_time.blocking_steps(sess, {}, hold=hold, hold_us=2000.0)
    assert [b["step"] for b in found] == ["Op n4", "Op n9"] and all(b["cause"] == host_time.QUEUE for b in found)


def test_a_queue_limited_run_reports_its_steps_host_time_and_keeps_the_wall_time():
    sess = _Sess(queue=4)
    sess.drains = True
    hold, _ = _hold(sess, [True] * 1000)  # every hold ends before the run returns
    h = host_time.measure(sess, {}, repeats=3, hold=hold, warmup=1, idle=False, block_hold_us=2000.0)
    d = h.to_dict()
    assert h.queue_limited and d["host_us_per_node"] < 100.0 and d["host_us_per_node_wall"] * 10 >= 5000.0  # 5 ms waits excluded
    assert "launch queue" in d["method"] and [b["cause"] for b in d["blocking_steps"]] == [host_time.QUEUE] * 2


def test_the_steps_after_a_queue_wait_are_not_paced_by_the_queue_the_hold_filled():
    """After a queue wait the hold is over but the queue is still full, and a hold enqueued behind it
    holds nothing until that work ran: every later launch waits for a slot, each under the detection
    threshold (BERT fp32 bs32 on the H100, 2026-12-06). The measurement drains the device before it
    holds again, and leaves the drain out of the run's host time."""
    sess = _Sess(queue=4)
    sess.drains = sess.paced = True
    hold, _ = _hold(sess, [True] * 1000)
    h = host_time.measure(sess, {}, repeats=3, hold=hold, warmup=1, idle=False, block_hold_us=2000.0)
    d = h.to_dict()
    assert h.queue_limited and d["host_us_per_node"] < 60.0  # five paced steps would add 400 us a step
    assert [b["step"] for b in d["blocking_steps"]] == ["Op n4", "Op n9"]


def test_a_step_that_waits_for_the_device_itself_keeps_the_wall_time():
    sess = _Sess(waits=(3,))
    sess.drains = True
    hold, _ = _hold(sess, [True] * 1000)
    h = host_time.measure(sess, {}, repeats=3, hold=hold, warmup=1, idle=False, block_hold_us=2000.0)
    d = h.to_dict()
    assert not h.queue_limited and "host_us_per_node_wall" not in d and d["host_us_per_node"] == round(min(h.wall_us) / 10, 2)
    assert [b["cause"] for b in d["blocking_steps"]] == [host_time.SYNC]


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
