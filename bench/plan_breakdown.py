"""Where the time of an optimized model goes on the graphopt runtime: device time per step (each step captured
alone into a CUDA graph and replayed between two events), grouped by
op and lowering, beside the CUDA-graph replay time of the whole plan and torch's time for the same model.

    python3 bench/plan_breakdown.py --models resnet50,gpt2 --batches 32,1 --out OUT

The models are built and exported exactly as in ``bench/e2e.py`` (torchvision / transformers configs,
random weights), optimized with ``--gpu none`` (the heuristic's lowerings: this script explains a plan,
it does not tune; ``--gpu-args "--gpu auto --precision fp16 --io-fp16"`` with GRAPHOPT_CACHE_DIR set to a
tuned cache explains the tuned plan instead, the choices served from the cache) and run in fp16. Writes OUT/plan_breakdown_<gpu>.json and .md after every model.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch_models  # noqa: E402  (the models and exports of bench/e2e.py)
from lowering_bench import gpu_tag, write_atomic  # noqa: E402
from runtime_bench import runtime_bench_meta, runtime_bench_parser  # noqa: E402


def lowering_of(step) -> str:
    node = getattr(step, "node", None)
    low = getattr(step, "lowering", None)
    return str(low or (getattr(node, "attrs", {}) or {}).get("lowering", "") or "")


def breakdown(sess, feed, repeats: int) -> dict:
    """Per step: its device time alone, from a CUDA graph of that one step replayed ``repeats`` times
    between two events (events around eager steps would measure the host, which is slower than the
    GPU here); a step that cannot be captured is timed eagerly with a synchronisation (labelled)."""
    cp = sess.backend.cupy
    stream = sess.backend.stream
    sess.run(feed)
    sess.synchronize()
    plan = sess.last_plan
    steps = []

    def timed(step, ins):
        t0 = time.perf_counter()
        outs = step.run(ins)
        stream.synchronize()
        host_sync = (time.perf_counter() - t0) * 1e6
        entry = {"label": step.label, "op": step.op, "lowering": lowering_of(step), "how": "graph"}
        try:
            stream.begin_capture()
            try:
                step.run(ins)
            finally:
                graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            for _ in range(repeats):
                graph.launch(stream)
            b.record(stream)
            b.synchronize()
            entry["device_us"] = cp.cuda.get_elapsed_time(a, b) * 1e3 / repeats
        except Exception as e:  # noqa: BLE001 - not capturable: eager time with a sync (host included)
            entry.update(how=f"eager+sync ({type(e).__name__})", device_us=host_sync)
        entry["host_us"] = host_sync
        steps.append(entry)
        return outs

    with stream:
        conv = sess._convert_feeds(feed)
        plan.execute(conv, timed)
    stream.synchronize()
    groups = defaultdict(lambda: [0, 0.0, 0.0])
    for s in steps:
        g = groups[f"{s['op']} [{s['lowering']}]" if s["lowering"] else s["op"]]
        g[0] += 1
        g[1] += s["device_us"]
        g[2] += s["host_us"]
    return {"steps": sorted(steps, key=lambda s: -s["device_us"]),
            "by_op": sorted(([op, n, d, h] for op, (n, d, h) in groups.items()), key=lambda r: -r[2]),
            "device_sum_us": sum(s["device_us"] for s in steps), "host_sum_us": sum(s["host_us"] for s in steps),
            "notes": list(sess.plan_summary().get("notes", []))}


def main() -> int:
    ap = runtime_bench_parser(__doc__, batches="32,1", repeats=20, repeats_help="graph replays per step")
    ap.add_argument("--variants", default="optimized,unoptimized", help="which models to break down")
    args = ap.parse_args()
    args.gpu_name = args.gpu_name or gpu_tag()
    import torch

    from graphopt.runtime import Session

    args.out.mkdir(parents=True, exist_ok=True)
    meta = runtime_bench_meta()
    res = {"meta": meta, "models": []}
    out_json = args.out / f"plan_breakdown_{args.gpu_name}.json"
    for name, bs in zip(args.models.split(","), [int(b) for b in args.batches.split(",")]):
        work = Path(tempfile.mkdtemp(prefix=f"pb_{name}_"))
        src = work / f"{name}.onnx"
        module = torch_models.build_module(name)
        torch_models.export(name, module, src)
        opt = work / f"{name}.opt.onnx"
        shape = torch_models.input_shape(name, bs)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "graphopt.cli", "optimize", str(src), "-o", str(opt),
                            *args.gpu_args.split(), "--shape", shape, "-q"], capture_output=True, text=True)
        entry = {"model": name, "bs": bs, "optimize_s": time.perf_counter() - t0, "optimize_rc": r.returncode,
                 "optimize_err": r.stderr[-400:]}
        x = torch_models.example_input(name, bs).cuda()
        feed = {"input": x}  # example_input: float32 images or int64 token ids, as the exports take
        for label, path in [(lb, pa) for lb, pa in (("optimized", opt), ("unoptimized", src))
                            if lb in args.variants.split(",")]:
            try:
                sess = Session(path, device="cuda", dtype="float16")
                sess.run(feed)
                sess.synchronize()
                reps = []
                for _ in range(30):
                    t = time.perf_counter()
                    sess.run(feed)
                    sess.synchronize()
                    reps.append((time.perf_counter() - t) * 1e3)
                entry[f"{label}_graph_ms"] = float(np.median(reps))
                entry[f"{label}_graph_status"] = sess.graph_status
                es = Session(path, device="cuda", dtype="float16", cuda_graphs=False)
                entry[label] = breakdown(es, feed, args.repeats)
            except Exception as e:  # noqa: BLE001
                import traceback

                entry[f"{label}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                entry[f"{label}_traceback"] = traceback.format_exc()[-2500:]
                print(traceback.format_exc()[-2500:], flush=True)
        mod = module.to("cuda").half()
        xt = x if not x.is_floating_point() else x.half()
        with torch.inference_mode():
            for _ in range(5):
                mod(xt)
            torch.cuda.synchronize()
            ts = []
            for _ in range(30):
                t = time.perf_counter()
                mod(xt)
                torch.cuda.synchronize()
                ts.append((time.perf_counter() - t) * 1e3)
        entry["torch_eager_ms"] = float(np.median(ts))
        res["models"].append(entry)
        write_atomic(out_json, json.dumps(res, indent=1))
        print(json.dumps({k: v for k, v in entry.items() if k not in ("optimized", "unoptimized")}), flush=True)
        if "optimized" in entry:
            o = entry["optimized"]
            print(f"  device sum {o['device_sum_us']:.0f} us, host sum {o['host_sum_us']:.0f} us", flush=True)
            for op, n, d, h in o["by_op"][:12]:
                print(f"  {op:28s} n={n:4d} device {d:9.1f} us  host {h:9.1f} us", flush=True)
            for s in o["steps"][:25]:
                print(f"    {s['label'][:60]:60s} {s['device_us']:8.1f} {s['how'][:20]}", flush=True)
            print("  notes:", o["notes"][:20], flush=True)
    md = [f"# Plan breakdown ({meta['date']}, {meta['gpu']})", "", f"command: `{meta['command']}`", ""]
    for e in res["models"]:
        md.append(f"## {e['model']} bs{e['bs']}: graph replay {e.get('optimized_graph_ms')} ms optimized, "
                  f"{e.get('unoptimized_graph_ms')} ms unoptimized, torch eager {e['torch_eager_ms']:.2f} ms")
        if "optimized" in e:
            md += ["", "| op | nodes | device us | host us |", "|---|---:|---:|---:|"]
            md += [f"| {op} | {n} | {d:.1f} | {h:.1f} |" for op, n, d, h in e["optimized"]["by_op"]]
            md += ["", "notes: " + "; ".join(e["optimized"]["notes"][:30]), ""]
    write_atomic(args.out / f"plan_breakdown_{args.gpu_name}.md", "\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
