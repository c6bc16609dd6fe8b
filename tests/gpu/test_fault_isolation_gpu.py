"""Issue 6 part 4 (GPU): a candidate kernel that faults the GPU (illegal address, trap) or hangs is
isolated in the profiler's worker process and scored as failed; the real candidates after it still
pass in a fresh worker, the optimize run finishes with a real lowering and a correct model, and this
process's own CUDA context is unharmed.

The faulting kernels are in tests/robustness/_gpu_faults.py (their source is compiled on the CPU in
CI by tests/robustness/test_fault_isolation.py). The CPU version with fake crashes is
tests/robustness/test_fault_isolation.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto  # noqa: E402
from onnx import helper as h  # noqa: E402

from graphopt.kernels import applicable  # noqa: E402
from graphopt.lowering.contract import Signature  # noqa: E402
from graphopt.kernels.check import buffers, checker  # noqa: E402
from graphopt.kernels.timing import cuda_event_timer  # noqa: E402
from graphopt.tune import results as R  # noqa: E402
from graphopt.tune.gpus import detect_devices  # noqa: E402
from graphopt.tune.profiler import profile_node  # noqa: E402
from graphopt.tune.runners import IsolatedRunner  # noqa: E402
from tests.robustness import _gpu_faults as F  # noqa: E402

SIG = Signature.make("CBR", [(1, 16, 12, 12), (32, 16, 3, 3)], ["float32", "float32"],
                     {"activation": "Relu", "pads": [1, 1, 1, 1]})
FAILED = (R.ERROR, R.CRASHED)


def _device():
    return detect_devices()[0]


def _names_a_cuda_error(reason: str) -> bool:
    """A CUDA fault as CuPy reports it: the runtime's ``cudaError...`` or, when the fault surfaces in a
    driver call (a module load, a launch), ``CUDADriverError: CUDA_ERROR_...`` (H200, 2026-12-05)."""
    return "cudaError" in reason or "CUDA_ERROR_" in reason


def _parent_cuda_still_works():
    a = cupy.arange(1000, dtype=cupy.float32)
    assert float(a.sum()) == 499500.0


def test_faulting_kernels_score_inf_and_real_candidates_after_them_pass():
    dev = _device()
    real, _ = applicable(SIG, dev.compute_capability)
    assert real, "no real candidate applies to the test signature"
    cands = [F.faulting("store"), F.faulting("trap"), *real[:3], F.faulting("store", "_again"), *real[3:4]]
    runner = IsolatedRunner(cuda_event_timer, checker, buffers, dev.arch, timeout_s=120)
    with runner:
        res = profile_node(SIG, cands, timer=cuda_event_timer, checker=checker, buffers=buffers,
                           compute_capability=dev.compute_capability, arch=dev.arch, runner=runner)
    by = {r.candidate: r for r in res.results}
    store, trap, again = (by[F.faulting(*a).key()] for a in (("store",), ("trap",), ("store", "_again")))
    for r in (store, trap, again):
        assert r.status in FAILED and math.isinf(r.ms), r
    if store.status == R.ERROR:  # the worker survived long enough to report the CUDA error
        assert _names_a_cuda_error(store.reason), store.reason
    # A poisoned context would fail the real candidates after a fault with a sticky cudaError (or a
    # crash); a wrong answer would be that kernel's own bug, not an isolation failure.
    for c in real[:4]:
        r = by[c.key()]
        assert r.status not in FAILED and not _names_a_cuda_error(r.reason), (c.key(), r.status, r.reason)
    assert any(by[c.key()].ok for c in real[:4]), [(c.key(), by[c.key()].status) for c in real[:4]]
    assert res.winner is not None and not res.winner.lowering.startswith("fault_")
    # each fault cost its worker: store | trap | real x3, store again | the last real one
    assert runner.workers_started >= 4, runner.workers_started  # more if a real one is wrong
    _parent_cuda_still_works()


def test_a_hanging_kernel_is_killed_by_the_timeout():
    dev = _device()
    real, _ = applicable(SIG, dev.compute_capability)
    res = profile_node(SIG, [F.faulting("spin"), real[0]], timer=cuda_event_timer, checker=checker, buffers=buffers,
                       compute_capability=dev.compute_capability, arch=dev.arch, timeout_s=15)
    spin, good = res.results
    assert spin.status == R.TIMEOUT and "timed out" in spin.reason, spin
    assert good.status not in FAILED and not _names_a_cuda_error(good.reason), (good.status, good.reason)
    _parent_cuda_still_works()


def _conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32), "w")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
                      h.make_node("Relu", ["c"], ["y"], name="relu")], "g",
                     [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 12, 12])], [w])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def test_optimize_with_faulting_candidates_finishes_with_a_real_lowering(tmp_path, monkeypatch):
    import graphopt
    import graphopt.tune.tuner as tuner

    real_backend, why = tuner.kernels_backend()
    assert real_backend is not None, why
    faulty = tuner.TuningBackend(F.faults_then_real, real_backend.timer, real_backend.checker, real_backend.buffers)
    monkeypatch.setattr(tuner, "kernels_backend", lambda: (faulty, ""))
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path / "cache"))
    out, rep = graphopt.optimize(_conv_model(), gpu="auto")
    assert rep.mode == "profiled", rep.selection_summary
    (row,) = rep.lowerings
    assert not row["lowering"].startswith("fault_"), row
    status = {t["lowering"]: t["status"] for t in row["timings"]}
    assert status["fault_store"] in FAILED and status["fault_trap"] in FAILED, status
    assert sum(s == R.OK for s in status.values()) >= 1, status
    x = np.random.default_rng(1).standard_normal((1, 16, 12, 12)).astype(np.float32)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]  # noqa: E731
    np.testing.assert_allclose(run(out), run(_conv_model()), rtol=1e-4, atol=1e-4)
    _parent_cuda_still_works()
