"""Which lowering barriers a compiled plan drops (``graphopt.runtime.ordering``): only right after a
step known to end with a normally launched kernel that releases nothing early; never after a library
call, a memory copy, an unknown step or at the plan's start; steps with no stream work are looked
through. The whole-plan check on the fake CuPy is in ``tests/runtime/test_runtime_run_path.py``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from graphopt.lowering import Lowering
from graphopt.runtime import ordering
from graphopt.runtime.ordering import NOTHING, OPAQUE, ORDINARY, barrier_free, step_end

ELEMENTWISE = ("Add", "Relu", "Transpose")
POOLS = ("MaxPool",)
RESHAPES = ("Reshape",)


def test_a_barrier_is_dropped_only_right_after_an_ordinary_launch():
    ends = [ORDINARY, OPAQUE, ORDINARY, NOTHING, OPAQUE, OPAQUE, ORDINARY]
    needs = [True, True, False, False, True, True, True]
    # 0: the plan's start (what the caller ran before is unknown): kept; 1: after an ordinary
    # kernel: dropped; 4: after a view (no work) that follows an ordinary kernel: dropped;
    # 5 and 6: after a library call: kept
    assert barrier_free(ends, needs) == [1, 4]


def test_the_environment_keeps_every_barrier(monkeypatch):
    monkeypatch.setenv(ordering.KEEP_ENV, "1")
    assert barrier_free([ORDINARY, OPAQUE], [False, True]) == []
    monkeypatch.setenv(ordering.KEEP_ENV, "0")
    assert barrier_free([ORDINARY, OPAQUE], [False, True]) == [1]


def _step(op, inputs, outputs, kind="std", perm=None):
    return SimpleNamespace(op=op, kind=kind, inputs=list(inputs), outputs=list(outputs),
                           node=SimpleNamespace(attr=lambda name, default=None: perm if name == "perm" else default))


def _lowered(shape, **kw):
    return SimpleNamespace(lowering=Lowering(launch=lambda i, o, w: None, **kw), out_shape=shape)


def _end(step, lowered=None, direct=False, arrays=None, blocks=None, feeds=()):
    arrays = arrays if arrays is not None else [np.zeros((2, 3), np.float16)] * 4
    blocks = blocks if blocks is not None else list(range(len(arrays)))
    return step_end(step, lowered, direct, arrays, blocks, set(feeds), ELEMENTWISE, POOLS, RESHAPES)


def test_a_lowering_is_ordinary_only_when_it_declares_it_and_has_work():
    step = _step("CBR", [0], [1], kind="custom")
    assert _end(step, _lowered((2, 3), ordinary=True)) == ORDINARY
    assert _end(step, _lowered((2, 3))) == OPAQUE  # undeclared: a library may be inside
    assert _end(step, _lowered((2, 3), ordinary=True, barrier=True)) == ORDINARY
    empty = [np.zeros((0, 3), np.float16)] * 2
    assert _end(step, _lowered((0, 3), ordinary=True), arrays=empty) == OPAQUE  # launches nothing


def test_standard_steps():
    assert _end(_step("Add", [0, 1], [2]), direct=True) == ORDINARY
    assert _end(_step("MaxPool", [0], [1]), direct=True) == ORDINARY
    assert _end(_step("Add", [0, 1], [2]), direct=False) == OPAQUE  # the generic path: not known
    assert _end(_step("MatMul", [0, 1], [2]), direct=True) == OPAQUE  # cuBLAS
    assert _end(_step("Softmax", [0], [1]), direct=True) == OPAQUE
    empty = [np.zeros((0,), np.float16)] * 3
    assert _end(_step("Add", [0, 1], [2]), direct=True, arrays=empty) == OPAQUE
    assert _end(_step("Reshape", [0, 1], [2]), blocks=[7, 8, 7, 9]) == NOTHING  # a view of its input
    assert _end(_step("Reshape", [0, 1], [2]), blocks=[7, 8, 9, 9]) == OPAQUE  # a copy


@pytest.mark.parametrize("shape,perm,want", [
    ((4, 5, 6), (0, 2, 1), ORDINARY),   # a real transpose: CuPy's elementwise copy
    ((4, 5, 6), (0, 1, 2), OPAQUE),     # the identity: a memcpy
    ((1, 5, 6), (1, 0, 2), OPAQUE),     # moves only a unit dimension: still dense, a memcpy
    ((4, 5, 6), None, ORDINARY),        # no perm: reversed
])
def test_a_transpose_is_ordinary_unless_cupy_copies_it_with_a_memcpy(shape, perm, want):
    arrays = [np.zeros(shape, np.float16), np.zeros(shape, np.float16)]
    assert _end(_step("Transpose", [0], [1], perm=perm), direct=True, arrays=arrays) == want
    assert _end(_step("Transpose", [0], [1], perm=perm), direct=True, arrays=arrays, feeds=[0]) == OPAQUE


def test_own_kernel_families_declare_ordinary_launches_and_library_callers_do_not():
    from graphopt.kernels import registry
    from graphopt.providers import cublaslt, cudnn

    ordinary, other = set(), set()
    for make in registry._FAMILIES.values():
        for cand in make():
            (ordinary if cand.ordinary_launch else other).add(cand.name)
    assert {"cublas", "cublas_ws", "cublas_softmax", "cublas_glu"} <= other
    assert {"flash", "flash_mma", "mma_gemm", "rows", "direct", "stem", "depthwise_nhwc"} <= ordinary
    for module in (cudnn, cublaslt):  # the vendor providers never declare it
        assert not any(getattr(obj, "ordinary_launch", False) for obj in vars(module).values() if isinstance(obj, type))


def test_build_lowering_declares_the_familys_ordinary_launch():
    from graphopt.lowering import build_lowering
    from graphopt.lowering.contract import Candidate, Signature

    class Own(Candidate):
        ordinary_launch = True

        def build(self, sig, arch):
            return lambda i, o: None

    class Library(Candidate):
        def build(self, sig, arch):
            return Lowering(launch=lambda i, o, w: None, barrier=True)

    class Duck:  # a user's family need not subclass Candidate
        def build(self, sig, arch):
            return lambda i, o: None

    sig = Signature("X", ((2,),), ("float16",), ())
    assert build_lowering(Own("own"), sig, "sm_90").ordinary is True
    low = build_lowering(Library("lib"), sig, "sm_90")
    assert low.ordinary is False and low.unordered_launch is not low.launch
    assert build_lowering(Duck(), sig, "sm_90").ordinary is False


def test_all_barriers_kept_restores_the_callers_setting(monkeypatch):
    monkeypatch.setenv(ordering.KEEP_ENV, "0")
    with ordering.all_barriers_kept():
        assert barrier_free([ORDINARY, OPAQUE], [False, True]) == []
    assert barrier_free([ORDINARY, OPAQUE], [False, True]) == [1]
    monkeypatch.delenv(ordering.KEEP_ENV)
    with pytest.raises(RuntimeError):
        with ordering.all_barriers_kept():
            raise RuntimeError("a failed run")
    assert ordering.KEEP_ENV not in __import__("os").environ


def test_graphopt_bench_notes_the_plans_barriers(monkeypatch):
    """``graphopt bench``'s row for a CUDA session says how many lowering barriers ran, were dropped
    after an ordinary launch and were measured unneeded; a plan without any says nothing of them."""
    from graphopt.runtime import bench

    def sess(barriers):
        return SimpleNamespace(device="cuda", graph_status="replaying a CUDA graph", run=lambda f: None,
                               synchronize=lambda: None, plan_summary=lambda: {"barriers": barriers})

    t = bench.time_session("optimized", sess({"kept": 12, "dropped": 36, "unneeded": 0}), {}, 1, repeats=2, warmup=0)
    assert t.note == "CUDA graphs: replaying a CUDA graph; stream barriers: 12 kept, 36 dropped, 0 unneeded"
    t = bench.time_session("optimized", sess({"kept": 0, "dropped": 0, "unneeded": 0}), {}, 1, repeats=2, warmup=0)
    assert t.note == "CUDA graphs: replaying a CUDA graph"
