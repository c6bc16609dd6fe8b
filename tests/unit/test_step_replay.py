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


class Unread:
    """An input whose address must never be read (a constant or an arena view: it cannot move)."""

    @property
    def data(self):
        raise AssertionError("a stable input's address was read")


def test_only_the_moving_inputs_are_read_for_the_key():
    cp = FakeCupy()
    outs = ["out"]
    step = StepReplay(lambda ins: (cp.log.append("record" if cp.recording else "launch"), outs)[1], outs, cp,
                      moving=(1,))
    for _ in range(3):
        assert step([Unread(), arr(9), Unread()]) is outs
    assert cp.log == ["launch", "record", "replay", "replay"]
    assert step.stats == {"replayed": 1, "recorded": 1, "launched": 1}
    cp.log.clear()
    step([Unread(), arr(10), Unread()])  # the moving input moved: launched, not replayed
    assert cp.log == ["launch"]
    none_moving = StepReplay(lambda ins: outs, outs, cp, moving=())
    for _ in range(3):
        none_moving([Unread()])
    assert none_moving.stats == {"replayed": 1, "recorded": 1, "launched": 1}


def test_fresh_outputs_are_part_of_the_key_and_returned_every_run():
    cp = FakeCupy()
    blocks = iter([arr(500), arr(500), arr(600), arr(500), arr(500)])
    got = []

    def launch(a):
        ins, outs = a
        cp.log.append("record" if cp.recording else "launch")
        got.append(outs[0].data.ptr)

    step = replay.FreshStepReplay(launch, lambda: [next(blocks)], cp, moving=(0,))
    x = [arr(1)]
    results = [step(x)[0].data.ptr for _ in range(5)]
    assert results == [500, 500, 600, 500, 500]  # each run's own output array is what it returns
    # 500: launched, then recorded (second sight); 600: a new address, launched; 500 again: replayed
    assert cp.log == ["launch", "record", "replay", "launch", "replay", "replay"]
    assert step.stats == {"replayed": 2, "recorded": 1, "launched": 2}


def test_the_memory_of_seen_addresses_is_bounded():
    cp = FakeCupy()
    step, _ = make(cp)
    for p in range(replay.MAX_SEEN * 3):
        step([arr(p)])
    assert len(step.seen) <= replay.MAX_SEEN and not step.graphs
