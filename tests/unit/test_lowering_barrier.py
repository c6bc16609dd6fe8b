"""The stream barrier of the lowering contract: a lowering that declares ``barrier`` enqueues it
before every launch (the runtime, the checker and the timer all go through ``launch``), one that
does not never does. Why it exists: ``graphopt.lowering.barrier``'s docstring (a whole-plan CUDA
graph of cuDNN lowerings raced on the H200 without it)."""

from __future__ import annotations

import pytest

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


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
    except Exception as exc:  # noqa: BLE001 - no NVRTC here (the CPU test extras install it)
        pytest.skip(f"NVRTC not importable: {exc}")
    return nvrtc


def test_the_barrier_kernel_compiles_and_releases_its_dependents_from_sm90():
    """The barrier's source compiles for sm_80 and sm_90; from sm_90 it releases the next
    (programmatic dependent launch) kernel as soon as it starts, before sm_90 it is empty."""
    nvrtc = _nvrtc()
    for arch, release in (("sm_80", False), ("sm_90", True)):
        prog = nvrtc.createProgram(barrier_module._SOURCE, "barrier.cu", [], [])
        try:
            nvrtc.compileProgram(prog, [f"-arch={arch}"])
            ptx = nvrtc.getPTX(prog)
            ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
            assert ("griddepcontrol.launch_dependents" in ptx) is release, arch
            assert nvrtc.getCUBIN(prog)[:4] == b"\x7fELF"
        finally:
            nvrtc.destroyProgram(prog)
