"""Where the time of one ``Session.run`` goes when it replays a whole-plan CUDA graph (issue 15).

    python3 bench/graph_run_overhead.py --model torch:resnet50 --shape input=32x3x224x224 --out OUT/graph_run_overhead.json

On the H200 (2026-12-04) the tuned ResNet-50 at bs32 fp16 replayed in 1.286 ms timed with CUDA events
around ``sess.run`` (bench/results/diagnose_capture_resnet50_h200_barrier.json) but 1.404 ms in
bench/e2e.py, which times ``sess.run`` + ``synchronize`` on the host with a torch tensor as the feed.
This script measures, in one process and one run, on the same session:

- ``event_ms``: CUDA events around ``sess.run`` (what the stream sees, host gaps before the launch included);
- ``wall_cupy_ms``: host wall time of ``sess.run`` + ``synchronize``, CuPy feed (e2e's method);
- ``wall_torch_ms``: the same with the torch tensor e2e passes (DLPack on every run);
- ``host_only_us``: the host time of ``sess.run`` alone (no synchronisation inside the timing);
- the top functions of a cProfile of 300 runs.

Medians of ``--repeats`` runs. Tuning comes from ``GRAPHOPT_CACHE_DIR`` (carry a tuned cache), else
``--gpu`` decides.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from diagnose_capture import replay_ms  # noqa: E402
from diagnose_outputs import log, model_file, parse_shape  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--shape", required=True)
    ap.add_argument("--gpu", default="auto")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)

    import cupy
    import torch

    import graphopt
    from graphopt.runtime import Session

    path = str(model_file(args.model)[0])
    name, dims = parse_shape(args.shape)
    model, report = graphopt.optimize(path, gpu=args.gpu, shapes={name: dims}, precision="fp16", io_fp16=True)
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float16)
    feed_cupy = {name: cupy.asarray(x)}
    feed_torch = {name: torch.from_numpy(x).cuda()}
    sess = Session(model, device="cuda")
    for _ in range(5):
        sess.run(feed_cupy)
    sess.synchronize()
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join([sys.executable] + sys.argv),
           "git": os.environ.get("HEAD_COMMIT"), "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "graph_status": sess.graph_status, "selection": report.selection_summary}

    def wall(feed):
        t = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sess.run(feed)
            sess.synchronize()
            t.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(t))

    def host_only(feed):
        t = []
        for _ in range(args.repeats):
            sess.synchronize()
            t0 = time.perf_counter()
            sess.run(feed)
            t.append((time.perf_counter() - t0) * 1e6)
        sess.synchronize()
        return float(np.median(t))

    doc["event_ms"] = round(replay_ms(sess, feed_cupy, cupy, args.repeats), 4)
    doc["wall_cupy_ms"] = round(wall(feed_cupy), 4)
    doc["wall_torch_ms"] = round(wall(feed_torch), 4)
    doc["host_only_cupy_us"] = round(host_only(feed_cupy), 1)
    doc["host_only_torch_us"] = round(host_only(feed_torch), 1)
    log(str({k: v for k, v in doc.items() if k.endswith(("_ms", "_us"))}))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        sess.run(feed_torch)
        sess.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    doc["cprofile_top"] = s.getvalue().splitlines()[:60]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print("\n".join(doc["cprofile_top"][:45]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
