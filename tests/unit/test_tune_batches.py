"""Workers sharing a GPU check a batch of candidates, then time it in one exclusive turn
(``candidate_run.run_batch``, ``IsolatedRunner.run_batch``); a failure mid-batch leaves the checked
candidates unrun, and the profiler runs them again in a fresh worker."""

from __future__ import annotations

import fcntl
import math
import sys
import types

import numpy as np

from graphopt.tune import candidate_run, results as R
from graphopt.tune.candidate_run import FakeTimer, run_batch, survives
from graphopt.tune.profiler import profile_node
from graphopt.tune.runners import IsolatedRunner
from tests.unit.test_profiler_gpu_turn import _probe
from tests.unit.test_tune_profiler import SIG, ZOO, by_name, cand, fake_checker


def _probe_exclusive_held(path: str) -> bool:
    """Whether a worker holds the GPU alone (another could not take it even shared)."""
    return not _probe(path, fcntl.LOCK_SH)


def test_a_batch_is_checked_first_then_timed_in_one_exclusive_turn(tmp_path, monkeypatch):
    lock = str(tmp_path / "gpu0.lock")
    monkeypatch.setenv(candidate_run.GPU_LOCK_ENV, lock)
    events = []

    def timer(launch, inputs, outputs):
        events.append(("time", launch.ms, _probe_exclusive_held(lock)))
        return [launch.ms]

    def checker(sig, launch):
        events.append(("check", launch.ms, _probe_exclusive_held(lock)))
        return None

    seen = []
    replies = run_batch(SIG, [cand("a", 1.0), cand("b", 2.0), cand("c", 3.0)], timer, checker,
                        candidate_run.no_buffers, "sm_90", seen.append)
    assert [r["status"] for r in replies.values()] == [R.OK] * 3 and sorted(replies) == [0, 1, 2]
    assert events == [("check", 1.0, False), ("check", 2.0, False), ("check", 3.0, False),
                      ("time", 1.0, True), ("time", 2.0, True), ("time", 3.0, True)]
    assert seen == [0, 1, 2, 0, 1, 2]  # progress: before each check, then before each timing
    assert all({"build", "check", "time", "wait"} <= set(r["phases"]) for r in replies.values())


def test_a_failure_mid_batch_leaves_the_checked_candidates_unrun():
    zoo = [cand("a", 1.0), cand("b", 2.0), cand("wrong", 0.5, "wrong"), cand("d", 4.0)]
    replies = run_batch(SIG, zoo, FakeTimer(3), fake_checker, candidate_run.no_buffers, "sm_90", lambda i: None)
    assert list(replies) == [2] and replies[2]["status"] == R.WRONG  # a and b were checked, not timed; d not reached


def test_a_build_failure_with_the_context_untouched_does_not_end_the_batch():
    zoo = [cand("a", 1.0), cand("build_raises", 0.1, "build_raises"), cand("c", 3.0)]
    replies = run_batch(SIG, zoo, FakeTimer(3), fake_checker, candidate_run.no_buffers, "sm_90", lambda i: None)
    assert [replies[i]["status"] for i in range(3)] == [R.OK, R.BUILD_FAILED, R.OK]


def test_checked_candidates_holding_too_much_memory_are_timed_early(monkeypatch):
    monkeypatch.setattr(candidate_run, "BATCH_BYTES", 1000)
    seen = []
    replies = run_batch(SIG, [cand("a", 1.0), cand("b", 2.0)], FakeTimer(3), fake_checker,
                        lambda sig: ([np.zeros(200)], [np.zeros(10)]), "sm_90", seen.append)
    assert seen == [0, 0, 1, 1] and len(replies) == 2  # 1680 bytes each: each timed before the next check


def test_survives_only_a_pass_or_a_build_failure_with_a_usable_context(monkeypatch):
    assert survives({"status": R.OK})
    assert not survives({"status": R.WRONG}) and not survives({"status": R.ERROR})
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    assert survives({"status": R.BUILD_FAILED})  # no CUDA touched in this process
    def fake_cupy(count, sync):
        return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
            getDeviceCount=count, deviceSynchronize=sync)))

    def raises(*a):
        raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(lambda: 1, raises))
    assert not survives({"status": R.BUILD_FAILED})  # a sticky error: a fresh process
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(lambda: 1, lambda: None))
    assert survives({"status": R.BUILD_FAILED})
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(raises, raises))
    assert survives({"status": R.BUILD_FAILED})  # CuPy without a driver: no context to spoil


class _BatchedInline:
    """``run_batch`` in this process, in batches of 3 (the profiler's requeueing, without a worker)."""

    batch_size = 3
    broken = None

    def __init__(self):
        self.batches = []

    def run_batch(self, sig, cands):
        self.batches.append([c.name for c in cands])
        got = run_batch(sig, cands, FakeTimer(3), fake_checker, candidate_run.no_buffers, "sm_90", lambda i: None)
        return [got.get(i) for i in range(len(cands))]

    def run(self, sig, c):
        return self.run_batch(sig, [c])[0]


def test_the_profiler_runs_the_candidates_a_failure_left_unrun_again():
    zoo = [cand("a", 1.0), cand("wrong", 0.5, "wrong"), cand("c", 3.0), cand("d", 0.2), cand("e", 5.0)]
    runner = _BatchedInline()
    res = profile_node(SIG, zoo, timer=FakeTimer(3), checker=fake_checker, runner=runner, compute_capability=(9, 0))
    assert runner.batches == [["a", "wrong", "c"], ["a", "c", "d"], ["e"]]  # a checked, c not reached: both again
    assert {k: v.status for k, v in by_name(res).items()} == {"a": R.OK, "wrong": R.WRONG, "c": R.OK, "d": R.OK, "e": R.OK}
    assert [r.lowering for r in res.results] == [c.name for c in zoo] and res.winner.lowering == "d"


def test_the_zoo_in_batches_of_a_worker_sharing_its_gpu(tmp_path):
    """Crashes, hangs and every failure are the reply of the candidate they belong to, as one at a time."""
    with IsolatedRunner(FakeTimer(5), fake_checker, arch="sm_90", timeout_s=3.0,
                        gpu_lock=str(tmp_path / "gpu0.lock")) as runner:
        assert runner.batch_size > 1
        res = profile_node(SIG, ZOO, timer=FakeTimer(5), checker=fake_checker, runner=runner, compute_capability=(9, 0))
    r = by_name(res)
    assert {k: v.status for k, v in r.items()} == {
        "slow_ok": R.OK, "fast_ok": R.OK, "also_ok": R.OK, "build_raises": R.BUILD_FAILED, "wrong": R.WRONG,
        "segfault": R.CRASHED, "hang": R.TIMEOUT, "oom": R.OOM, "nan": R.ERROR, "pruned": R.PRUNED,
        "buggy_applies": R.PRUNED}
    assert res.winner.lowering == "fast_ok" and res.winner.ms == 0.20
    assert "SIGSEGV" in r["segfault"].reason and "timed out after 3 s" in r["hang"].reason
    assert all(math.isfinite(x.ms) and len(x.samples) == 5 for x in r.values() if x.status == R.OK)


def test_the_context_check_calls_functions_cupy_has():
    """The H100's first run of ``survives`` restarted a worker after every refused cuDNN graph: it called
    ``cupy.cuda.runtime.getLastError``, which CuPy does not have (the AttributeError read as a spoiled
    context). Every runtime function the check calls must exist."""
    import inspect

    import pytest

    cupy = pytest.importorskip("cupy")
    called = {n for n in ("getDeviceCount", "deviceSynchronize", "getLastError", "peekAtLastError")
              if f"runtime.{n}(" in inspect.getsource(candidate_run._context_usable)}
    assert called and all(hasattr(cupy.cuda.runtime, n) for n in called), called


def timer_failing_at(launch, inputs, outputs):
    """A timer whose run of a candidate of 0.77 ms hangs and of 0.66 ms kills the process: failures that
    happen while a batch is timed, after every check passed (module-level: the worker unpickles it)."""
    import os
    import signal
    import time

    if launch.ms == 0.77:
        time.sleep(600)
    if launch.ms == 0.66:
        os.kill(os.getpid(), signal.SIGSEGV)
    return [launch.ms] * 3


def test_a_hang_or_crash_while_a_batch_is_timed_is_the_reply_of_the_candidate_being_timed(tmp_path):
    zoo = [cand("a", 1.0), cand("hangs", 0.77), cand("b", 2.0), cand("crashes", 0.66), cand("c", 0.5)]
    with IsolatedRunner(timer_failing_at, fake_checker, arch="sm_90", timeout_s=3.0,
                        gpu_lock=str(tmp_path / "gpu0.lock")) as runner:
        res = profile_node(SIG, zoo, timer=timer_failing_at, checker=fake_checker, runner=runner, compute_capability=(9, 0))
    r = by_name(res)
    assert {k: v.status for k, v in r.items()} == {"a": R.OK, "hangs": R.TIMEOUT, "b": R.OK, "crashes": R.CRASHED,
                                                    "c": R.OK}
    assert "timed out after 3 s" in r["hangs"].reason and "SIGSEGV" in r["crashes"].reason
    assert res.winner.lowering == "c"
