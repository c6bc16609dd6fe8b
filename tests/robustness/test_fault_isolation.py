"""Issue 6 part 4: a lowering candidate that takes its process down (segfault, os._exit, abort, hang,
an illegal-address error) is isolated in the profiler's worker and scored as failed; the optimize
run itself finishes, picks a candidate that works, and writes a correct model.

On the CPU the faults are fake candidates (tests/robustness/_faulty.py) run through the real
isolated worker. The GPU version with real faulting kernels is tests/gpu/test_fault_isolation_gpu.py.
The control test shows the fake faults are real: without isolation the segfault kills the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h

from tests.robustness import _faulty

ROOT = Path(__file__).resolve().parents[2]


def _conv_model(cout: int = 4) -> onnx.ModelProto:
    rng = np.random.default_rng(cout)
    w = onnx.numpy_helper.from_array(rng.standard_normal((cout, 3, 3, 3)).astype(np.float32), "w")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
                      h.make_node("Relu", ["c"], ["y"], name="relu")], "g",
                     [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 8, 8])], [w])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def _in_child(kind: str, isolate: bool, cache_dir: Path, result: Path) -> int:
    """Optimize the conv model in a forked child on the faulty fake GPU; returns its exit status
    (negative: killed by that signal). The child writes the report and the output model to ``result``."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import faulthandler

            faulthandler.disable()  # pytest's handler would dump the control test's segfault to the log
            os.environ["GRAPHOPT_CACHE_DIR"] = str(cache_dir)
            _faulty.pretend_faulty_gpu(kind, isolate=isolate)
            import graphopt

            out, rep = graphopt.optimize(_conv_model(), gpu="h200")
            onnx.save(out, str(result.with_suffix(".onnx")))
            result.write_text(json.dumps({"mode": rep.mode, "summary": rep.selection_summary, "lowerings": rep.lowerings}))
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixed")
    code = _in_child("mixed", True, d / "cache", d / "report.json")
    return code, d


def test_control_without_isolation_the_fault_kills_the_run(tmp_path):
    """The fake fault is real: profiled in-process (isolate=False), the segfault takes the run down."""
    code = _in_child("mixed", False, tmp_path / "cache", tmp_path / "report.json")
    assert code == -11 and not (tmp_path / "report.json").exists(), code


def test_crashing_candidates_are_isolated_and_the_run_finishes(mixed_run):
    code, d = mixed_run
    assert code == 0
    rep = json.loads((d / "report.json").read_text())
    assert rep["mode"] == "profiled", rep["summary"]
    (row,) = rep["lowerings"]
    assert (row["lowering"], row["params"]) == ("fast_ok", "how=ok,ms=0.2"), row
    got = {t["lowering"]: (t["status"], t["reason"]) for t in row["timings"]}
    assert set(got) == set(_faulty.EXPECTED), got
    for name, (status, text) in _faulty.EXPECTED.items():
        assert got[name][0] == status and text in got[name][1], (name, got[name])


def test_the_output_of_a_run_with_crashes_is_correct(mixed_run):
    _, d = mixed_run
    out = onnx.load(str(d / "report.onnx"))
    assert [n.op_type for n in out.graph.node] == ["CBR"]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in out.graph.node[0].attribute}["lowering"] == b"fast_ok"
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(out, x), _run(_conv_model(), x), rtol=1e-5, atol=1e-5)


def test_crashes_are_cached_as_failures_and_not_rerun(mixed_run):
    """Crashes say something about the candidate: they are cached (status crashed, ms inf) and a later
    run does not execute them again. A timeout is not cached (the GPU may have been busy)."""
    from graphopt.tune.cache import TuningCache
    from graphopt.tune.cache_file import CACHE_FILE

    _, d = mixed_run
    with TuningCache(d / "cache" / CACHE_FILE) as c:
        stored = {e.lowering: e for e in c.entries()}
    assert set(stored) == set(_faulty.EXPECTED) - {"hang"}
    for name in ("segv", "exit", "abort"):
        assert stored[name].status == "crashed" and not stored[name].ok
    assert stored["fast_ok"].ok and stored["slow_ok"].ok


def test_when_every_candidate_crashes_the_run_falls_back_to_the_heuristic(tmp_path):
    code = _in_child("all_crash", True, tmp_path / "cache", tmp_path / "report.json")
    assert code == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    (row,) = rep["lowerings"]
    assert row["mode"] == "heuristic" and "every candidate failed" in row["reason"], row
    assert "SIGSEGV" in row["reason"] and f"exit code {_faulty.EXIT_CODE}" in row["reason"], row
    assert "fell back to the heuristic" in rep["summary"], rep["summary"]


def test_through_the_cli_a_crashing_candidate_is_not_a_crash(tmp_path):
    """The real command line (patched only to see the fake GPU): exit 0, no traceback, an output."""
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_conv_model(), str(src))
    env = dict(os.environ, GRAPHOPT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    env.pop("GRAPHOPT_DEBUG", None)
    r = subprocess.run([sys.executable, "-m", "tests.robustness._faulty", "mixed", "optimize", str(src), "--gpu", "h200",
                        "-o", str(dst)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr + r.stdout and "internal error" not in r.stderr + r.stdout
    (node,) = onnx.load(str(dst)).graph.node
    assert node.op_type == "CBR" and {a.name: a.s for a in node.attribute}["lowering"] == b"fast_ok"
    assert "profiled" in r.stdout, r.stdout


# ------------------------------------------------------------------ the GPU test's faulting kernels, on the CPU
def test_the_gpu_fault_kernels_compile_under_nvrtc():
    """tests/gpu/test_fault_isolation_gpu.py runs these on the device; here NVRTC (no GPU) checks that
    they compile for sm_80 and sm_90, ptxas included, so that test cannot fail for a typo."""
    from tests.robustness import _gpu_faults as F

    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"NVRTC not importable: {exc}")
    for arch in ("sm_80", "sm_90"):
        prog = nvrtc.createProgram(F.FAULT_SOURCE, "faults.cu", [], [])
        try:
            nvrtc.compileProgram(prog, ["-std=c++17", f"-arch={arch}"])
            cubin = nvrtc.getCUBIN(prog)
        finally:
            nvrtc.destroyProgram(prog)
        assert cubin[:4] == b"\x7fELF"
        for how in F.KERNELS:
            assert f"graphopt_fault_{how}".encode() in cubin


def test_the_gpu_fault_candidates_travel_to_the_worker():
    """The worker unpickles (sig, candidate): the faulting candidates must survive that, and the
    end-to-end list puts them before the real candidates."""
    import pickle

    from graphopt.lowering.contract import Signature
    from tests.robustness import _gpu_faults as F

    for how in F.KERNELS:
        c = F.faulting(how)
        back = pickle.loads(pickle.dumps(c))
        assert back == c and type(back).__module__ == "tests.robustness._gpu_faults"
    sig = Signature.make("CBR", [(1, 16, 12, 12), (32, 16, 3, 3)], ["float32"] * 2, {"activation": "Relu", "pads": [1, 1, 1, 1]})
    names = [c.name for c in F.faults_then_real(sig)]
    assert names[:2] == ["fault_store", "fault_trap"] and len(names) > 2 and not any(n.startswith("fault_") for n in names[2:])
