"""The runtime's own Python cost per step, measured on the CPU (no GPU): the fake-CuPy backend of the
runtime tests, every custom op "lowered" to a launch that does nothing, so a custom step's time is
the runtime's work around ``launch`` (layout checks, output allocation, the loop); standard ops run
on NumPy at the smallest shapes (their time includes NumPy's own dispatch, the analogue of CuPy's).

    PYTHONPATH=. python bench/host_loop_cpu.py --out OUT            # this tree
    PYTHONPATH=/other/tree python bench/host_loop_cpu.py --out OUT  # another tree, same fake CuPy

Writes OUT/host_loop_cpu_<label>.json: per model, the whole run's host time per step (best of N) and
the median per-step time by op type. It predicts the direction and rough size of the change on the
device; the device number is ``graphopt bench`` / bench/e2e.py's host_us_per_node.
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

MODELS = {"gpt2": "models/torch/gpt2_dynamo_op18.onnx", "resnet18": "models/torch/resnet18_dynamo_op18.onnx",
          "resnet_style": "models/resnet_style.onnx"}


def install_fake():
    import _fake_cupy

    cp, extra = _fake_cupy.make()
    sys.modules["cupy"] = cp
    sys.modules.update(extra)
    return cp


def noop_lowerings():
    from graphopt.lowering.contract import Lowering
    from graphopt.runtime import backend, ops_custom

    backend.CudaBackend._build = lambda self, op, key, sig: (Lowering(launch=lambda i, o, w: None), None)
    ops_custom.lowering_key = lambda node, dims: "noop"


def measure(path: Path, repeats: int) -> dict:
    import graphopt
    from _runtime_helpers import random_feeds
    from graphopt.runtime import Session

    opt, _ = graphopt.optimize(str(path), gpu="none")
    feeds = random_feeds(opt, np.random.default_rng(0))
    sess = Session(opt, device="cuda", cuda_graphs=False)
    dev = {k: sess.backend.cupy.asarray(v) for k, v in feeds.items()}
    sess.run(dev)
    sess.run(dev)
    plan = sess.last_plan
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run(dev)
        best = min(best, time.perf_counter() - t0)
    per_op: dict[str, list[float]] = defaultdict(list)

    def timed(step, ins):
        t0 = time.perf_counter()
        outs = step.run(ins)
        per_op[step.op].append(time.perf_counter() - t0)
        return outs

    conv = sess._convert_feeds(dev)
    for _ in range(repeats):
        plan.execute(conv, timed)
    steps = len(plan.steps)
    return {"steps": steps, "run_us_per_step": best / steps * 1e6,
            "per_op_median_us": {op: statistics.median(ts) * 1e6 for op, ts in sorted(per_op.items())},
            "per_op_count": {op: len(ts) // repeats for op, ts in sorted(per_op.items())}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default=None)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    install_fake()
    noop_lowerings()
    import graphopt

    label = args.label or Path(graphopt.__file__).resolve().parents[1].name
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"label": label, "graphopt": str(Path(graphopt.__file__).resolve().parent), "models": {}}
    for name, rel in MODELS.items():
        res["models"][name] = measure(HERE / rel, args.repeats)
        (out / f"host_loop_cpu_{label}.json").write_text(json.dumps(res, indent=1))
        m = res["models"][name]
        print(f"{label} {name}: {m['steps']} steps, {m['run_us_per_step']:.1f} us/step (whole run)", flush=True)


if __name__ == "__main__":
    main()
