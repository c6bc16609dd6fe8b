"""graphopt.runtime.replay.StepReplay bookkeeping, with a stand-in for CuPy's streams and graphs (CPU):
a graph is recorded on the second run with the same input addresses, replayed after, never while the
stream is being captured, at most MAX_GRAPHS per step, and a step whose recording fails launches."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

from graphopt.runtime import replay
from graphopt.runtime.replay import StepReplay


class FakeGraph:
    def __init__(self, log):
        self.log = log

    def launch(self, stream):
        self.log.append("replay")


class FakeStream:
    def __init__(self, env, capturing=False):
        self.env, self.capturing = env, capturing

    def is_capturing(self):
        return self.capturing

    def begin_capture(self):
        self.env.recording = True

    def end_capture(self):
        self.env.recording = False
        if self.env.refuse:
            raise RuntimeError("operation not permitted when stream is capturing")
        return FakeGraph(self.env.log)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeCupy:
    def __init__(self):
        self.log, self.recording, self.refuse = [], False, False
        self.main = FakeStream(self)
        env = self

        class Pool:
            def malloc(self, n):
                return n

        @contextmanager
        def using_allocator(fn):
            yield

        self.cuda = SimpleNamespace(get_current_stream=lambda: env.main, MemoryPool=Pool,
                                    Stream=lambda non_blocking=True: FakeStream(env), using_allocator=using_allocator)


def arr(ptr):
    return SimpleNamespace(data=SimpleNamespace(ptr=ptr))


def make(cp):
    outs = ["out"]

    def run(ins):
        cp.log.append("record" if cp.recording else "launch")
        return outs

    return StepReplay(run, outs, cp), outs


def test_recorded_on_the_second_run_replayed_after():
    cp = FakeCupy()
    step, outs = make(cp)
    x = [arr(100), None]
    assert step(x) is outs and step(x) is outs and step(x) is outs
    assert cp.log == ["launch", "record", "replay", "replay"]  # the second run records, then replays it
    assert step.stats == {"replayed": 1, "recorded": 1, "launched": 1}


def test_new_addresses_launch_first_and_the_graphs_are_bounded():
    cp = FakeCupy()
    step, _ = make(cp)
    for p in (1, 2, 3):
        step([arr(p)])
        step([arr(p)])
    assert len(step.graphs) == replay.MAX_GRAPHS
    cp.log.clear()
    step([arr(3)])  # past the bound: launched, never recorded
    step([arr(1)])
    assert cp.log == ["launch", "replay"]


def test_never_replayed_or_recorded_inside_a_capture():
    cp = FakeCupy()
    step, _ = make(cp)
    step([arr(7)])
    cp.main.capturing = True
    step([arr(7)])
    assert cp.log == ["launch", "launch"] and not step.graphs
    cp.main.capturing = False
    step([arr(7)])
    cp.main.capturing = True
    step([arr(7)])  # the whole-plan capture records the launch itself, not a replay
    assert cp.log[-1] == "launch"


def test_a_step_that_refuses_capture_launches_from_then_on():
    cp = FakeCupy()
    cp.refuse = True
    step, outs = make(cp)
    assert step([arr(5)]) is outs and step([arr(5)]) is outs and step([arr(5)]) is outs
    assert step.failed and not step.graphs
    assert cp.log == ["launch", "record", "launch", "launch"]  # the failed recording's run still launched
