"""Why a whole-plan CUDA graph of a tuned model can compute what its eager run does not.

    python3 bench/diagnose_capture.py --model torch:resnet50 --shape input=32x3x224x224 --out OUT/diagnose_capture.json

On the H200 (bench/results/diagnose_resnet50_h200.json) the tuned ResNet-50 at bs32 fp16 was right
eager and with each step replayed from its own graph, but wrong, and different on every replay,
from the whole-plan graph; the first wrong tensor was a cuDNN conv+residual+ReLU in layer4. A
result that changes between replays of one graph on one input is a race between neighbouring
kernels: the back-to-back launches of a graph let a kernel start before its predecessor is done
where the launch allows it (programmatic dependent launch), which eager runs hide behind their
host gaps. This script captures the same plan several ways and compares each with the eager run:

- ``plain``: as the runtime captures it;
- (first run only) ``barrier_all`` / ``barrier_vendor``: a one-byte memset node after every step
  / every cuDNN or cuBLASLt step (a graph node that is not a kernel ends any programmatic overlap
  between the kernels either side of it): both right on every replay;
- ``barrier_before_vendor``: the memset only before steps that run a cuDNN or cuBLASLt lowering;
- ``barrier_before_cudnn`` / ``_before_cublaslt`` / ``_after_cublaslt``: one library's steps only;
- ``barrier_before_far_vendor``: before vendor steps that read a tensor written two or more steps
  earlier (a kernel that may start before its predecessor ends is safe for its predecessor's
  outputs, which it waits for, but not transitively for older ones);
- ``kernel_barrier_before_vendor``: an empty one-thread kernel instead of the memset.

Since the runtime drops a lowering's own barrier after an ordinary launch (``graphopt.runtime.ordering``),
``plain`` runs with that rule and ``keep_barriers`` with every lowering barrier kept
(``GRAPHOPT_KEEP_BARRIERS=1``); each row's ``lowering_barriers`` says how many were kept and dropped.

For each: max relative error against the eager output, whether three replays agree, and the
replay time (median of CUDA-event timings). Writes ``--out`` after every variant.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

VENDORS = ("cudnn", "cublaslt")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from diagnose_outputs import log, max_rel, model_file, parse_shape  # noqa: E402
from lowering_bench import write_atomic  # noqa: E402

def wrap(plan, cupy, where: str) -> int:
    """Put a barrier (a one-byte memset node, or an empty kernel for ``kernel_*``) before or after the
    steps ``where`` names; returns how many were put."""
    dummy = cupy.zeros(256, dtype=cupy.uint8)
    plan._diag_dummy = dummy
    kernel = cupy.ElementwiseKernel("", "raw uint8 d", "if (i == 0) d[0] = 0;", "graphopt_diag_barrier")
    use_kernel = where.startswith("kernel_")
    where = where[len("kernel_"):] if use_kernel else where

    def barrier():
        if use_kernel:
            kernel(dummy, size=1)
        else:
            cupy.cuda.runtime.memsetAsync(dummy.data.ptr, 0, 1, cupy.cuda.get_current_stream().ptr)

    producer = {}
    for k, (step, *_) in enumerate(plan.loop):
        for s in step.outputs:
            if s is not None:
                producer[s] = k
    n = 0
    for k, (step, *_) in enumerate(plan.loop):
        provider = str(step.lowering or "").split(":")[0]
        vendor = provider in VENDORS
        far = any(s is not None and producer.get(s, k - 1) < k - 1 for s in step.inputs)
        after = where == "all" or (where == "vendor" and vendor) or (where == "after_cublaslt" and provider == "cublaslt")
        before = (where == "before_vendor" and vendor) or (where == "before_cudnn" and provider == "cudnn") \
            or (where == "before_cublaslt" and provider == "cublaslt") or (where == "before_far_vendor" and vendor and far)
        if not (after or before):
            continue
        run = step.run

        def wrapped(ins, run=run, after=after, before=before):
            if before:
                barrier()
            outs = run(ins)
            if after:
                barrier()
            return outs

        step.run = wrapped
        n += 1
    return n


def replay_ms(sess, feed, cupy, n: int = 50) -> float:
    """Median ms of ``sess.run(feed)`` by CUDA events on the session's stream (host gaps before the
    launch included)."""
    stream = sess.backend.stream
    times = []
    for _ in range(n):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record(stream)
        sess.run(feed)
        b.record(stream)
        b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b))
    return float(np.median(times))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--shape", required=True)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)

    import cupy
    import onnx

    import graphopt
    from graphopt.runtime import Session, to_numpy

    doc: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join([sys.executable] + sys.argv),
                 "git": os.environ.get("HEAD_COMMIT"), "model": args.model, "shape": args.shape, "variants": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        write_atomic(args.out, json.dumps(doc, indent=1, default=str))

    path = str(model_file(args.model)[0])
    name, dims = parse_shape(args.shape)
    t0 = time.perf_counter()
    model, _ = graphopt.optimize(path, gpu="auto", shapes={name: dims}, precision="fp16", io_fp16=True)
    doc["optimize_s"] = round(time.perf_counter() - t0, 1)
    doc["node_attrs"] = {n.name: {a.name: str(onnx.helper.get_attribute_value(a))[:200] for a in n.attribute
                                  if a.name.startswith("lowering")}
                         for n in model.graph.node if n.domain == "graphopt" and "layer4.0" in n.name}
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float16)
    feed = {name: cupy.asarray(x)}
    out_name = model.graph.output[0].name
    eager = Session(model, device="cuda", cuda_graphs=False, step_graphs=False)
    ref = to_numpy(eager.run(feed)[out_name]).copy()
    del eager
    log(f"optimized in {doc['optimize_s']} s; eager reference taken")
    from graphopt.runtime import ordering

    for variant, where in (("plain", None), ("keep_barriers", "keep"), ("barrier_before_vendor", "before_vendor"),
                           ("barrier_before_cudnn", "before_cudnn"), ("barrier_before_cublaslt", "before_cublaslt"),
                           ("barrier_after_cublaslt", "after_cublaslt"), ("barrier_before_far_vendor", "before_far_vendor"),
                           ("kernel_barrier_before_vendor", "kernel_before_vendor")):
        try:
            with ordering.all_barriers_kept() if where == "keep" else contextlib.nullcontext():
                sess = Session(model, device="cuda")
                sess.run(feed)  # traced and compiled (where == "keep": every lowering barrier kept)
            n = wrap(sess.last_plan, cupy, where) if where and where != "keep" else 0
            outs = [to_numpy(sess.run(feed)[out_name]).copy() for _ in range(4)]  # capture, then replays
            row = {"barriers": n, "lowering_barriers": dict(sess.last_plan.barriers), "graph_status": sess.graph_status,
                   "max_rel_vs_eager": [round(max_rel(o, ref), 6) for o in outs],
                   "replays_agree": bool(all(np.array_equal(outs[1], o) for o in outs[2:])),
                   "replay_ms": round(replay_ms(sess, feed, cupy), 4)}
            del sess
        except Exception as e:  # noqa: BLE001
            row = {"error": f"{type(e).__name__}: {e}"[:300]}
        doc["variants"][variant] = row
        log(f"{variant}: {row}")
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
