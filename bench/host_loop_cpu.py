"""The runtime's own Python cost per step, measured on the CPU (no GPU), on the device's run path.

The fake CuPy of the runtime tests (``tests/runtime/_fake_cupy.py``, ``make(graphs=True)``: stream
captures succeed and their graphs launch as no-ops, kernel launches count and do nothing), with
step graphs on as on the GPU, fp16 as ``bench/host_overhead.py`` runs it. Custom ops get the
lowerings the fp16 heuristic picks on the H200, built as follows:

- GemmAct: the real cuBLASLt provider (``graphopt.providers.cublaslt``: descriptors, algorithm,
  the launch's pointer and ctypes work) over a library stand-in whose calls return at once;
- every other custom op: a lowering declared like cuDNN's CBR (barrier, capturable, NHWC, a
  workspace) whose launch does nothing. It fills one output, so GPT-2's LayerNorms that keep their
  sum run the CuPy fallback here, which on the device they do not (the heuristic's ``rows`` kernel
  writes both outputs); declaring every output instead hands those steps the NumPy arrays the fake's
  standard ops return, which have no device pointer to key a step replay on.

So a step's time is the runtime's own work around the launch plus the fake's (NumPy) allocation
and pointer reads, never a kernel. ``calls per step`` counts what would be a CuPy / CUDA call on
the device (graph launches, kernel launches, allocations, pointer reads, capture queries): each
costs ~0.5-3 us there, so it predicts the device change better than the CPU microseconds.

    PYTHONPATH=. python bench/host_loop_cpu.py --out OUT [--label NAME] [--models resnet50,gpt2]

Writes OUT/host_loop_cpu_<label>.json and prints a table: per model the whole run's host time per
step (best and median of N), and per op the median us per step and the calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "tests" / "runtime"))  # _fake_cupy, _runtime_helpers of this tree
sys.path.insert(0, str(HERE / "tests" / "unit"))  # _fake_cublaslt

MODELS = {"resnet50": "models/torch/resnet50_dynamo_op18.onnx", "gpt2": "models/torch/gpt2_dynamo_op18.onnx",
          "resnet18": "models/torch/resnet18_dynamo_op18.onnx"}


class _NullLt:
    """libcublasLt stand-in: FakeLt's descriptor bookkeeping, and a matmul that returns at once."""

    def __new__(cls):
        from _fake_cublaslt import FakeLt

        class Lt(FakeLt):
            def cublasLtMatmul(self, *args):
                import _fake_cupy

                _fake_cupy.CALLS["cublasLtMatmul"] = _fake_cupy.CALLS.get("cublasLtMatmul", 0) + 1
                return 0

        return Lt()


def install_fakes():
    import _fake_cupy

    cp, extra = _fake_cupy.make(graphs=True)
    sys.modules["cupy"] = cp
    sys.modules.update(extra)
    from graphopt.providers import cublaslt as prov
    from graphopt.providers import cublaslt_lib as lt

    lt._STATE.update(api=lt.Api(_NullLt()), reason=None)
    prov._SETUPS.clear()
    return cp, _fake_cupy.CALLS


def device_like_lowerings():
    """GemmAct through cuBLASLt (fake library), every other custom op a cuDNN-like no-op lowering."""
    from graphopt.lowering.contract import Lowering
    from graphopt.runtime import backend

    real = backend.CudaBackend._build

    def build(self, op, key, sig):
        if op == "GemmAct":
            return real(self, op, "cublaslt", sig)
        layouts = ("NHWC", "NHWC", "", "NHWC", "NHWC") if op == "CBR" else ()
        return Lowering(launch=lambda i, o, w: None, workspace_bytes=1 << 16, capturable=True, barrier=True,
                        layouts=layouts), None

    backend.CudaBackend._build = build


def measure(path: Path, repeats: int, calls: dict) -> dict:
    import graphopt
    from _runtime_helpers import random_feeds
    from graphopt.runtime import Session

    opt, _ = graphopt.optimize(str(path), gpu="none")
    feeds = random_feeds(opt, np.random.default_rng(0))
    sess = Session(opt, device="cuda", dtype="float16", cuda_graphs=False)
    sess.backend.step_graphs = True  # as on a real CuPy (the fake has no RawModule)
    dev = {k: sess.backend.cupy.asarray(v) for k, v in feeds.items()}
    for _ in range(3):  # trace; steps seen; step graphs recorded
        sess.run(dev)
    walls = []
    for _ in range(repeats):  # (no device to hold or wait for: graphopt.runtime.host_time's method without the hold)
        t0 = time.perf_counter()
        sess.run(dev)
        walls.append(time.perf_counter() - t0)
    plan = sess.last_plan
    steps = len(plan.steps)
    per_op: dict[str, list[float]] = defaultdict(list)
    per_calls: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def timed(step, ins):
        before = dict(calls)
        t0 = time.perf_counter()
        outs = step.run(ins)
        per_op[step.op].append(time.perf_counter() - t0)
        for k, v in calls.items():
            per_calls[step.op][k] += v - before.get(k, 0)
        return outs

    conv = sess._convert_feeds(dev)
    with sess.backend.stream:
        for _ in range(repeats):
            plan.execute(conv, timed)
    count = defaultdict(int)
    for s in plan.steps:
        count[s.op] += 1
    n_runs = repeats
    return {"steps": steps, "run_us_per_step": min(walls) / steps * 1e6,
            "run_us_per_step_median": statistics.median(walls) / steps * 1e6,
            "per_op_median_us": {op: statistics.median(ts) * 1e6 for op, ts in sorted(per_op.items())},
            "per_op_count": dict(sorted(count.items())),
            "per_op_calls_per_step": {op: {k: round(v / (n_runs * count[op]), 2) for k, v in sorted(c.items()) if v}
                                      for op, c in sorted(per_calls.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default=None)
    ap.add_argument("--models", default="resnet50,gpt2",
                    help=f"names of {sorted(MODELS)} or NAME=PATH.onnx (an export, e.g. from bench/torch_models.py)")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    _, calls = install_fakes()
    device_like_lowerings()
    import graphopt

    label = args.label or Path(graphopt.__file__).resolve().parents[1].name
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"label": label, "graphopt": str(Path(graphopt.__file__).resolve().parent), "models": {}}
    for item in args.models.split(","):
        name, _, path = item.partition("=")
        res["models"][name] = m = measure(Path(path) if path else HERE / MODELS[name], args.repeats, calls)
        (out / f"host_loop_cpu_{label}.json").write_text(json.dumps(res, indent=1))
        print(f"{label} {name}: {m['steps']} steps, {m['run_us_per_step']:.1f} us/step (whole run, best; "
              f"median {m['run_us_per_step_median']:.1f})", flush=True)
        for op, us in sorted(m["per_op_median_us"].items(), key=lambda kv: -kv[1]):
            c = m["per_op_calls_per_step"].get(op, {})
            print(f"  {op:18s} x{m['per_op_count'][op]:<3d} {us:7.1f} us/step  calls/step: "
                  + ", ".join(f"{k} {v:g}" for k, v in c.items()), flush=True)


if __name__ == "__main__":
    main()
