"""End to end on the GPU (issue 15, item 5): graphopt fully tuned against torch eager and
torch.compile(mode="reduce-overhead"), one row per (model, batch, dtype), merged into one results file.

Models (bench/torch_models.py; random weights, exported here, no downloads): resnet50, mobilenetv2,
efficientnet_b0, gpt2 (124M, seq 128), bert (base, seq 128), vit_b16. Batches 1 and 32; fp16 for
every model, fp32 too for resnet50 and bert. ``--models gpt2_dynamo`` (any model name + ``_dynamo``):
the same module exported by the dynamo exporter, a row of its own beside the TorchScript export's (not
one of issue 15's acceptance rows).

For each row, in one process:
  1. ``graphopt optimize --gpu auto --shape ... --report`` (fp16: ``--precision fp16 --io-fp16``; when
     that conversion fails, the module is exported in fp16 on the GPU instead and the row says so),
     with GRAPHOPT_CACHE_DIR=--cache-dir. The tuning is never cut short on purpose: it gets what is
     left of --budget after --measure-reserve, and when it does not finish the row is written with
     ``tuning_complete: false`` and nothing measured (what was profiled stays in the cache, so the
     next call resumes; ``optimize_s_all_calls`` adds the calls up).
  2. ``tuning_complete`` is read from the report: true only when every fused node was profiled or
     served from the cache (a node whose every candidate was measured and failed counts as profiled).
  3. torch eager (cudnn.benchmark), the graphopt runtime on the optimized model with CUDA graphs,
     torch.compile(reduce-overhead), the runtime on the unoptimized export, the optimized model without
     CUDA graphs (host time per node), then the informational figures (outputs not copied, every
     lowering barrier kept: ``graphopt_all_barriers_ms`` and, paired with the default in the same
     rounds, ``paired_ratio_barrier_rule``; the paired rounds): the acceptance's peers come first, so a call short of time loses only the others; peak GPU
     memory of each (torch: ``max_memory_allocated`` over its eager run, weights included; graphopt:
     what CuPy's default pool grew by from before the session to after its runs, weights included,
     plus what its CUDA graphs' and step graphs' private pools hold, ``Session.private_pool_bytes``,
     also given alone as ``private_pool_mb``; rows before 2026-12-05 late evening lack the private
     pools; ``device_used_mb``, the driver's free memory before the session less after its runs, is a
     cross-check that also sees library workspaces and loaded kernels); the output's max relative error
     against torch (and, fp32, onnxruntime CPU).

Rows are keyed by (model, bs, dtype) and merged into OUT/e2e_<gpu>.json (a newer row replaces an
older one; a row skipped for time is not written, so the older one stays); OUT/e2e_<gpu>.md is
rewritten from the merged rows after every row.

    python3 bench/e2e.py --models resnet50 --batches 32 --dtypes fp16 --cache-dir .tuning --budget 540
    python3 bench/e2e.py --dry --models gpt2,bert --out /tmp/e2e      # CPU check: tiny models, no GPU
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from e2e_report import (FIELDS, FP16_RTOL, FP32_MODELS, FP32_RTOL, acceptance, fused_nodes_ms, load_doc,  # noqa: E402
                        markdown, merge_rows, row_plan, tuning_status)
from lowering_bench import GPU_NAME_HELP, Budget, gpu_tag, write_atomic  # noqa: E402
from runtime_bench import err, gpu_name, rel_err, timed, versions  # noqa: E402
from torch_models import ALL_MODELS, MODELS, build_module, example_input, export, input_shape  # noqa: E402


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def optimize(src: Path, dst: Path, name: str, bs: int, fp16: bool, args, timeout_s: float) -> dict:
    """``graphopt optimize`` in a subprocess (its own process group, so a timeout also ends the profiler's
    workers). Returns {status: done|cut|failed, seconds, report, message}."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if args.cache_dir:
        env["GRAPHOPT_CACHE_DIR"] = str(args.cache_dir)
    report = Path(str(dst) + ".report.json")
    cmd = [args.graphopt_python or sys.executable, "-m", "graphopt.cli", "optimize", str(src), "-o", str(dst),
           "--gpu", "none" if args.dry or args.heuristic else "auto", "--shape", input_shape(name, bs), "-q", "--force",
           "--report", str(report)] + (["--precision", "fp16", "--io-fp16"] if fp16 else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"status": "cut", "seconds": time.perf_counter() - t0, "report": None,
                "message": f"tuning not finished within this call ({timeout_s:.0f} s); the cache keeps what was profiled"}
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"status": "failed", "seconds": seconds, "report": None,
                "message": f"exit {proc.returncode}: {stderr.strip()[-300:]}"}
    return {"status": "done", "seconds": seconds, "report": json.loads(report.read_text()), "message": ""}


class Runner:
    """One model's rows: the torch module, its exports and the measurements."""

    def __init__(self, name: str, args, meta: dict):
        self.name, self.args = name, args
        self.work = Path(args.work) / (f"{name}.tiny" if args.dry else name)
        self.work.mkdir(parents=True, exist_ok=True)
        self.dev = "cpu" if args.dry else "cuda"
        t0 = time.perf_counter()
        self.module = build_module(name, tiny=args.dry)
        self.fp32_onnx = self.work / f"{name}.onnx"
        if not self.fp32_onnx.exists():  # reused on a warm machine: written whole or not at all
            tmp = self.work / f".{name}.partial.onnx"
            how = export(name, self.module, tmp)
            os.replace(tmp, self.fp32_onnx)
            meta.setdefault("exports", {})[name] = f"{how} in {time.perf_counter() - t0:.1f} s"
        self.fp16_onnx = None  # exported in fp16 on the GPU only when --precision fp16 fails

    def fp16_export(self) -> Path:
        if self.fp16_onnx is None:
            path = self.work / f"{self.name}.fp16.onnx"
            mod = copy.deepcopy(self.module).to(self.dev).half()
            export(self.name, mod, path, device=self.dev)
            self.fp16_onnx = path
        return self.fp16_onnx

    def row(self, bs: int, dtype: str, budget: Budget, run_info: dict) -> dict | None:
        """Optimize and measure one row; None when there was no time to start it."""
        args, name = self.args, self.name
        if budget.left() < args.measure_reserve + 10:
            log(f"{name} bs{bs} {dtype}: skipped (time budget); an older row, if any, stays")
            return None
        row = {k: None for k in FIELDS}
        row.update(model=name, bs=bs, dtype=dtype, errors={}, **run_info)
        fp16 = dtype == "fp16"
        opt_path = self.work / f"{name}_bs{bs}_{dtype}.opt.onnx"
        log(f"{name} bs{bs} {dtype}: graphopt optimize (full tuning; {budget.left() - args.measure_reserve:.0f} s left for it)")
        res = optimize(self.fp32_onnx, opt_path, name, bs, fp16, args, budget.left() - args.measure_reserve)
        row["fp16_model"] = "graphopt --precision fp16 --io-fp16" if fp16 else None
        if fp16 and res["status"] == "failed":
            note = res["message"][-160:]
            log(f"{name} bs{bs}: --precision fp16 failed ({note}); exporting the module in fp16 instead")
            try:
                src = self.fp16_export()
                res2 = optimize(src, opt_path, name, bs, False, args, budget.left() - args.measure_reserve)
                res2["seconds"] += res["seconds"]
                res = res2
                row["fp16_model"] = f"torch fp16 export (--precision fp16 failed: {note})"
            except Exception as e:  # noqa: BLE001
                res = {"status": "failed", "seconds": res["seconds"], "report": None, "message": f"fp16 export: {err(e)}"}
        row["optimize_s"] = round(res["seconds"], 1)
        if res["status"] != "done":
            row["tuning_complete"] = False
            row["errors"]["optimize"] = res["message"]
            log(f"{name} bs{bs} {dtype}: {res['status']}: {res['message']}")
            return row
        complete, summary = tuning_status(res["report"])
        row["tuning_complete"] = complete
        row["tuning"] = summary
        row["tuning_time"] = res["report"].get("tuning_time") or {}  # where the tuning's seconds went
        row["lowering_counts"] = dict(sorted(Counter(r.get("lowering") for r in res["report"].get("lowerings", [])).items()))
        row["lowerings"] = "heuristic (--gpu none: nothing profiled)" if args.heuristic else "tuned (--gpu auto)"
        nodes_ms, untimed = fused_nodes_ms(res["report"])
        if not untimed:  # every fused node's tuned time known: what the custom ops cost one by one
            row["fused_nodes_ms"] = round(nodes_ms, 4)
        log(f"{name} bs{bs} {dtype}: optimized in {res['seconds']:.1f} s; tuning complete: {complete}; {summary['node_modes']}")
        self.measure(row, opt_path, budget)
        return row

    def measure(self, row: dict, opt_path: Path, budget: Budget) -> None:
        import torch

        from graphopt.runtime import Session, to_numpy
        from graphopt.runtime import host_time

        args, name, bs, dtype = self.args, self.name, row["bs"], row["dtype"]
        dry, dev = args.dry, self.dev
        tdt = torch.float16 if dtype == "fp16" else torch.float32
        rt = "numpy" if dry else "cuda"
        walls = row.setdefault("wall_ms", {})  # host wall time of the same runs (the CUDA-event spans are the figures)
        row["timing"] = "host wall clock (dry run)" if dry else "CUDA events on the caller's stream"
        timing_kw = dict(warmup=args.warmup, repeats=args.repeats, budget_s=args.item_budget,
                         event=None if dry else torch.cuda.Event, walls=walls)
        sync = (lambda: None) if dry else torch.cuda.synchronize

        def measure(field, fn, min_left=10.0):
            if budget.left() < min_left:
                row["errors"][field] = "skipped: time budget"
                return None
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - recorded in the row
                row["errors"][field] = err(e)
                log(f"{name} bs{bs} {dtype}: {field} failed: {row['errors'][field]}")
                return None
            finally:
                gc.collect()

        x_cpu = example_input(name, bs)
        image = ALL_MODELS[name][1] == "image"
        mod = copy.deepcopy(self.module).to(dev).to(tdt)
        x_t = x_cpu.to(dev).to(tdt) if image else x_cpu.to(dev)
        if not dry:
            torch.backends.cudnn.benchmark = True
        ref = {}
        live: dict = {}  # run() callables kept for the paired rounds: (call, sync)

        def eager():
            with torch.inference_mode():
                if not dry:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                ms = timed(lambda: mod(x_t), sync, field="torch_eager_ms", **timing_kw)
                ref["torch"] = mod(x_t).float().cpu().numpy()
                if not dry:
                    row["torch_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            return ms

        def feed_for(path: Path):
            """The input in the dtype the model declares, on the session's device (CUDA tensors by DLPack)."""
            import onnx

            elem = onnx.load(str(path), load_external_data=False).graph.input[0].type.tensor_type.elem_type
            want = {onnx.TensorProto.FLOAT16: torch.float16, onnx.TensorProto.FLOAT: torch.float32}.get(elem)
            x = x_cpu.to(want) if want is not None else x_cpu
            return {"input": x.numpy() if dry else x.to(dev)}

        def device_free() -> int:
            import cupy

            return int(cupy.cuda.runtime.memGetInfo()[0])

        def pool():
            if dry:
                return None
            import cupy

            p = cupy.get_default_memory_pool()
            p.free_all_blocks()
            return p

        def graphopt_opt():
            p = pool()
            base = p.total_bytes() if p else 0
            free0 = device_free() if p else 0
            feed = feed_for(opt_path)
            sess = Session(opt_path, device=rt)
            ms = timed(lambda: sess.run(feed), sess.synchronize, field="graphopt_ms", **timing_kw)
            live["graphopt"] = (lambda: sess.run(feed), sess.synchronize)
            if p is not None:
                private = sess.private_pool_bytes()
                row["peak_mb"] = round((p.total_bytes() - base + private) / 2**20, 1)
                row["private_pool_mb"] = round(private / 2**20, 1)
                # a cross-check from the driver: device memory the session's creation and runs took,
                # libraries' workspaces and loaded kernels included (what the pools cannot see)
                row["device_used_mb"] = round((free0 - device_free()) / 2**20, 1)
            row["plan_peak_mb"] = round((sess.last_peak_bytes or 0) / 2**20, 1)
            row["graph_status"] = sess.graph_status
            row["plan_notes"] = list(sess.plan_summary().get("notes", []))[:30]
            row["barriers"] = sess.plan_summary().get("barriers")  # lowering barriers kept / dropped (ordering)
            out = to_numpy(sess.run(feed)["output"])
            ref["graphopt"] = out
            if "torch" in ref:
                row["max_rel_err_vs_torch"] = round(rel_err(out, ref["torch"]), 6)
            return ms

        def graphopt_static():
            """The same replays returning the graph's own output buffers (``copy_outputs=False``: valid
            until the next run, the contract of torch.compile's reduce-overhead outputs), so the two
            are compared like for like; the default copies every output once per run."""
            feed = feed_for(opt_path)
            sess = Session(opt_path, device=rt, copy_outputs=False)
            ms = timed(lambda: sess.run(feed), sess.synchronize, field="graphopt_static_outputs_ms", **timing_kw)
            live["graphopt_static"] = (lambda: sess.run(feed), sess.synchronize)
            return ms

        def graphopt_all_barriers():
            """The optimized model with every lowering barrier kept (``GRAPHOPT_KEEP_BARRIERS=1``: the
            runtime's rule, ``graphopt.runtime.ordering``, switched off): what the rule saves; the plan
            is compiled on the first run, so the variable is set around it only."""
            from graphopt.runtime.ordering import all_barriers_kept

            feed = feed_for(opt_path)
            with all_barriers_kept():
                sess = Session(opt_path, device=rt)
                sess.run(feed)
                sess.synchronize()
            row["barriers_all_kept"] = sess.plan_summary().get("barriers")
            ms = timed(lambda: sess.run(feed), sess.synchronize, field="graphopt_all_barriers_ms", **timing_kw)
            live["graphopt_all_barriers"] = (lambda: sess.run(feed), sess.synchronize)
            return ms

        def graphopt_eager():
            feed = feed_for(opt_path)
            sess = Session(opt_path, device=rt, cuda_graphs=False)
            h = host_time.measure(sess, feed, repeats=2 if dry else 20, warmup=1 if dry else 3).to_dict()  # GPU held
            row["plan_steps"] = h["steps"]
            row["host_time"] = h  # median, thread CPU time, the idle-GPU figure, the hold
            return h["host_us_per_node"]

        def graphopt_unopt():
            feed = feed_for(self.fp32_onnx)
            sess = Session(self.fp32_onnx, device=rt, dtype="float16" if dtype == "fp16" else None)
            return timed(lambda: sess.run(feed), sess.synchronize, field="graphopt_unoptimized_ms", **timing_kw)

        def compiled():
            torch._dynamo.reset()
            cmod = torch.compile(mod, mode="reduce-overhead")
            with torch.inference_mode():
                t0 = time.perf_counter()
                cmod(x_t)
                sync()
                row["torch_compile_s"] = round(time.perf_counter() - t0, 1)
                ms = timed(lambda: cmod(x_t), sync, field="torch_compile_ms", **timing_kw)
            live["compile"] = (lambda: cmod(x_t), sync)
            return ms

        def paired():
            """graphopt and torch.compile timed in alternating rounds, each ``--paired-repeats`` runs by
            CUDA events: the median of the rounds' ratios (graphopt / compile). Measured minutes apart,
            torch.compile moved 1.66-1.95 ms between calls on the same H200; rounds a second apart
            share the machine's state, so their ratio is what the acceptance compares. A round also
            times the replays that return the graph's own outputs (``copy_outputs=False``, torch's
            contract) where they were measured: ``paired_ratio_static_outputs``, reported beside it."""
            kw = dict(timing_kw, repeats=args.paired_repeats, warmup=2, walls=None)
            rounds, rule = [], []
            with torch.inference_mode():
                for _ in range(args.paired_rounds):
                    g = timed(*live["graphopt"], **kw)
                    c = timed(*live["compile"], **kw)
                    extra = [round(timed(*live["graphopt_static"], **kw), 4)] if "graphopt_static" in live else []
                    rounds.append([round(g, 4), round(c, 4)] + extra)
                    if "graphopt_all_barriers" in live:
                        rule.append([round(g, 4), round(timed(*live["graphopt_all_barriers"], **kw), 4)])
            row["paired_rounds"] = rounds  # [graphopt, torch.compile(, graphopt with static outputs)] ms
            if rule:  # [graphopt, graphopt with every barrier kept] ms: the barrier rule's saving, paired
                row["paired_rounds_all_barriers"] = rule
                row["paired_ratio_barrier_rule"] = round(float(np.median([a / b for a, b in rule])), 4)
            if all(len(r) == 3 for r in rounds):
                row["paired_ratio_static_outputs"] = round(float(np.median([r[2] / r[1] for r in rounds])), 4)
            return round(float(np.median([r[0] / r[1] for r in rounds])), 4)

        def ort_cpu():
            import onnxruntime as ort

            s = ort.InferenceSession(str(self.fp32_onnx), providers=["CPUExecutionProvider"])
            out = s.run(None, {"input": x_cpu.numpy()})[0]
            if "graphopt" not in ref:
                raise RuntimeError("no graphopt output to compare")
            return round(rel_err(ref["graphopt"], out), 6)

        log(f"{name} bs{bs} {dtype}: torch eager")
        row["torch_eager_ms"] = measure("torch_eager_ms", eager)
        log(f"{name} bs{bs} {dtype}: graphopt optimized, CUDA graphs")
        row["graphopt_ms"] = measure("graphopt_ms", graphopt_opt)
        pool()
        # the acceptance's peers first (torch.compile, then the unoptimized run and the host time), so a
        # call short of time loses the informational figures, not them
        if dry or args.no_compile:
            row["errors"]["torch_compile_ms"] = "not measured (" + ("dry run" if dry else "--no-compile") + ")"
        else:
            log(f"{name} bs{bs} {dtype}: torch.compile(mode='reduce-overhead')")
            row["torch_compile_ms"] = measure("torch_compile_ms", compiled, min_left=45.0)
        log(f"{name} bs{bs} {dtype}: graphopt unoptimized")
        row["graphopt_unoptimized_ms"] = measure("graphopt_unoptimized_ms", graphopt_unopt)
        pool()
        log(f"{name} bs{bs} {dtype}: graphopt optimized, host time per node without CUDA graphs")
        row["host_us_per_node"] = measure("host_us_per_node", graphopt_eager)
        pool()
        if not dry:
            log(f"{name} bs{bs} {dtype}: graphopt optimized, CUDA graphs, outputs not copied")
            row["graphopt_static_outputs_ms"] = measure("graphopt_static_outputs_ms", graphopt_static, min_left=25.0)
            pool()
            log(f"{name} bs{bs} {dtype}: graphopt optimized, CUDA graphs, every lowering barrier kept")
            row["graphopt_all_barriers_ms"] = measure("graphopt_all_barriers_ms", graphopt_all_barriers, min_left=25.0)
            pool()
        if "graphopt" in live and "compile" in live and args.paired_rounds > 0:
            log(f"{name} bs{bs} {dtype}: graphopt and torch.compile in {args.paired_rounds} alternating rounds")
            row["paired_ratio"] = measure("paired_ratio", paired, min_left=15.0)
        live.clear()
        if dtype == "fp32":
            log(f"{name} bs{bs} {dtype}: onnxruntime CPU (correctness)")
            row["max_rel_err_vs_ort_cpu"] = measure("max_rel_err_vs_ort_cpu", ort_cpu, min_left=20.0)
        for k in [k for k in row if k.endswith("_ms") and isinstance(row[k], float)]:
            row[k] = round(row[k], 4)
        # fp16: against torch eager at the documented fp16 tolerance; fp32: against onnxruntime CPU at 1e-3
        e = row.get("max_rel_err_vs_ort_cpu") if dtype == "fp32" else row.get("max_rel_err_vs_torch")
        row["correct"] = None if e is None else e <= (FP32_RTOL if dtype == "fp32" else FP16_RTOL)
        log(f"{name} bs{bs} {dtype}: " + ", ".join(f"{k}={row.get(k)}" for k in FIELDS[3:]))
        mod = None  # noqa: F841 - frees the GPU copy before the next row
        gc.collect()
        if not dry:
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ main
def parse_row(text: str) -> tuple[str, int, str]:
    """``MODEL:BS[:DTYPE]`` -> (model, bs, dtype); dtype fp16 unless given."""
    parts = text.strip().split(":")
    if len(parts) not in (2, 3) or not parts[1].isdigit() or int(parts[1]) < 1:
        raise ValueError(f"{text!r} is not MODEL:BS[:DTYPE] (e.g. mobilenetv2:32 or bert:1:fp32)")
    return parts[0], int(parts[1]), (parts[2] if len(parts) == 3 else "fp16")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma list of {', '.join(ALL_MODELS)} (default: {', '.join(MODELS)}; *_dynamo: the dynamo exporter's graph)")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--rows", default=None,
                    help="MODEL:BS[:DTYPE],... in this order (DTYPE default fp16), instead of --models x --batches x "
                         "--dtypes: the rows a short call needs most go first")
    ap.add_argument("--dtypes", default="fp16,fp32", help="fp16 and/or fp32 (fp32 rows only for " + ", ".join(FP32_MODELS) + ")")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for this call (default 540)")
    ap.add_argument("--measure-reserve", type=float, default=120.0,
                    help="seconds kept for a row's measurements after its tuning (default 120)")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="tuning cache folder (GRAPHOPT_CACHE_DIR for graphopt optimize): keep it across calls so a "
                         "later call resumes an unfinished tuning and a fully cached optimize is fast")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "graphopt_e2e",
                    help="exports and optimized models (reused across calls on the same machine)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--gpu-name", default=None, help=GPU_NAME_HELP)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--heuristic", action="store_true",
                    help="optimize with --gpu none (the heuristic's lowerings, nothing profiled): rows say "
                         "tuning_complete false and lowerings 'heuristic'; for when a call cannot hold the tuning")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--item-budget", type=float, default=5.0, help="seconds of repeats per timed measurement")
    ap.add_argument("--paired-rounds", type=int, default=7,
                    help="alternating rounds of graphopt and torch.compile for paired_ratio (0: none)")
    ap.add_argument("--paired-repeats", type=int, default=20, help="runs per peer per paired round")
    ap.add_argument("--dry", action="store_true",
                    help="CPU check of the script: tiny transformers configs, torch on the CPU, graphopt --gpu none "
                         "on the NumPy runtime, no torch.compile, no memory numbers")
    ap.add_argument("--graphopt-python", default=None, help="python for `graphopt optimize` (default: this one)")
    args = ap.parse_args(argv)
    args.gpu_name = args.gpu_name or ("cpu" if args.dry else gpu_tag())  # a dry run never joins a GPU's rows
    args.models = [m for m in args.models.split(",") if m]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.row_list = None
    if args.rows:
        try:
            args.row_list = [parse_row(r) for r in args.rows.split(",") if r]
        except ValueError as e:
            ap.error(f"--rows: {e}")
        args.models = list(dict.fromkeys(m for m, _, _ in args.row_list))
        args.dtypes = list(dict.fromkeys(d for _, _, d in args.row_list))
    bad = [m for m in args.models if m not in ALL_MODELS] + [d for d in args.dtypes if d not in ("fp16", "fp32")]
    if bad:
        ap.error(f"unknown model or dtype: {', '.join(bad)} (models: {', '.join(ALL_MODELS)}; dtypes: fp16, fp32)")
    if args.cache_dir:
        args.cache_dir = args.cache_dir.resolve()
        args.cache_dir.mkdir(parents=True, exist_ok=True)
    return args


def main(argv=None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    start = time.perf_counter()
    json_path = args.out / f"e2e_{args.gpu_name}.json"
    doc = load_doc(json_path)
    command = " ".join(["python3", "bench/e2e.py"] + (argv if argv is not None else sys.argv[1:]))
    run = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": gpu_name(args.dry),
           "versions": versions(), "command": command}
    doc.update(run)
    doc["runs"].append({**run, "rows": []})
    doc["seq_len"] = 128
    plan = args.row_list or row_plan(args.models, args.batches, args.dtypes)

    def save(new_rows):
        doc["rows"] = merge_rows(doc["rows"], new_rows)
        doc["runs"][-1]["elapsed_s"] = round(time.perf_counter() - start, 1)
        doc["acceptance"] = acceptance(doc["rows"])
        write_atomic(json_path, json.dumps(doc, indent=1) + "\n")
        write_atomic(args.out / f"e2e_{args.gpu_name}.md", markdown(doc))

    log(f"{run['gpu']}; budget {args.budget:.0f} s; rows {plan}; cache {args.cache_dir}")
    runners: dict[str, Runner] = {}
    broken: dict[str, str] = {}  # model -> why it could not be built or exported
    for name, bs, dtype in plan:
        if budget.left() < args.measure_reserve + 10:
            log(f"{name} bs{bs} {dtype}: skipped: {budget.left():.0f} s left, under --measure-reserve "
                f"{args.measure_reserve:.0f} + 10 (an older row, if any, stays)")
            doc["runs"][-1].setdefault("skipped_for_time", []).append(f"{name} bs{bs} {dtype}")
            continue
        if name in broken:
            save([{**{k: None for k in FIELDS}, "model": name, "bs": bs, "dtype": dtype, "errors": {"all": broken[name]}, **run}])
            continue
        try:
            if name not in runners:
                for other in list(runners):  # one model on the GPU at a time
                    del runners[other]
                gc.collect()
                log(f"{name}: building and exporting ({ALL_MODELS[name][0]})")
                try:
                    runners[name] = Runner(name, args, doc)
                except Exception as e:  # noqa: BLE001
                    broken[name] = f"build/export: {err(e)}"
                    raise
            row = runners[name].row(bs, dtype, budget, run)
        except Exception as e:  # noqa: BLE001 - one model failing must not stop the others
            log(f"{name} bs{bs} {dtype}: failed: {err(e)}")
            row = {**{k: None for k in FIELDS}, "model": name, "bs": bs, "dtype": dtype, "errors": {"all": err(e)}, **run}
        if row is None:
            doc["runs"][-1].setdefault("skipped_for_time", []).append(f"{name} bs{bs} {dtype}")
            continue
        doc["runs"][-1]["rows"].append(f"{name} bs{bs} {dtype}")
        save([row])
    save([])
    log(f"done in {time.perf_counter() - start:.0f} s; {json_path} has {len(doc['rows'])} rows")
    for c in doc["acceptance"]:
        log(f"  {c['check']}: {c['value']} -> {c['pass']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
