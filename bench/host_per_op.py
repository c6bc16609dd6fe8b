"""Where a model's host time per node goes on the device, step by step: for the small models of
``tests/gpu/test_runtime_gpu.py``'s host-overhead check (optimized with the heuristic's lowerings, as that
test does), the per-node figure the test asserts (``graphopt.runtime.bench.host_overhead_us``), the host
time by op (``host_time.per_op``) and every step that waits for the device (``host_time.blocking_steps``:
a synchronisation or a full launch queue inside a run is host time the per-node figure counts).

    python3 bench/host_per_op.py --out OUT [--models torch/gpt2_dynamo_op18.onnx,transformer_block.onnx]

Writes OUT/host_per_op_<gpu>.json after every model. Needs a GPU (CuPy).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))  # the test's own random feeds (valid ids, mask ones)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="torch/gpt2_dynamo_op18.onnx,transformer_block.onnx,resnet_style.onnx")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)

    import graphopt
    from _runtime_helpers import random_feeds
    from graphopt.runtime import Session, host_time
    from graphopt.runtime.bench import host_overhead_us
    from lowering_bench import gpu_tag
    from runtime_bench import gpu_name, versions

    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": gpu_name(False),
           "versions": versions(), "command": " ".join(["python3", "bench/host_per_op.py"] + (argv or sys.argv[1:])),
           "models": []}
    path = args.out / f"host_per_op_{gpu_tag()}.json"
    for name in [m for m in args.models.split(",") if m]:
        src = str(ROOT / "models" / name)
        opt, report = graphopt.optimize(src, gpu="none")
        feeds = random_feeds(onnx.load(src), np.random.default_rng(3))
        sess = Session(opt, device="cuda", cuda_graphs=False)
        us, steps = host_overhead_us(sess, feeds, repeats=args.repeats)
        by_op = host_time.per_op(sess, feeds, 10)
        waits = host_time.blocking_steps(sess, feeds)
        lowerings = sorted({(n.op_type, next((a.s.decode() for a in n.attribute if a.name == "lowering"), ""))
                            for n in opt.graph.node if n.domain == "graphopt"})
        row = {"model": name, "nodes": len(opt.graph.node), "steps": steps, "host_us_per_node": round(us, 2),
               "per_op": by_op, "blocking_steps": waits, "lowerings": lowerings}
        doc["models"].append(row)
        print(f"{name}: {us:.1f} us per node over {steps} steps; by op {by_op[:6]}; waits {waits[:4]}", flush=True)
        path.write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
