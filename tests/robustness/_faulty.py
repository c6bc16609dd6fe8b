"""Fake candidates that take their process down, for the fault-isolation tests.

A real kernel that faults the GPU (illegal address, trap) leaves its CUDA context unusable and can
kill its process; on a CPU machine the same threat is a launch that segfaults, calls ``os._exit``,
aborts, or hangs. ``pretend_faulty_gpu`` makes ``graphopt.optimize(..., gpu="h200")`` profile these
in the profiler's isolated worker process (``isolate=True``, the real default), so the tests exercise
the real isolation path: worker process, pipes, crash detection and replacement, timeout.

Everything here is module-level: the worker unpickles the candidates, checker and timer.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time

from graphopt.lowering.contract import Candidate
from graphopt.tune.candidate_run import FakeTimer
from graphopt.tune.tuner import TuningBackend
from tests.robustness._fake_gpu import GPUS

EXIT_CODE = 7
HANG_TIMEOUT_S = 3.0  # the profiler's per-candidate timeout in these tests


def _segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV, as a faulting kernel's host code would


class FaultyCand(Candidate):
    """``how`` (a param) says how its launch fails: ok | segfault | exit | abort | hang | raise.
    ``ms`` is the simulated time of a launch that returns."""

    def applies(self, sig, cc=(9, 0)):
        return None

    def source_hash(self):
        return "faulty-" + self.name

    def build(self, sig, arch):
        how, ms = self.param("how"), float(self.param("ms", 1.0))

        def launch(inputs, outputs):
            if how == "segfault":
                _segfault()
            elif how == "exit":
                os._exit(EXIT_CODE)
            elif how == "abort":
                os.abort()
            elif how == "hang":
                time.sleep(3600)
            elif how == "raise":
                raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered (simulated)")
            return ms

        return launch


def cand(name: str, how: str, ms: float = 1.0) -> FaultyCand:
    return FaultyCand(name, (("how", how), ("ms", ms)))


# Crashers first, so every good candidate after them runs in a replacement worker.
MIXED = [cand("segv", "segfault", 0.01), cand("exit", "exit", 0.01), cand("abort", "abort", 0.01),
         cand("hang", "hang", 0.01), cand("illegal", "raise", 0.01), cand("slow_ok", "ok", 0.5), cand("fast_ok", "ok", 0.2)]
ALL_CRASH = [cand("segv", "segfault"), cand("exit", "exit")]

EXPECTED = {"segv": ("crashed", "SIGSEGV"), "exit": ("crashed", f"exit code {EXIT_CODE}"), "abort": ("crashed", "SIGABRT"),
            "hang": ("timeout", "timed out"), "illegal": ("error", "cudaErrorIllegalAddress"),
            "slow_ok": ("ok", ""), "fast_ok": ("ok", "")}


def mixed_candidates(sig):
    return list(MIXED)


def crashing_candidates(sig):
    return list(ALL_CRASH)


def check_by_launching(sig, launch):
    """The checker: like the real one, it runs the launch once (that is where a fault happens)."""
    launch([], [])
    return None


def _no_buffers(sig):
    return [], []


BACKENDS = {
    "mixed": TuningBackend(mixed_candidates, FakeTimer(3), check_by_launching, _no_buffers),
    "all_crash": TuningBackend(crashing_candidates, FakeTimer(3), check_by_launching, _no_buffers),
}


def pretend_faulty_gpu(kind: str = "mixed", *, isolate: bool = True) -> None:
    """Patch this process so the pipeline sees an h200 and profiles the ``kind`` candidates."""
    import graphopt.tune.tuner as tuner

    real = getattr(tuner.tune_graph, "__wrapped__", tuner.tune_graph)
    tuner.tune_graph = functools.wraps(real)(functools.partial(
        real, devices=[GPUS["h200"]], backend=BACKENDS[kind], isolate=isolate, timeout_s=HANG_TIMEOUT_S))


def cli_main() -> None:
    """``python -m tests.robustness._faulty KIND graphopt-args...``: the real CLI on the faulty GPU."""
    import sys

    pretend_faulty_gpu(sys.argv[1])
    from graphopt.cli import main

    sys.argv = ["graphopt"] + sys.argv[2:]
    main()


if __name__ == "__main__":
    # Run through the importable module, not ``__main__``: the worker unpickles the candidates by
    # module path, and ``__main__.FaultyCand`` does not exist in the worker.
    from tests.robustness._faulty import cli_main as _main

    _main()
