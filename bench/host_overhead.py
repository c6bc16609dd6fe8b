"""Host time per node of the graphopt runtime without CUDA graphs (issue 15: at most 15 us), on the
device, for the optimized and unoptimized ResNet-50 and GPT-2 of bench/e2e.py, with where it goes.

    python3 bench/host_overhead.py --out OUT [--models resnet50,gpt2] [--batches 1,1] [--gpu-args "--gpu none"]

Per model: ``host_us_per_node`` (``graphopt.runtime.host_time.measure``: the best eager run's
wall time with the GPU held busy by a spin kernel and every synchronisation outside the timed
region, divided by its steps: what ``graphopt bench`` and e2e.py report; beside it the median, the
thread's CPU time and the figure without the hold), the compiled plan's arena (bytes, live lower
bound, workspaces), and the host time per step by op (``host_time.per_op``: a hook timing each
``step.run`` in a held run). Models are built and
exported as in e2e.py and optimized with ``--gpu-args`` (default: the heuristic's lowerings, no
tuning: this measures the runtime, not the kernels). Writes OUT/host_overhead_<gpu>.json and .md
after every model; each optimize is limited to --optimize-timeout seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch_models  # noqa: E402  (the models and exports of bench/e2e.py)
from lowering_bench import gpu_tag, write_atomic  # noqa: E402
from runtime_bench import runtime_bench_meta, runtime_bench_parser  # noqa: E402


def measure(path: Path, feed, repeats: int) -> dict:
    from graphopt.runtime import Session, host_time

    sess = Session(path, device="cuda", dtype="float16", cuda_graphs=False)
    h = host_time.measure(sess, feed, repeats=repeats).to_dict()
    if not h["gpu_held"]:
        h["waits"] = diagnose_waits(path, feed, sess)
    s = sess.plan_summary()
    by_op = host_time.per_op(sess, feed, max(3, repeats // 3))
    return {**h, "arena_bytes": s.get("arena_bytes"), "arena_live_bytes": s.get("arena_live_bytes"),
            "workspace_bytes": s.get("workspace_bytes"), "peak_bytes": s.get("peak_bytes"), "by_op": by_op,
            "notes": s.get("notes", [])[:20]}


def diagnose_waits(path: Path, feed, sess) -> dict:
    """Where a run that cannot be held waits for the device (GPT-2 bs1, 2026-12-05: one step, the
    same each run, waited out every hold): the blocking steps again with the garbage collector off
    (a finalizer that synchronises), with a 20 ms hold (a launch queue that fills blocks at the same
    step whatever the hold), and in a session without step replay (a recorded step graph's launch),
    plus the slowest steps of one held run."""
    import gc
    import time as _t

    from graphopt.runtime import Session, host_time

    out: dict = {}
    gc.collect()
    gc.disable()
    try:
        out["gc_off"] = host_time.blocking_steps(sess, feed)
    finally:
        gc.enable()
    out["hold_20ms"] = host_time.blocking_steps(sess, feed, hold_us=20_000.0)
    plain = Session(path, device="cuda", dtype="float16", cuda_graphs=False, step_graphs=False)
    m = host_time.measure(plain, feed, repeats=5).to_dict()
    out["no_step_replay"] = {k: m.get(k) for k in ("host_us_per_node", "gpu_held", "blocking_steps")}
    hold = host_time.cuda_hold(sess.backend.cupy)
    dev = {k: sess.backend.cupy.asarray(v) for k, v in feed.items()}
    sess.run(dev)
    sess.synchronize()
    times: list = []

    def timed(step, ins):
        t0 = _t.perf_counter()
        outs = step.run(ins)
        times.append((round((_t.perf_counter() - t0) * 1e6, 1), step.label, step.lowering))
        return outs

    hold(sess.backend.stream, 300_000.0)
    with sess.backend.stream:
        sess.last_plan.execute(sess._convert_feeds(dev), timed)
    sess.synchronize()
    out["slowest_steps_held"] = sorted(times, reverse=True)[:8]
    out["first_steps_held"] = times[:3]
    return out


def markdown(res: dict) -> str:
    meta = res["meta"]
    md = [f"# Host time per node, no CUDA graphs ({meta['date']}, {meta['gpu']})", "", f"command: `{meta['command']}`", "",
          "host us/node: best run's wall time / steps, GPU held by a spin kernel (graphopt.runtime.host_time); "
          "median, thread CPU time and the idle-GPU figure of the same runs beside it.", "",
          "| model | bs | variant | steps | host us/node | median | CPU | idle GPU | held | arena MiB |",
          "|---|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    for e in res["models"]:
        for v in ("optimized", "unoptimized"):
            r = e.get(v)
            if isinstance(r, dict):
                md.append(f"| {e['model']} | {e['bs']} | {v} | {r['steps']} | {r['host_us_per_node']:.1f} | "
                          f"{r['host_us_per_node_median']:.1f} | {r['host_cpu_us_per_node']:.1f} | "
                          f"{r['host_idle_gpu_us_per_node'] or 0:.1f} | {'yes' if r['gpu_held'] else 'NO'} | "
                          f"{(r['arena_bytes'] or 0) / 2**20:.1f} |")
            elif f"{v}_error" in e:
                md.append(f"| {e['model']} | {e['bs']} | {v} | - | {e[f'{v}_error'][:80]} | - | - | - | - | - |")
    for e in res["models"]:
        r = e.get("optimized")
        if isinstance(r, dict):
            md += ["", f"## {e['model']} bs{e['bs']} optimized: host us per run by op", "",
                   "| op | steps | host us per run | per step |", "|---|---:|---:|---:|"]
            md += [f"| {op} | {n} | {h:.1f} | {h / max(n, 1):.1f} |" for op, n, h in r["by_op"]]
            if r.get("waits"):
                md += ["", "Where the run waits for the device (`diagnose_waits`):", "", "```",
                       json.dumps(r["waits"], indent=1)[:4000], "```"]
    return "\n".join(md) + "\n"


def main() -> int:
    ap = runtime_bench_parser(__doc__, batches="1,1", repeats=30)
    ap.add_argument("--optimize-timeout", type=float, default=240.0)
    args = ap.parse_args()
    args.gpu_name = args.gpu_name or gpu_tag()
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"meta": runtime_bench_meta(), "models": []}
    for name, bs in zip(args.models.split(","), [int(b) for b in args.batches.split(",")]):
        entry: dict = {"model": name, "bs": bs}
        res["models"].append(entry)
        try:
            work = Path(tempfile.mkdtemp(prefix=f"ho_{name}_"))
            src = work / f"{name}.onnx"
            torch_models.export(name, torch_models.build_module(name), src)
            opt = work / f"{name}.opt.onnx"
            shape = torch_models.input_shape(name, bs)
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "graphopt.cli", "optimize", str(src), "-o", str(opt),
                                *args.gpu_args.split(), "--shape", shape, "-q"], capture_output=True, text=True,
                               timeout=args.optimize_timeout)
            entry.update(optimize_s=time.perf_counter() - t0, optimize_rc=r.returncode, optimize_err=r.stderr[-400:])
            x = torch_models.example_input(name, bs).cuda()
            feed = {"input": x}  # example_input: float32 images or int64 token ids, as the exports take
            if r.returncode:
                raise RuntimeError(f"graphopt optimize exit {r.returncode}: {r.stderr[-300:]}")
        except Exception as e:  # noqa: BLE001 - reported in the row, printed and written (a silent gap is no result)
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"{name} bs{bs}: {entry['error']}", flush=True)
            write_atomic(args.out / f"host_overhead_{args.gpu_name}.json", json.dumps(res, indent=1))
            continue
        for label, path in (("optimized", opt), ("unoptimized", src)):
            try:
                entry[label] = measure(path, feed, args.repeats)
                print(f"{name} bs{bs} {label}: {entry[label]['host_us_per_node']:.1f} us/node over "
                      f"{entry[label]['steps']} steps", flush=True)
            except Exception as e:  # noqa: BLE001
                entry[f"{label}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"{name} bs{bs} {label}: {entry[label + '_error']}", flush=True)
            write_atomic(args.out / f"host_overhead_{args.gpu_name}.json", json.dumps(res, indent=1))
            write_atomic(args.out / f"host_overhead_{args.gpu_name}.md", markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
