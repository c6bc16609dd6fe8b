"""bench/lowering_bench.TunerChoice on fake candidates (no GPU): the tuner's choice is the fastest correct
candidate of every provider, and each provider's best is reported under its module's name."""

from __future__ import annotations


from graphopt.lowering.contract import Candidate, Signature
from graphopt.tune.candidate_run import FakeTimer
from graphopt.tune.runners import InlineRunner
from graphopt.tune.tuner import TuningBackend
from _scripts import load_script



def _lb():
    return load_script("bench/lowering_bench.py")


class Own(Candidate):
    def applies(self, sig, cc):
        return "prune me" if self.param("ms") is None else None

    def build(self, sig, arch):
        ms, wrong = self.param("ms"), self.param("wrong", 0)
        launch = lambda ins, outs: ms  # noqa: E731 - a fake launch returns its time
        launch.wrong = wrong
        return launch


class Cudnn(Own):
    pass


Cudnn.__module__ = "graphopt.providers.cudnn"


def _checker(sig, launch):
    return "wrong answer" if getattr(launch, "wrong", 0) else None


def test_choice_and_best_per_provider():
    cands = [Own("own_a", (("ms", 0.5),)), Own("own_b", (("ms", 0.2),)), Own("own_pruned", (("ms", None),)),
             Cudnn("cudnn", (("ms", 0.01), ("wrong", 1))), Cudnn("cudnn", (("ms", 0.1),))]
    backend = TuningBackend(lambda sig: cands, FakeTimer(), _checker, lambda sig: ([], []))
    lb = _lb()
    runner = InlineRunner(backend.timer, backend.checker, backend.buffers, "sm_90")
    tc = lb.TunerChoice(backend=backend, runner=runner, compute_capability=(9, 0), arch="sm_90")
    got = tc.profile(Signature.make("CBR", [(1, 3, 8, 8), (4, 3, 1, 1)], ["float16"] * 2, {}))
    assert got["chosen"] == "cudnn:ms=0.1" and got["graphopt_us"] == 100.0 and got["chosen_provider"] == "cudnn"
    assert got["best_by_provider"] == {"own": {"us": 200.0, "key": "own_b:ms=0.2"}, "cudnn": {"us": 100.0, "key": "cudnn:ms=0.1"}}
    assert "cudnn:ms=0.01,wrong=1" in got["failures"] and list(got["pruned"]) == ["own_pruned:ms=None"]
    assert got["provider"]["own_a:ms=0.5"] == "own"
    assert lb.geomean([2.0, 8.0, None]) == 4.0
