"""The profiler with fake candidates and a fake timer, as Triton tests its autotuner (CPU).

The fake candidates and checker are module-level so that the isolated worker (a spawned
subprocess) can unpickle them.
"""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path


from graphopt.lowering.contract import Candidate, Signature
from graphopt.tune import results as R
from graphopt.tune.cache import TuningCache
from graphopt.tune.candidate_run import FakeTimer
from graphopt.tune.gpus import DeviceInfo
from graphopt.tune.profiler import Profiler, profile_node
from graphopt.tune.progress import node_progress
from graphopt.tune.runners import InlineRunner, IsolatedRunner

SIG = Signature.make("CBR", [(1, 64, 56, 56), (64, 64, 3, 3), (64,), None], ["float16"] * 3 + [""],
                     {"activation": "Relu", "pads": [1, 1, 1, 1]})
SIG2 = Signature.make("CBR", [(8, 64, 56, 56), (64, 64, 3, 3), (64,), None], ["float16"] * 3 + [""],
                      {"activation": "Relu", "pads": [1, 1, 1, 1]})


class Launch:
    """A fake kernel: returns its simulated time in ms; ``behaviour`` says how it misbehaves."""

    def __init__(self, ms, behaviour="ok"):
        self.ms = ms
        self.behaviour = behaviour
        self.calls = 0

    def __call__(self, inputs, outputs):
        self.calls += 1
        if self.behaviour == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.behaviour == "hang":
            time.sleep(600)
        if self.behaviour == "nan":
            return math.nan
        if isinstance(self.ms, tuple):  # a sequence of run times, to test the median
            return self.ms[(self.calls - 1) % len(self.ms)]
        return self.ms


class Fake(Candidate):
    """params: ms (simulated time), behaviour (ok|build_raises|oom|wrong|segfault|hang|nan|prune|applies_raises)."""

    def applies(self, sig, cc):
        b = self.param("behaviour", "ok")
        if b == "prune":
            return "needs a 1x1 stride-1 conv"
        if b == "applies_raises":
            raise ValueError("bug in applies")
        if b == "needs_sm90" and cc < (9, 0):
            return "needs sm_90 (wgmma)"
        return None

    def source_hash(self):
        return f"hash-{self.name}"

    def build(self, sig, arch):
        b = self.param("behaviour", "ok")
        if b == "build_raises":
            raise RuntimeError("nvrtc: error: identifier \"__hmma\" is undefined")
        if b == "oom":
            raise MemoryError("out of memory allocating 4 GiB")
        return Launch(self.param("ms", 1.0), b)


def fake_checker(sig, launch):
    """Runs the launch once (as a real checker would) and reports the planted wrong answers."""
    launch([], [])
    if launch.behaviour == "wrong":
        return "max abs err 0.73 > tol 0.01 at output[0][0, 5, 3, 3]"
    return None


def cand(name, ms, behaviour="ok"):
    return Fake(name, (("behaviour", behaviour), ("ms", ms)))


ZOO = [
    cand("slow_ok", 0.50),
    cand("build_raises", 0.01, "build_raises"),
    cand("wrong", 0.02, "wrong"),          # the fastest, but wrong: must not win
    cand("segfault", 0.03, "segfault"),    # kills its process
    cand("hang", 0.04, "hang"),            # never returns
    cand("fast_ok", 0.20),                 # the expected winner
    cand("oom", 0.05, "oom"),
    cand("nan", 0.06, "nan"),
    cand("pruned", 0.001, "prune"),
    cand("buggy_applies", 0.001, "applies_raises"),
    cand("also_ok", 0.30),
]


def by_name(result):
    return {r.lowering: r for r in result.results}


def test_isolated_fastest_correct_wins_and_failures_score_inf():
    t0 = time.monotonic()
    with IsolatedRunner(FakeTimer(5), fake_checker, arch="sm_90", timeout_s=3.0) as runner:
        res = profile_node(SIG, ZOO, timer=FakeTimer(5), checker=fake_checker, runner=runner,
                           compute_capability=(9, 0))
        restarts = runner.workers_started
    assert time.monotonic() - t0 < 60
    r = by_name(res)
    assert res.winner is not None and res.winner.lowering == "fast_ok" and res.winner.ms == 0.20
    assert [x.lowering for x in res.results] == [c.name for c in ZOO]  # every candidate kept, in order
    expect = {
        "slow_ok": R.OK, "fast_ok": R.OK, "also_ok": R.OK, "build_raises": R.BUILD_FAILED, "wrong": R.WRONG,
        "segfault": R.CRASHED, "hang": R.TIMEOUT, "oom": R.OOM, "nan": R.ERROR, "pruned": R.PRUNED,
        "buggy_applies": R.PRUNED,
    }
    assert {k: v.status for k, v in r.items()} == expect
    for name, res_ in r.items():
        if expect[name] == R.OK:
            assert math.isfinite(res_.ms) and len(res_.samples) == 5 and res_.reason == ""
        else:
            assert math.isinf(res_.ms) and res_.reason, name
    assert "__hmma" in r["build_raises"].reason
    assert "max abs err 0.73" in r["wrong"].reason
    assert "SIGSEGV" in r["segfault"].reason
    assert "timed out after 3 s" in r["hang"].reason
    assert "out of memory" in r["oom"].reason
    assert r["pruned"].reason == "needs a 1x1 stride-1 conv"
    assert "bug in applies" in r["buggy_applies"].reason
    assert r["fast_ok"].source_hash == "hash-fast_ok" and r["fast_ok"].candidate == "fast_ok:behaviour=ok,ms=0.2"
    # the worker was replaced after each failure that ran kernels (wrong, segfault, hang, oom, nan), not for the
    # passing ones nor for a build that failed with the CUDA context untouched (candidate_run.survives)
    assert restarts == 6
    assert "segfault:behaviour=segfault,ms=0.03: crashed (worker process died (SIGSEGV))" in res.failure_summary()


def test_inline_mode_handles_exceptions_and_wrong_answers():
    zoo = [c for c in ZOO if c.name not in ("segfault", "hang")]
    res = profile_node(SIG, zoo, timer=FakeTimer(3), checker=fake_checker, isolate=False)
    assert res.winner.lowering == "fast_ok"
    assert by_name(res)["wrong"].status == R.WRONG and by_name(res)["build_raises"].status == R.BUILD_FAILED


def test_median_of_runs_and_ties_go_to_the_earlier_candidate():
    noisy = Fake("noisy", (("ms", (5.0, 1.0, 3.0, 9.0, 2.0)),))
    res = profile_node(SIG, [noisy], timer=FakeTimer(5), checker=fake_checker, isolate=False)
    # the checker ran the launch once first, so the timed runs start at the second value
    assert res.winner.ms == 3.0 and res.winner.samples == (1.0, 3.0, 9.0, 2.0, 5.0)
    a, b = cand("a", 0.25), cand("b", 0.25)
    assert profile_node(SIG, [a, b], timer=FakeTimer(), checker=fake_checker, isolate=False).winner.lowering == "a"
    assert profile_node(SIG, [b, a], timer=FakeTimer(), checker=fake_checker, isolate=False).winner.lowering == "b"


def test_compute_capability_prunes():
    sm90 = cand("wgmma", 0.1, "needs_sm90")
    on_a100 = profile_node(SIG, [sm90, cand("mma", 0.2)], timer=FakeTimer(), checker=fake_checker, isolate=False,
                           compute_capability=(8, 0))
    assert on_a100.winner.lowering == "mma" and by_name(on_a100)["wgmma"].reason == "needs sm_90 (wgmma)"
    on_h100 = profile_node(SIG, [sm90, cand("mma", 0.2)], timer=FakeTimer(), checker=fake_checker, isolate=False,
                           compute_capability=(9, 0))
    assert on_h100.winner.lowering == "wgmma"


def test_all_failing_gives_no_winner():
    res = profile_node(SIG, [cand("x", 1, "build_raises"), cand("y", 1, "prune")], timer=FakeTimer(),
                       checker=fake_checker, isolate=False)
    assert res.winner is None and "x:behaviour=build_raises,ms=1: build_failed" in res.failure_summary()
    assert profile_node(SIG, [], timer=FakeTimer(), checker=fake_checker, isolate=False).winner is None


class CountingTimer:
    def __init__(self):
        self.calls = 0

    def __call__(self, launch, inputs, outputs):
        self.calls += 1
        return [launch(inputs, outputs)]


def test_identical_signatures_are_timed_once():
    timer, memo = CountingTimer(), {}
    zoo = [cand("a", 0.3), cand("b", 0.2)]
    first = profile_node(SIG, zoo, timer=timer, checker=fake_checker, isolate=False, memo=memo)
    same = Signature.make("CBR", [(1, 64, 56, 56), (64, 64, 3, 3), (64,), None], ["float16"] * 3 + [""],
                          {"pads": [1, 1, 1, 1], "activation": "Relu"})  # equal, built separately
    again = profile_node(same, zoo, timer=timer, checker=fake_checker, isolate=False, memo=memo)
    assert again is first and timer.calls == 2
    profile_node(SIG2, zoo, timer=timer, checker=fake_checker, isolate=False, memo=memo)
    assert timer.calls == 4


def test_duplicate_candidates_are_measured_once():
    timer = CountingTimer()
    res = profile_node(SIG, [cand("a", 0.3), cand("a", 0.3)], timer=timer, checker=fake_checker, isolate=False)
    assert len(res.results) == 1 and timer.calls == 1


class Twin(Fake):
    """A fake whose ``same_as`` names another candidate (as a vendor's "heuristic's first plan" does)."""

    def same_as(self, sig):
        twin = self.param("twin")
        if twin == "raise":
            raise RuntimeError("listing failed")
        return twin


def test_a_candidate_that_runs_what_another_runs_is_measured_once_under_the_other_key():
    timer = CountingTimer()
    zoo = [Twin("cudnn", (("twin", "cudnn:plan=eng0"),)), Fake("cudnn", (("plan", "eng0"),))]
    res = profile_node(SIG, zoo, timer=timer, checker=fake_checker, isolate=False)
    got = {r.candidate: r for r in res.results}
    assert timer.calls == 1 and res.winner.candidate == "cudnn:plan=eng0"
    assert got["cudnn:twin=cudnn:plan=eng0"].status == R.PRUNED
    assert got["cudnn:twin=cudnn:plan=eng0"].reason == "runs what cudnn:plan=eng0 runs (measured under that key)"


def test_a_twin_that_is_not_offered_or_a_failing_same_as_is_measured_itself():
    timer = CountingTimer()
    zoo = [Twin("a", (("ms", 0.1), ("twin", "b:plan=absent"))), Twin("c", (("ms", 0.2), ("twin", "raise"))),
           Twin("d", (("ms", 0.3), ("twin", None)))]
    res = profile_node(SIG, zoo, timer=timer, checker=fake_checker, isolate=False)
    assert timer.calls == 3 and all(r.ok for r in res.results) and res.winner.lowering == "a"


def test_fake_timer_refuses_real_launches():
    res = profile_node(SIG, [_RealLike("real")], timer=FakeTimer(), checker=lambda s, l: None, isolate=False)
    assert res.results[0].status == R.ERROR and "simulated time" in res.results[0].reason


class _RealLike(Candidate):
    def build(self, sig, arch):
        return lambda inputs, outputs: None


H200 = DeviceInfo(0, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0")


class CountingZoo:
    def __init__(self, zoo):
        self.zoo = zoo

    def __call__(self, sig):
        return list(self.zoo)


def test_profiler_writes_every_result_to_the_cache_and_reuses_them(tmp_path):
    zoo = [cand("slow_ok", 0.5), cand("fast_ok", 0.2), cand("wrong", 0.01, "wrong"), cand("segfault", 0.02, "segfault"),
           cand("pruned", 0.001, "prune")]
    with TuningCache(tmp_path / "c.sqlite3") as cache:
        with Profiler(CountingZoo(zoo), timer=FakeTimer(3), checker=fake_checker, device=H200, cache=cache,
                      isolate=True, timeout_s=10) as prof:
            res = prof(SIG)
            assert prof(SIG) is res  # memoized
        assert res.winner.lowering == "fast_ok" and not res.from_cache
        stored = {r.lowering: r for r in cache.entries()}
        assert set(stored) == {"slow_ok", "fast_ok", "wrong", "segfault"}  # pruned ones are not stored
        assert stored["segfault"].status == R.CRASHED and math.isinf(stored["segfault"].ms)
        assert stored["fast_ok"].samples == (0.2, 0.2, 0.2) and stored["fast_ok"].source_hash == "hash-fast_ok"
        fp = H200.fingerprint()
        assert (stored["fast_ok"].gpu, stored["fast_ok"].driver, stored["fast_ok"].cupy) == (fp.gpu, fp.driver, fp.cupy)
        # a new process (new Profiler) is served from the cache: the timer would fail if called
        with Profiler(CountingZoo(zoo), timer=_NoTimer(), checker=fake_checker, device=H200, cache=cache,
                      isolate=False) as prof:
            again = prof(SIG)
        assert again.from_cache and again.winner.lowering == "fast_ok"
        assert {r.lowering: r.status for r in again.results} == {
            "slow_ok": R.OK, "fast_ok": R.OK, "wrong": R.WRONG, "segfault": R.CRASHED, "pruned": R.PRUNED}
        # a new candidate is measured; the cached ones are not
        zoo2 = zoo + [cand("faster", 0.1)]
        with Profiler(CountingZoo(zoo2), timer=_OnlyFor("faster"), checker=fake_checker, device=H200, cache=cache,
                      isolate=False) as prof:
            third = prof(SIG)
        assert third.winner.lowering == "faster" and not third.from_cache


class _NoTimer:
    def __call__(self, launch, inputs, outputs):
        raise AssertionError("re-timed although cached")


class _OnlyFor:
    def __init__(self, name):
        self.name = name

    def __call__(self, launch, inputs, outputs):
        assert launch.ms == 0.1, "re-timed a cached candidate"
        return [launch.ms]


def test_progress_bar_counts_nodes(capsys):
    labels = []
    with node_progress(3, enabled=False) as advance:
        for name in ("a", "b", "c"):
            advance(name)
            labels.append(name)
    assert labels == ["a", "b", "c"]
    assert capsys.readouterr().err == ""


class WhereAmI(Candidate):
    """Its launch reports the GPU the worker was pinned to (through CUDA_VISIBLE_DEVICES) as its time."""

    def build(self, sig, arch):
        return _WhereLaunch()


class _WhereLaunch:
    behaviour = "ok"

    def __call__(self, inputs, outputs):
        time.sleep(0.05)
        return float(os.environ.get("CUDA_VISIBLE_DEVICES", "-1")) + 1.0


def test_profile_many_spreads_signatures_over_one_worker_per_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")  # the worker maps index 1 -> physical 7
    devs = [DeviceInfo(i, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0") for i in (0, 1)]
    sigs = [Signature.make("CBR", [(n, 8, 8, 8), (8, 8, 3, 3), None, None], ["float32"] * 2 + ["", ""], {})
            for n in range(1, 7)]
    done = []
    with Profiler(lambda s: [WhereAmI("where")], timer=FakeTimer(2), checker=fake_checker, devices=devs,
                  isolate=True, timeout_s=30) as prof:
        prof.profile_many(sigs + sigs[:2], advance=done.append)  # repeats are profiled once
        assert len(prof.memo) == 6 and len(done) == 6
        seen = {prof.memo[s.key()].winner.ms for s in sigs}
    assert seen == {6.0, 8.0}, seen  # both workers were used, each pinned to its own GPU


def test_a_single_target_gpu_is_pinned_too(monkeypatch):
    """The H200 at index 1 of a mixed machine is the one measured, not device 0."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    dev1 = DeviceInfo(1, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0")
    with Profiler(lambda s: [WhereAmI("where")], timer=FakeTimer(2), checker=fake_checker, devices=[dev1],
                  isolate=True, timeout_s=30) as prof:
        assert prof(SIG).winner.ms == 8.0  # physical 7 + 1


def _many_sigs(n):
    return [Signature.make("CBR", [(b, 8, 8, 8), (8, 8, 3, 3), None, None], ["float32"] * 2 + ["", ""], {})
            for b in range(1, n + 1)]


def _load_timer_unless_on(bad):
    """Unpickled in the worker: fails there when the worker is pinned to one of the ``bad`` GPUs."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in bad:
        raise RuntimeError(f"CUDA error on GPU {os.environ['CUDA_VISIBLE_DEVICES']}: device unavailable")
    return FakeTimer(2)


class _TimerBrokenOn:
    def __init__(self, *bad):
        self.bad = bad

    def __reduce__(self):
        return _load_timer_unless_on, (self.bad,)


H200S = [DeviceInfo(i, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0") for i in (0, 1)]


def test_a_gpu_whose_worker_cannot_start_is_retired_and_the_others_do_its_work(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    sigs = _many_sigs(4)
    with Profiler(lambda s: [WhereAmI("where")], timer=_TimerBrokenOn("5"), checker=fake_checker, devices=H200S,
                  isolate=True, timeout_s=30) as prof:
        prof.profile_many(sigs)
        assert {prof.memo[s.key()].winner.ms for s in sigs} == {8.0}  # all on physical GPU 7
        assert all(r.status == R.OK for s in sigs for r in prof.memo[s.key()].results)
        assert prof(_many_sigs(5)[-1]).winner.ms == 8.0  # later single profiles skip the retired GPU too


def test_when_every_gpu_worker_is_broken_each_signature_says_so_and_nothing_hangs(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    sigs = _many_sigs(3)
    with Profiler(lambda s: [WhereAmI("where")], timer=_TimerBrokenOn("5", "7"), checker=fake_checker,
                  devices=H200S, isolate=True, timeout_s=30) as prof:
        prof.profile_many(sigs)
        for s in sigs:
            res = prof.memo[s.key()]
            assert res.winner is None and [r.status for r in res.results] == [R.WORKER_FAILED]
            assert "device unavailable" in res.results[0].reason


class Waits(Candidate):
    """The first signature's launch waits until the second one has run (on the other GPU's worker)."""

    def build(self, sig, arch):
        return _WaitLaunch(self.param("dir"), sig.input_shapes[0][0])


class _WaitLaunch:
    behaviour = "ok"

    def __init__(self, folder, batch):
        self.folder, self.batch = Path(folder), batch

    def __call__(self, inputs, outputs):
        (self.folder / f"ran-{self.batch}").touch()
        if self.batch == 1:
            deadline = time.monotonic() + 30
            while not (self.folder / "ran-2").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # the second signature's reply is in long before this one's
        return float(self.batch)


class _WaitsFor:
    def __init__(self, folder):
        self.folder = str(folder)

    def __call__(self, sig):
        return [Waits("waits", (("dir", self.folder),))]


class _RecordingCache:
    def __init__(self):
        self.puts: list[str] = []

    def lookup(self, fingerprint, signature, candidates):
        return {}

    def put_many(self, records):
        self.puts.extend(r.signature for r in records)


def test_results_are_merged_in_input_order_whichever_gpu_finishes_first(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    sigs = _many_sigs(5)  # the first finishes last: the other worker does the rest meanwhile
    cache = _RecordingCache()
    merged_at_advance = []
    with Profiler(_WaitsFor(tmp_path), timer=FakeTimer(2), checker=fake_checker, devices=H200S, cache=cache,
                  isolate=True, timeout_s=60) as prof:
        prof.profile_many(sigs, advance=lambda label: merged_at_advance.append(len(prof.memo)))
        assert list(prof.memo) == [s.key() for s in sigs]
        assert [prof.memo[s.key()].winner.ms for s in sigs] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert cache.puts == [s.key() for s in sigs]
    # the bar moved for the second signature before anything could be merged (the first was not done)
    assert len(merged_at_advance) == 5 and merged_at_advance[0] == 0


def test_inline_runner_runs_inside_its_device(monkeypatch):
    import sys
    import types
    from contextlib import contextmanager

    entered = []

    @contextmanager
    def device(i):
        entered.append(i)
        yield
        entered.append(-i)

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(Device=device)))
    seen = []

    def checker(sig, launch):
        seen.append(list(entered))
        return None

    rep = InlineRunner(FakeTimer(1), checker, device_index=1).run(SIG, cand("a", 0.5))
    assert rep["status"] == R.OK and seen == [[1]] and entered == [1, -1]
    monkeypatch.setitem(sys.modules, "cupy", None)  # device 0 (the current one) never imports CuPy
    assert InlineRunner(FakeTimer(1), checker, device_index=0).run(SIG, cand("a", 0.5))["status"] == R.OK


class _Unloadable:
    """Pickles fine here, but the worker cannot unpickle it (its module does not exist there)."""

    def __reduce__(self):
        import importlib

        return importlib.import_module, ("graphopt_no_such_module_for_tests",)

    def __call__(self, launch, inputs, outputs):
        return [1.0]


def test_a_worker_that_cannot_start_is_reported_once_and_never_cached(tmp_path):
    with IsolatedRunner(_Unloadable(), fake_checker, timeout_s=10) as runner:
        res = profile_node(SIG, [cand("a", 0.1), cand("b", 0.2)], timer=FakeTimer(), checker=fake_checker,
                           runner=runner)
        assert runner.workers_started == 1  # not retried for every candidate
    assert [r.status for r in res.results] == [R.WORKER_FAILED, R.WORKER_FAILED] and res.winner is None
    assert "graphopt_no_such_module_for_tests" in res.results[0].reason
    with TuningCache(tmp_path / "c.sqlite3") as cache:
        with Profiler(CountingZoo([cand("a", 0.1)]), timer=_Unloadable(), checker=fake_checker, device=H200,
                      cache=cache, timeout_s=10) as prof:
            assert prof(SIG).results[0].status == R.WORKER_FAILED
        assert len(cache) == 0


def test_timeouts_are_not_cached(tmp_path):
    with TuningCache(tmp_path / "c.sqlite3") as cache:
        with Profiler(CountingZoo([cand("hang", 0.1, "hang"), cand("ok", 0.3)]), timer=FakeTimer(2),
                      checker=fake_checker, device=H200, cache=cache, timeout_s=1.5) as prof:
            res = prof(SIG)
        assert [r.status for r in res.results] == [R.TIMEOUT, R.OK]
        assert [r.lowering for r in cache.entries()] == ["ok"]


SCRIPT = """
import sys
from graphopt.tune.candidate_run import FakeTimer
from graphopt.tune.profiler import profile_node
from test_tune_profiler import SIG, cand, fake_checker
print("RAN")  # a script without an `if __name__ == "__main__"` guard
res = profile_node(SIG, [cand("a", 0.3), cand("b", 0.1), cand("boom", 0.01, "segfault")], timer=FakeTimer(),
                   checker=fake_checker, isolate=True, timeout_s=20)
print("WINNER", res.winner.lowering, [r.status for r in res.results])
"""


def test_isolation_works_from_a_script_without_a_main_guard(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    script = tmp_path / "export_and_tune.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here.parents[1]), str(here)]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("RAN") == 1, out.stdout  # the worker never re-ran the caller's script
    assert "WINNER b ['ok', 'ok', 'crashed']" in out.stdout


class _TurnLog:
    """A checker that logs when each worker holds the GPU for a check: kind, pid, start, end."""

    def __init__(self, path):
        self.path = str(path)

    def __call__(self, sig, launch):
        t0 = time.time()
        time.sleep(0.03)
        with open(self.path, "a") as f:
            f.write(f"c {os.getpid()} {t0} {time.time()}\n")
        return None


class _TimedTurnLog(FakeTimer):
    """The fake timer, logging when each worker holds the GPU for a timing."""

    def __init__(self, path, reps: int = 2):
        super().__init__(reps)
        self.path = str(path)

    def __call__(self, launch, inputs, outputs):
        t0 = time.time()
        time.sleep(0.03)
        times = super().__call__(launch, inputs, outputs)
        with open(self.path, "a") as f:
            f.write(f"t {os.getpid()} {t0} {time.time()}\n")
        return times


def _two_candidates(sig):
    return [cand("a", 1.0), cand("b", 2.0)]


def test_workers_sharing_a_gpu_take_turns_on_it(tmp_path):
    """workers_per_gpu=3: signatures spread over three workers of one GPU (one lock per GPU). A
    timing never overlaps anything else on the GPU; checks may overlap one another. The report
    counts the time spent waiting for a turn."""
    dev = DeviceInfo(0, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0")
    log = tmp_path / "turns.txt"
    with Profiler(_two_candidates, timer=_TimedTurnLog(log), checker=_TurnLog(log),
                  devices=[dev], isolate=True, timeout_s=60, workers_per_gpu=3) as prof:
        prof.profile_many(_many_sigs(9))
        assert all(prof.memo[s.key()].winner.lowering == "a" for s in _many_sigs(9))
        lock_dir = prof._lock_dir
        assert lock_dir and os.path.isdir(lock_dir)
        tt = prof.tuning_time()
    assert not os.path.exists(lock_dir)  # removed on close
    turns = [(kind, pid, float(a), float(b)) for kind, pid, a, b in (line.split() for line in log.read_text().splitlines())]
    assert len(turns) == 36 and len({pid for _, pid, _, _ in turns}) >= 2
    timings = [t for t in turns if t[0] == "t"]
    for t in timings:
        others = [u for u in turns if u is not t]
        assert not any(u[2] < t[3] and t[2] < u[3] for u in others), ("a timing overlapped", t)
    assert tt["workers_started"] == 3 and "wait" in tt["phases_s"]
    slow = tt["slowest_signatures"]  # each signature's wall time on its worker, the slowest first
    assert len(slow) == 8 and all(r["op"] == "CBR" and r["candidates"] == 2 and r["shape"] for r in slow)
    assert [r["seconds"] for r in slow] == sorted((r["seconds"] for r in slow), reverse=True)
    # each of the three figures is rounded to 1 ms: their sums may differ by up to 1.5 ms
    assert all(0 <= r["start_s"] and r["start_s"] + r["seconds"] <= tt["profile_wall_s"] + 2e-3 for r in slow)


def test_tuning_time_lists_the_slowest_signatures_with_their_start():
    from graphopt.tune.tuning_time import TuningTime

    tt = TuningTime()
    assert "slowest_signatures" not in tt.to_dict()
    for i, (start, secs) in enumerate([(100.0, 2.0), (100.5, 9.0), (101.0, 2.0), (103.0, 0.5)]):
        tt.signature("CBR" if i % 2 else "GemmAct", start, secs, 10 + i, f"{i}x8")
    d = tt.to_dict()
    assert d["profile_wall_s"] == 9.5
    assert [(r["op"], r["shape"], r["seconds"], r["start_s"], r["candidates"]) for r in d["slowest_signatures"]] == [
        ("CBR", "1x8", 9.0, 0.5, 11), ("GemmAct", "0x8", 2.0, 0.0, 10), ("GemmAct", "2x8", 2.0, 1.0, 12),
        ("CBR", "3x8", 0.5, 3.0, 13)]


def test_the_cli_line_names_the_wall_time_and_the_slowest_signature():
    from graphopt.cli_display import tuning_time_line

    tt = {"candidates_run": 12, "phases_s": {"build": 3.0, "time": 1.25, "check": 0.01}}
    assert tuning_time_line(tt) == "12 candidates: build 3.0 s, time 1.2 s"
    tt.update(profile_wall_s=4.5, slowest_signatures=[{"op": "CBR", "seconds": 2.5, "start_s": 0.0, "candidates": 9}])
    assert tuning_time_line(tt).endswith("; 4.5 s wall, the slowest signature 2.5 s (CBR, 9 candidates)")
    tt["slowest_signatures"][0]["shape"] = "32x64x56x56"
    assert tuning_time_line(tt).endswith("the slowest signature 2.5 s (CBR 32x64x56x56, 9 candidates)")
