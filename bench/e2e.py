"""End-to-end benchmark on the GPU: torchvision ResNet-50 / MobileNetV2 and transformers GPT-2 (124M
config, sequence 128), random weights, exported here with torch (no downloads).

For each model, batch (1, 32) and dtype (fp16, fp32) it times, in one run:
  torch eager (cudnn.benchmark), torch.compile(mode="reduce-overhead"), onnxruntime CPU (fp32 model),
  the graphopt runtime on the unoptimized ONNX, and on the optimized ONNX (tuned on this GPU) with
  CUDA graphs (and without, for the host overhead per node),
plus the time to optimize (tuning included) and torch.compile's compile time. Every measurement is in
its own try/except (a failure is recorded as an error string in its row); a global time budget skips
what no longer fits; results are rewritten after every row, so a run cut short still leaves them.

    python3 bench/e2e.py --quick --out bench/results          # ~6 min on the H200, fp16 only
    python3 bench/e2e.py --out bench/results                  # everything

Writes OUT/e2e_h200.json and OUT/e2e_h200.md (the name follows --gpu-name).
"""

from __future__ import annotations

import argparse
import copy
import gc
import signal
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("resnet50", "mobilenetv2", "gpt2")
SEQ = 128
FP16_RTOL = 1e-2  # the runtime's documented fp16 tolerance (tests/gpu/test_runtime_gpu.py)


class Budget:
    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds
        self.seconds = seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def err(e: BaseException) -> str:
    text = str(e).splitlines()[0][:300] if str(e) else ""
    return f"{type(e).__name__}: {text}"


# ------------------------------------------------------------------------------------ models
def build_module(name: str):
    import torch

    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None).eval()
    if name == "mobilenetv2":
        import torchvision

        return torchvision.models.mobilenet_v2(weights=None).eval()
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_positions=1024, use_cache=False)  # the 124M configuration
        lm = GPT2LMHeadModel(cfg).eval()

        class Logits(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids):
                # the mask is passed: without it transformers 5 calls torch.diff, which TorchScript cannot export
                return self.m(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False,
                              return_dict=False)[0]

        return Logits(lm).eval()
    raise ValueError(name)


def example_input(name: str, bs: int, device="cpu"):
    import torch

    g = torch.Generator().manual_seed(bs)
    if name == "gpt2":
        return torch.randint(0, 50257, (bs, SEQ), generator=g).to(device)
    return torch.randn(bs, 3, 224, 224, generator=g).to(device)


def export(name: str, module, path: Path) -> str:
    """ONNX export with a dynamic batch dim: the TorchScript exporter (opset 17), else dynamo."""
    import torch

    x = example_input(name, 2)
    try:
        torch.onnx.export(module, (x,), str(path), opset_version=17, dynamo=False, input_names=["input"],
                          output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
        return "torchscript opset 17"
    except Exception as e:  # noqa: BLE001 - the legacy exporter may be gone: try dynamo
        first = err(e)
    batch = torch.export.Dim("batch", min=1, max=1024)
    torch.onnx.export(module, (x,), str(path), dynamo=True, input_names=["input"], output_names=["output"],
                      dynamic_shapes={"input": {0: batch}}, external_data=False)
    return f"dynamo (torchscript failed: {first})"


# ------------------------------------------------------------------------------------ timing
def timed(fn, sync, warmup: int, repeats: int, budget_s: float) -> float:
    """Median ms of ``fn`` + ``sync`` after ``warmup`` runs, within ``budget_s`` seconds."""
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
        sync()
    times = []
    start = time.perf_counter()
    while len(times) < repeats:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return float(np.median(times) * 1e3)


def optimize(onnx_path: Path, out: Path, bs: int, name: str, timeout_s: float) -> tuple[float, str]:
    """``graphopt optimize`` with tuning on this GPU, in a subprocess with a time limit; on a timeout
    or failure the heuristic lowerings (--gpu none) are used and the note says so."""
    shape = f"input={bs}x{SEQ}" if name == "gpt2" else f"input={bs}x3x224x224"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "graphopt.cli", "optimize", str(onnx_path), "-o", str(out), "--gpu", "auto",
           "--shape", shape, "-q", "--report", str(out) + ".report.json"]
    # its own process group: a timeout also ends the profiler's worker processes
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=max(5.0, timeout_s))
        if proc.returncode == 0:
            return time.perf_counter() - t0, "tuned (--gpu auto)"
        note = f"tuned optimize failed (exit {proc.returncode}: {stderr.strip()[-200:]})"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        note = f"tuning cut at {timeout_s:.0f} s"
    elapsed = time.perf_counter() - t0
    cmd[cmd.index("auto")] = "none"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{note}; heuristic optimize failed too: {r.stderr.strip()[-200:]}")
    return elapsed + 0.0, f"{note}; heuristic lowerings (--gpu none)"


def run_model(name: str, args, budget: Budget, rows: list, meta: dict, save) -> None:
    import torch

    from graphopt.runtime import Session, to_numpy
    from graphopt.runtime.bench import host_overhead_us

    work = Path(tempfile.mkdtemp(prefix=f"e2e_{name}_"))
    onnx_path = work / f"{name}.onnx"
    log(f"{name}: building and exporting")
    t0 = time.perf_counter()
    module = build_module(name)
    meta.setdefault("exports", {})[name] = export(name, module, onnx_path) + f" in {time.perf_counter() - t0:.1f} s"
    log(f"{name}: {meta['exports'][name]}")
    ort_cache: dict[int, object] = {}
    for bs in args.batches:
        opt_path = work / f"{name}_bs{bs}.opt.onnx"
        optimize_s = opt_note = None
        opt_error = None
        if budget.left() > 20:
            try:
                log(f"{name} bs{bs}: optimizing (tuning on this GPU)")
                optimize_s, opt_note = optimize(onnx_path, opt_path, bs, name,
                                                min(args.tune_timeout, 0.3 * budget.left()))
                log(f"{name} bs{bs}: optimized in {optimize_s:.1f} s: {opt_note}")
            except Exception as e:  # noqa: BLE001
                opt_error = err(e)
                log(f"{name} bs{bs}: optimize failed: {opt_error}")
        for dtype in args.dtypes:
            row = {"model": name, "bs": bs, "dtype": dtype, "graphopt_ms": None, "graphopt_eager_ms": None,
                   "graphopt_unoptimized_ms": None, "torch_eager_ms": None, "torch_compile_ms": None,
                   "ort_cpu_ms": None, "optimize_s": optimize_s, "compile_s": None, "host_us_per_node": None,
                   "graph_status": None, "max_rel_err_vs_torch": None, "optimize_note": opt_note, "errors": {}}
            if opt_error:
                row["errors"]["optimize"] = opt_error
            rows.append(row)
            tdt = torch.float16 if dtype == "fp16" else torch.float32
            rt_dtype = "float16" if dtype == "fp16" else None
            kw = dict(warmup=args.warmup, repeats=args.repeats)

            def measure(field, fn, min_left=8.0):
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
            x_gpu = x_cpu.cuda()
            x_np = x_cpu.numpy()
            mod = copy.deepcopy(module).to("cuda").to(tdt)  # a copy: the fp32 rows keep the exported weights
            x_t = x_gpu.to(tdt) if name != "gpt2" else x_gpu
            sync = torch.cuda.synchronize
            torch.backends.cudnn.benchmark = True
            ref = None

            def eager():
                nonlocal ref
                with torch.inference_mode():
                    ms = timed(lambda: mod(x_t), sync, budget_s=args.item_budget, **kw)
                    ref = mod(x_t).float().cpu().numpy()
                return ms

            # the graphopt runtime takes the CUDA tensor itself (DLPack, no copy); fp16 casts inside
            feed = {"input": x_gpu if name == "gpt2" else x_gpu.float()}

            def graphopt_opt():
                if not opt_path.exists():
                    raise RuntimeError("no optimized model")
                sess = Session(opt_path, device="cuda", dtype=rt_dtype)
                ms = timed(lambda: sess.run(feed), sess.synchronize, budget_s=args.item_budget, **kw)
                row["graph_status"] = sess.graph_status
                # which nodes did not run their recorded lowering, and why (fallbacks cost time)
                row["plan_notes"] = list(sess.plan_summary().get("notes", []))[:50]
                out = to_numpy(sess.run(feed)["output"]).astype(np.float64)
                if ref is not None:
                    row["max_rel_err_vs_torch"] = float(np.abs(out - ref).max() / (np.abs(ref).max() + 1e-12))
                return ms

            def graphopt_eager():
                sess = Session(opt_path, device="cuda", dtype=rt_dtype, cuda_graphs=False)
                ms = timed(lambda: sess.run(feed), sess.synchronize, budget_s=args.item_budget, **kw)
                row["host_us_per_node"] = round(host_overhead_us(sess, feed, repeats=10)[0], 2)
                return ms

            def graphopt_unopt():
                sess = Session(onnx_path, device="cuda", dtype=rt_dtype)
                return timed(lambda: sess.run(feed), sess.synchronize, budget_s=args.item_budget, **kw)

            def compiled():
                torch._dynamo.reset()
                cmod = torch.compile(mod, mode="reduce-overhead")
                with torch.inference_mode():
                    t0 = time.perf_counter()
                    cmod(x_t)
                    sync()
                    row["compile_s"] = round(time.perf_counter() - t0, 2)
                    return timed(lambda: cmod(x_t), sync, budget_s=args.item_budget, **kw)

            def ort_cpu():
                if bs not in ort_cache:
                    ort_cache[bs] = Session(onnx_path, device="cpu")
                s = ort_cache[bs]
                return timed(lambda: s.run({"input": x_np}), lambda: None, warmup=1, repeats=args.ort_repeats,
                             budget_s=args.item_budget)

            log(f"{name} bs{bs} {dtype}: torch eager")
            row["torch_eager_ms"] = measure("torch_eager_ms", eager)
            log(f"{name} bs{bs} {dtype}: graphopt optimized + CUDA graphs")
            row["graphopt_ms"] = measure("graphopt_ms", graphopt_opt)
            log(f"{name} bs{bs} {dtype}: graphopt optimized, eager")
            row["graphopt_eager_ms"] = measure("graphopt_eager_ms", graphopt_eager)
            log(f"{name} bs{bs} {dtype}: graphopt unoptimized")
            row["graphopt_unoptimized_ms"] = measure("graphopt_unoptimized_ms", graphopt_unopt)
            if args.quick and bs != max(args.batches):
                row["errors"]["torch_compile_ms"] = "not measured (--quick: the largest batch only)"
            elif not args.no_compile:
                log(f"{name} bs{bs} {dtype}: torch.compile(reduce-overhead)")
                row["torch_compile_ms"] = measure("torch_compile_ms", compiled, min_left=30.0)
            if dtype == args.dtypes[0] and (not args.quick or bs == 1):
                log(f"{name} bs{bs}: onnxruntime CPU (fp32 model)")
                row["ort_cpu_ms"] = measure("ort_cpu_ms", ort_cpu, min_left=15.0)
            else:
                row["errors"]["ort_cpu_ms"] = "not measured (--quick: bs1 only; fp32 model, once per batch)"
            for k in [k for k in row if k.endswith("_ms") and isinstance(row[k], float)]:
                row[k] = round(row[k], 4)
            log(f"{name} bs{bs} {dtype}: " + ", ".join(f"{k}={row[k]}" for k in row if k.endswith("_ms")))
            save()
            try:
                import cupy

                cupy.get_default_memory_pool().free_all_blocks()
            except Exception:  # noqa: BLE001
                pass
            torch.cuda.empty_cache()
    module.to("cpu")
    del module
    gc.collect()
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ output
def versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("torch", "torchvision", "transformers", "cupy", "onnx", "onnxruntime", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            out[mod] = f"unavailable ({type(e).__name__})"
    try:
        import graphopt

        out["graphopt"] = graphopt.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        out["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return out


def gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001
        return f"unknown ({type(e).__name__})"


def ratio(a, b):
    return round(a / b, 2) if isinstance(a, float) and isinstance(b, float) and b > 0 else None


def acceptance(rows: list) -> list[dict]:
    """The issue's acceptance checks, each with the numbers it used (None: not measured)."""
    checks = []
    get = {(r["model"], r["bs"], r["dtype"]): r for r in rows}
    for m in MODELS:
        for bs, need in ((1, 3.0), (32, 1.5)):
            r = get.get((m, bs, "fp16"))
            x = ratio(r["torch_eager_ms"], r["graphopt_ms"]) if r else None
            checks.append({"check": f"{m} bs{bs} fp16: graphopt >= {need}x torch eager", "value": x,
                           "pass": None if x is None else x >= need})
    r = get.get(("resnet50", 32, "fp16"))
    x = ratio(r["torch_compile_ms"], r["graphopt_ms"]) if r else None
    checks.append({"check": "resnet50 bs32 fp16: graphopt no slower than torch.compile", "value": x,
                   "pass": None if x is None else x >= 1.0})
    for dt in ("fp16", "fp32"):
        r = get.get(("resnet50", 32, dt))
        x = ratio(r["graphopt_unoptimized_ms"], r["graphopt_ms"]) if r else None
        checks.append({"check": f"resnet50 bs32 {dt}: optimized >= 1.3x unoptimized (runtime)", "value": x,
                       "pass": None if x is None else x >= 1.3})
    hs = [r["host_us_per_node"] for r in rows if r.get("host_us_per_node") is not None]
    checks.append({"check": "host overhead per node (eager) <= 15 us", "value": max(hs) if hs else None,
                   "pass": None if not hs else max(hs) <= 15.0})
    return checks


def markdown(doc: dict) -> str:
    lines = [f"# End-to-end latency on {doc['gpu']}", "",
             f"{doc['date']}; `{doc['command']}`; {doc['elapsed_s']:.0f} s.", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()) + ".", "",
             "Median ms per batch. graphopt = optimized ONNX, tuned on this GPU, CUDA graphs; eager = the same "
             "without CUDA graphs; unopt = the runtime on the exported ONNX; ORT CPU runs the fp32 model.", "",
             "| model | bs | dtype | graphopt | graphopt eager | unopt | torch eager | torch.compile | ORT CPU | "
             "eager/graphopt | compile/graphopt | optimize s | compile s | host us/node | err vs torch | notes |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]

    def f(v, nd=3):
        return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))

    for r in doc["rows"]:
        notes = "; ".join(f"{k}: {v}" for k, v in r["errors"].items())
        if r.get("optimize_note"):
            notes = "; ".join(x for x in (r["optimize_note"], notes) if x)
        lines.append(f"| {r['model']} | {r['bs']} | {r['dtype']} | {f(r['graphopt_ms'])} | {f(r['graphopt_eager_ms'])} | "
                     f"{f(r['graphopt_unoptimized_ms'])} | {f(r['torch_eager_ms'])} | {f(r['torch_compile_ms'])} | "
                     f"{f(r['ort_cpu_ms'], 1)} | {f(ratio(r['torch_eager_ms'], r['graphopt_ms']))} | "
                     f"{f(ratio(r['torch_compile_ms'], r['graphopt_ms']))} | {f(r['optimize_s'], 1)} | {f(r['compile_s'], 1)} | "
                     f"{f(r['host_us_per_node'], 1)} | {f(r['max_rel_err_vs_torch'], 4) if r['max_rel_err_vs_torch'] is not None else '-'} | "
                     f"{notes} |")
    lines += ["", "## Acceptance checks", "", "| check | value | pass |", "|---|---:|---|"]
    for c in doc["acceptance"]:
        lines.append(f"| {c['check']} | {f(c['value'], 2)} | {'-' if c['pass'] is None else ('yes' if c['pass'] else 'NO')} |")
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="fp16 only, fewer repeats, ORT CPU at bs1 and torch.compile at the largest batch only (fits ~6 min)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--dtypes", default=None, help="comma list of fp16,fp32 (default: both; --quick: fp16)")
    ap.add_argument("--budget", type=float, default=None, help="total seconds (default 330 with --quick, else 1800)")
    ap.add_argument("--tune-timeout", type=float, default=None, help="seconds per tuned optimize (default 30 quick, 300)")
    ap.add_argument("--item-budget", type=float, default=None, help="seconds per timed measurement")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--gpu-name", default="h200", help="suffix of the output files")
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.dtypes = (args.dtypes or ("fp16" if args.quick else "fp16,fp32")).split(",")
    args.budget = args.budget or (330.0 if args.quick else 1800.0)
    args.tune_timeout = args.tune_timeout or (30.0 if args.quick else 300.0)
    args.item_budget = args.item_budget or (2.0 if args.quick else 5.0)
    args.warmup, args.repeats, args.ort_repeats = (3, 30, 5) if args.quick else (5, 100, 10)
    bad = [m for m in args.models if m not in MODELS] + [d for d in args.dtypes if d not in ("fp16", "fp32")]
    if bad:
        ap.error(f"unknown model or dtype: {', '.join(bad)}")
    args.out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    start = time.perf_counter()
    rows: list[dict] = []
    doc = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": gpu_name(), "versions": versions(),
           "command": " ".join(["python3", "bench/e2e.py"] + (argv if argv is not None else sys.argv[1:])),
           "quick": args.quick, "budget_s": args.budget, "seq_len": SEQ, "rows": rows}

    def save():
        doc["elapsed_s"] = round(time.perf_counter() - start, 1)
        doc["acceptance"] = acceptance(rows)
        write_atomic(args.out / f"e2e_{args.gpu_name}.json", json.dumps(doc, indent=1) + "\n")
        write_atomic(args.out / f"e2e_{args.gpu_name}.md", markdown(doc))

    log(f"{doc['gpu']}; budget {args.budget:.0f} s; models {args.models}; batches {args.batches}; dtypes {args.dtypes}")
    for name in args.models:
        if budget.left() < 30:
            rows.append({"model": name, "bs": None, "dtype": None, "errors": {"all": "skipped: time budget"},
                         **{k: None for k in ("graphopt_ms", "graphopt_eager_ms", "graphopt_unoptimized_ms", "torch_eager_ms",
                                              "torch_compile_ms", "ort_cpu_ms", "optimize_s", "compile_s",
                                              "host_us_per_node", "graph_status", "max_rel_err_vs_torch", "optimize_note")}})
            continue
        left_models = len(args.models) - args.models.index(name)
        share = Budget(budget.left() / left_models)  # an even share of what is left, so every model gets measured
        try:
            run_model(name, args, share, rows, doc, save)
        except Exception as e:  # noqa: BLE001 - one model failing must not stop the others
            log(f"{name}: failed: {err(e)}")
            doc.setdefault("model_errors", {})[name] = err(e)
        save()
    save()
    log(f"done in {doc['elapsed_s']:.0f} s; wrote {args.out}/e2e_{args.gpu_name}.json and .md")
    for c in doc["acceptance"]:
        log(f"  {c['check']}: {c['value']} -> {c['pass']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
