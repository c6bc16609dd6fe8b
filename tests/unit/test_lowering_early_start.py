"""``graphopt.lowering.early_start``: the measured barrier (opt-in, ``GRAPHOPT_MEASURE_BARRIERS=1``).
Its reading of a captured graph, the driver structs it fills, and how a lowering's barrier uses the
answer: measured once after the first eager launch, left out only on a definite "cannot start early",
kept on any doubt. The capture itself runs on the device only (``bench/probe_early_start.py``)."""

from __future__ import annotations

import ctypes

import pytest

from graphopt.lowering import Lowering, early_start
from graphopt.lowering import barrier as barrier_module


def _graph(edges, names=("graphopt_order_marker", "lib_kernel", "lib_kernel2")):
    return {"nodes": [{"index": i, "type": "kernel", "kernel": n} for i, n in enumerate(names)],
            "edges": [{"from": a, "to": b, "type": t, "from_port": t} for a, b, t in edges]}


def test_only_a_programmatic_edge_out_of_the_marker_is_an_early_start():
    assert early_start.starts_after_marker_early(_graph([(0, 1, "programmatic"), (1, 2, "default")]))
    assert not early_start.starts_after_marker_early(_graph([(0, 1, "default"), (1, 2, "default")]))
    # between the launch's own kernels: the library's own ordering, there with the barrier as well
    assert not early_start.starts_after_marker_early(_graph([(0, 1, "default"), (1, 2, "programmatic")]))
    # a memset first (cuDNN's SDPA and conv plans): a memset node is never entered programmatically
    memset = {"nodes": [{"index": 0, "type": "kernel", "kernel": "graphopt_order_marker"}, {"index": 1, "type": "memset"},
                        {"index": 2, "type": "kernel", "kernel": "sdpa"}],
              "edges": [{"from": 0, "to": 1, "type": "default"}, {"from": 1, "to": 2, "type": "default"}]}
    assert not early_start.starts_after_marker_early(memset)
    assert early_start.early_kernels(_graph([(0, 1, "programmatic"), (1, 2, "programmatic")])) == ["lib_kernel", "lib_kernel2"]


def test_the_positive_control_is_a_kernel_of_its_own_launched_with_programmatic_serialization():
    # cuda.h: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6 (5 is a cluster scheduling hint)
    assert early_start.ATTR_PROGRAMMATIC_STREAM_SERIALIZATION == 6
    # the control's edge leaves the marker for a kernel that is not a marker: the reading counts it
    control = _graph([(0, 1, "programmatic")], names=(early_start.MARKER, early_start.CONTROL))
    assert early_start.CONTROL != early_start.MARKER and early_start.starts_after_marker_early(control)
    assert f"void {early_start.CONTROL}()" in early_start._SOURCE and f"void {early_start.MARKER}()" in early_start._SOURCE


def test_the_driver_structs_have_cudas_layout():
    cfg = early_start._LaunchConfig
    assert (cfg.hStream.offset, cfg.attrs.offset, cfg.numAttrs.offset) == (32, 40, 48)  # CUlaunchConfig
    assert ctypes.sizeof(early_start._LaunchAttribute) == 72 and early_start._LaunchAttribute.value.offset == 8
    assert early_start.EdgeData.type.offset == 2 and ctypes.sizeof(early_start.EdgeData) == 8


def test_off_unless_asked(monkeypatch):
    monkeypatch.delenv(early_start.ENV, raising=False)
    assert not early_start.enabled()
    monkeypatch.setenv(early_start.ENV, "0")
    assert not early_start.enabled()
    monkeypatch.setenv(early_start.ENV, "1")
    assert early_start.enabled()


def test_without_a_gpu_every_answer_keeps_the_barrier(monkeypatch):
    monkeypatch.setattr(early_start, "_STATE", {})
    assert early_start.starts_early(lambda i, o, w: None, [], [], None) in (True, None)
    problem = early_start.reader_problem()
    assert isinstance(problem, str) and problem  # no driver, no positive control: barriers stay


@pytest.fixture()
def barriers(monkeypatch):
    calls = []
    monkeypatch.setattr(barrier_module, "barrier", lambda: calls.append("barrier"))
    return calls


@pytest.mark.parametrize("answer, want", [(False, ["barrier", "launch", "launch", "launch"]),
                                          (True, ["barrier", "launch"] * 3),
                                          (None, ["barrier", "launch"] * 3)])
def test_a_measured_barrier_is_left_out_only_after_a_definite_no(monkeypatch, barriers, answer, want):
    monkeypatch.setenv(early_start.ENV, "1")
    asked = []
    monkeypatch.setattr(early_start, "starts_early", lambda launch, i, o, w: asked.append(1) or answer)
    low = Lowering(launch=lambda i, o, w: barriers.append("launch"), barrier=True)
    for _ in range(3):
        low.launch([], [], None)
    assert barriers == want
    assert len(asked) == (1 if answer is not None else 3)  # None (capturing): asked again next time
    assert low.needs_barrier is (answer is not False)


def test_without_the_variable_nothing_is_measured(monkeypatch, barriers):
    monkeypatch.delenv(early_start.ENV, raising=False)
    monkeypatch.setattr(early_start, "starts_early", lambda *a: pytest.fail("measured without the variable"))
    low = Lowering(launch=lambda i, o, w: barriers.append("launch"), barrier=True)
    low.launch([], [], None)
    low.launch([], [], None)
    assert barriers == ["barrier", "launch"] * 2 and low.needs_barrier


def test_a_plan_counts_measured_barriers_as_unneeded_and_keeps_the_rule_for_the_rest(monkeypatch):
    from types import SimpleNamespace

    from graphopt.runtime import ordering
    from graphopt.runtime.ordering import OPAQUE, ORDINARY

    monkeypatch.setattr(ordering, "step_end", lambda step, lw, *a: step.end)
    unneeded = Lowering(launch=lambda i, o, w: None, barrier=True)
    unneeded.launch.needed = False  # measured: cannot start early
    needed = Lowering(launch=lambda i, o, w: None, barrier=True)
    lows = [Lowering(launch=lambda i, o, w: None, ordinary=True), unneeded, needed, needed]
    steps = [SimpleNamespace(end=e, run=SimpleNamespace(lowered=SimpleNamespace(lowering=lw, launch=lw.launch)))
             for e, lw in zip([ORDINARY, OPAQUE, OPAQUE, OPAQUE], lows)]
    plan = SimpleNamespace(steps=steps)
    ordering.drop_needless_barriers(plan, [], [], set(), set(), (), (), ())
    assert plan.barriers == {"kept": 2, "dropped": 0, "unneeded": 1}
