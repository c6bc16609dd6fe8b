"""Workers sharing a GPU take turns through one lock file (``GRAPHOPT_TUNE_GPU_LOCK``): a check holds
it shared (checks of several workers overlap), a timing holds it exclusively (nothing else runs on
the GPU while a candidate is timed). Probed from a second open file description, as another worker
process would see it."""

from __future__ import annotations

import fcntl

from graphopt.tune import candidate_run, results


class _Cand:
    def build(self, sig, arch):
        return lambda inputs, outputs: None


def _probe(path: str, mode: int) -> bool:
    """Whether another worker could take the lock in ``mode`` right now."""
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def test_checks_share_the_gpu_and_timings_hold_it_alone(tmp_path, monkeypatch):
    lock = str(tmp_path / "gpu0.lock")
    monkeypatch.setenv(candidate_run.GPU_LOCK_ENV, lock)
    seen = {}

    def checker(sig, launch):
        seen["check"] = (_probe(lock, fcntl.LOCK_SH), _probe(lock, fcntl.LOCK_EX))
        return None

    def timer(launch, inputs, outputs):
        seen["time"] = (_probe(lock, fcntl.LOCK_SH), _probe(lock, fcntl.LOCK_EX))
        return [0.01, 0.01]

    reply = candidate_run.run_one("sig", _Cand(), timer, checker, lambda sig: ([], [None]), "sm_90")
    assert reply["status"] == results.OK, reply
    assert seen["check"] == (True, False)  # another check may run, a timing may not
    assert seen["time"] == (False, False)  # nothing else
    assert {"build", "check", "time", "wait"} <= set(reply["phases"])


def test_a_wrong_candidate_is_never_timed(tmp_path, monkeypatch):
    monkeypatch.setenv(candidate_run.GPU_LOCK_ENV, str(tmp_path / "gpu0.lock"))
    timed = []
    reply = candidate_run.run_one("sig", _Cand(), lambda *a: timed.append(1) or [1.0], lambda s, l: "off by 2",
                              lambda sig: ([], [None]), "sm_90")
    assert reply["status"] == results.WRONG and timed == []


def test_without_a_lock_file_nothing_is_locked(monkeypatch):
    monkeypatch.delenv(candidate_run.GPU_LOCK_ENV, raising=False)
    reply = candidate_run.run_one("sig", _Cand(), lambda *a: [0.5], lambda s, l: None, lambda sig: ([], [None]), "sm_90")
    assert reply["status"] == results.OK and reply["samples"] == [0.5]
