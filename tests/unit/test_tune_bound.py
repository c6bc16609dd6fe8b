"""A candidate that shows itself slower than ``CANNOT_WIN`` times the best so far is timed briefly:
the bound the profiler's run passes (``candidate_run``), and what the CUDA-event timer does with it
(``kernels.timing``, here on a fake CuPy whose events read a simulated clock)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from graphopt.kernels import timing
from graphopt.tune import candidate_run, results as R
from graphopt.tune.candidate_run import CANNOT_WIN, FakeTimer, bound_for, run_batch, run_one
from tests.unit.test_tune_profiler import SIG, cand, fake_checker


@pytest.fixture(autouse=True)
def _no_bests(monkeypatch):
    monkeypatch.setattr(candidate_run, "_BEST_MS", {})


def test_the_bound_is_cannot_win_times_the_best_median_so_far():
    timer = FakeTimer(reps=3, bounded_reps=1)
    assert bound_for(SIG) is None
    replies = run_batch(SIG, [cand("a", 2.0), cand("b", 1.0), cand("c", 3.0)], timer, fake_checker,
                        candidate_run.no_buffers, "sm_90", lambda i: None)
    assert all(r["status"] == R.OK for r in replies.values())
    assert bound_for(SIG) == pytest.approx(CANNOT_WIN * 1.0)


def test_a_timer_without_takes_bound_is_never_passed_one():
    seen = []

    def timer(launch, inputs, outputs):  # the old three-argument contract
        seen.append(launch.ms)
        return [launch(inputs, outputs)]

    run_batch(SIG, [cand("a", 1.0), cand("b", 5.0)], timer, fake_checker, candidate_run.no_buffers, "sm_90",
              lambda i: None)
    assert seen == [1.0, 5.0]


def test_a_candidate_slower_than_the_bound_gets_the_brief_timing_and_keeps_its_median():
    timer = FakeTimer(reps=5, bounded_reps=1)
    replies = run_batch(SIG, [cand("fast", 1.0), cand("slow", 4.0), cand("near", 1.2)], timer, fake_checker,
                        candidate_run.no_buffers, "sm_90", lambda i: None)
    assert [len(replies[i]["samples"]) for i in range(3)] == [5, 1, 5]  # 1.2 < 1.5 x 1.0: timed in full
    assert replies[1]["samples"] == [4.0]


def test_the_best_so_far_carries_across_batches_of_one_signature_in_a_process():
    timer = FakeTimer(reps=5, bounded_reps=1)
    run_one(SIG, cand("fast", 1.0), timer, fake_checker, candidate_run.no_buffers, "sm_90")
    reply = run_one(SIG, cand("slow", 9.0), timer, fake_checker, candidate_run.no_buffers, "sm_90")
    assert reply["status"] == R.OK and reply["samples"] == [9.0]


# ---- the CUDA-event timer on a fake CuPy -------------------------------------------------------

class _Clock:
    t = 0.0


def _fake_cupy(clock):
    class Event:
        def record(self, stream=None):
            self.t = clock.t

        def synchronize(self):
            pass

    cuda = types.SimpleNamespace(Event=Event, get_current_stream=lambda: None,
                                 get_elapsed_time=lambda s, e: e.t - s.t)
    return types.SimpleNamespace(cuda=cuda)


class _Launch:
    """An eager (not capturable) launch whose n-th call takes ``times[n]`` ms (the last one after)."""

    def __init__(self, clock, times):
        self.clock, self.times, self.calls = clock, list(times), 0

    def __call__(self, ins, outs):
        self.clock.t += self.times[min(self.calls, len(self.times) - 1)]
        self.calls += 1


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(c))
    return c


def _time(launch, bound):
    x = np.zeros(1 << 20, np.float32)  # 4 MiB: the rotation wants more sets than a brief timing uses
    return timing.cuda_event_timer(launch, [x], [x.copy()], spin_cycles=0, budget_ms=10.0, bound_ms=bound)


def test_timer_without_a_bound_times_the_budget(clock):
    launch = _Launch(clock, [0.5])
    samples = _time(launch, None)
    assert len(samples) == 20 and launch.calls == 2 + 20  # the estimate's two launches, then the reps


def test_timer_times_a_launch_slower_than_the_bound_briefly(clock):
    launch = _Launch(clock, [0.5])
    samples = _time(launch, 0.2)
    assert samples == [0.5] * timing.BRIEF and launch.calls == 2 + timing.BRIEF


def test_timer_times_in_full_a_launch_under_the_bound(clock):
    launch = _Launch(clock, [0.5])
    assert len(_time(launch, 0.6)) == 20


def test_timer_times_in_full_when_the_first_launch_was_an_outlier(clock):
    launch = _Launch(clock, [3.0, 3.0, 0.5])  # the estimate saw 3 ms, the brief timing 0.5
    samples = _time(launch, 1.0)
    assert len(samples) == 20 and launch.calls == 2 + timing.BRIEF + 20


def test_a_briefly_timed_result_says_so():
    timer = FakeTimer(reps=5, bounded_reps=1)
    replies = run_batch(SIG, [cand("fast", 1.0), cand("slow", 4.0)], timer, fake_checker,
                        candidate_run.no_buffers, "sm_90", lambda i: None)
    assert replies[0]["reason"] == ""
    assert replies[1]["reason"].startswith(candidate_run.BRIEFLY) and "1 ms" in replies[1]["reason"]


def test_the_bound_is_kept_per_layout_group():
    candidate_run._record_best(SIG, ("NHWC", "NHWC"), 1.0)
    assert bound_for(SIG, ("NHWC", "NHWC")) == pytest.approx(CANNOT_WIN)
    assert bound_for(SIG, ("NCHW", "NCHW")) is None  # an NCHW plan may still win once conversions count
    assert bound_for(SIG) is None
    candidate_run._record_best(SIG, ("NHWC", "NHWC"), 2.0)  # not better: kept
    assert bound_for(SIG, ["NHWC", "NHWC"]) == pytest.approx(CANNOT_WIN)


def test_a_slow_candidate_of_another_layout_is_timed_in_full():
    timer = FakeTimer(reps=5, bounded_reps=1)
    candidate_run._record_best(SIG, ("NHWC",), 1.0)
    reply = candidate_run._time(SIG, _launch_returning(4.0, ("NCHW",)), timer, ([], []), lambda name: None)
    assert len(reply["samples"]) == 5 and reply["reason"] == ""
    reply = candidate_run._time(SIG, _launch_returning(4.0, ("NHWC",)), timer, ([], []), lambda name: None)
    assert len(reply["samples"]) == 1 and reply["reason"].startswith(candidate_run.BRIEFLY)


def _launch_returning(ms, layouts):
    def launch(inputs, outputs):
        return ms
    launch.layouts = layouts
    return launch
