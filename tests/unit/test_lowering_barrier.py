"""The stream barrier of the lowering contract: a lowering that declares ``barrier`` enqueues it
before every launch (the runtime, the checker and the timer all go through ``launch``), one that
does not never does. Why it exists: ``graphopt.lowering.barrier``'s docstring (a whole-plan CUDA
graph of cuDNN lowerings raced on the H200 without it)."""

from __future__ import annotations

from graphopt.lowering import Lowering, as_lowering
from graphopt.lowering import barrier as barrier_module


def test_a_declared_barrier_runs_before_every_launch(monkeypatch):
    order = []
    monkeypatch.setattr(barrier_module, "barrier", lambda: order.append("barrier"))
    low = Lowering(launch=lambda i, o, w: order.append(("launch", w)), barrier=True)
    low.launch([1], [2], "ws")
    low([1], [2])  # the profiler's and the tests' way
    assert order == ["barrier", ("launch", "ws"), "barrier", ("launch", None)]


def test_no_barrier_unless_declared(barrier_calls):
    seen = []
    Lowering(launch=lambda i, o, w: seen.append(w)).launch([], [], None)
    as_lowering(lambda i, o: seen.append("bare"))([], [])
    assert seen == [None, "bare"] and barrier_calls == []


def test_the_barrier_is_looked_up_at_launch_time(monkeypatch):
    """Built once, launched many times: the barrier function is found when the launch runs, so a
    lowering built before the barrier was first compiled (or patched) still uses it."""
    low = Lowering(launch=lambda i, o, w: None, barrier=True)
    calls = []
    monkeypatch.setattr(barrier_module, "barrier", lambda: calls.append(1))
    low.launch([], [], None)
    low.launch([], [], None)
    assert calls == [1, 1]
