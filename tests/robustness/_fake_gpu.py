"""A fake GPU for CPU tests of the whole optimize path with profiling: ``pretend_gpu(name)`` makes
``graphopt.optimize(..., gpu=name)`` detect that GPU and profile fake candidates with a fake timer
(the seams tests/unit/test_tune_tuner.py uses), so runs write real tuning-cache entries."""

from __future__ import annotations

import functools

from graphopt.lowering.contract import Candidate
from graphopt.tune.candidate_run import FakeTimer
from graphopt.tune.gpus import DeviceInfo
from graphopt.tune.tuner import TuningBackend

GPUS = {
    "a100": DeviceInfo(0, "NVIDIA A100-SXM4-80GB", "a100", (8, 0), "13.0", "13.0", "14.2.0"),
    "h200": DeviceInfo(0, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0"),
}


class FakeCand(Candidate):
    """A candidate whose launch returns its simulated time (``ms`` param) instead of running."""

    def applies(self, sig, cc=(9, 0)):
        return None

    def source_hash(self):
        return "fake-" + self.name

    def build(self, sig, arch):
        ms = float(self.param("ms"))
        return lambda inputs, outputs: ms


def fake_candidates(sig):
    if sig.op == "GemmAct":
        return [FakeCand("cublas_epilogue", (("ms", 0.5),)), FakeCand("tiled_gemm", (("ms", 0.2),))]
    return [FakeCand("direct", (("ms", 1.0),)), FakeCand("implicit_gemm", (("bm", 64), ("ms", 0.25)))]


def _ok(sig, launch):
    return None


def _no_buffers(sig):
    return [], []


BACKEND = TuningBackend(fake_candidates, FakeTimer(3), _ok, _no_buffers)


def pretend_gpu(name: str) -> None:
    """Patch this process so the pipeline's ``tune_graph`` sees GPU ``name`` and profiles in-process."""
    import graphopt.tune.tuner as tuner

    real = getattr(tuner.tune_graph, "__wrapped__", tuner.tune_graph)
    tuner.tune_graph = functools.wraps(real)(functools.partial(real, devices=[GPUS[name]], backend=BACKEND, isolate=False))
