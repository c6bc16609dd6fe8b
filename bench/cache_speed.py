"""How long ``graphopt optimize --gpu h200`` takes cold (nothing cached) and warm (the second run, served
from the tuning cache), on torchvision ResNet-50 and transformers GPT-2 (124M configuration).

    python3 bench/cache_speed.py --out-dir OUT                     # on the device: both models
    python3 bench/cache_speed.py --out-dir OUT --models resnet50   # one of them
    python3 bench/cache_speed.py --gpu none --model FILE.onnx --out FILE.json   # CPU dry run

Each model is exported here with torch (random weights, no downloads; ``bench/e2e.py``'s exporter, dynamic
batch) or taken from ``--model FILE``. Then the real command line runs twice, as a user would, with
``--shape`` at ``--batch`` (default 32):

- **cold** (``cold_s``): a fresh, empty tuning cache (``GRAPHOPT_CACHE_DIR``) *and* a fresh, empty
  compiled-kernel cache (``GRAPHOPT_KERNEL_CACHE``), nothing compiled beforehand: Python start-up, loading,
  rewriting, every NVRTC compile, every cuDNN plan build and every timing are inside the measured time;
- **warm** (``warm_s``): the same command again with the caches the cold run filled; it must be served
  from the tuning cache (every node ``cached``).

The issue's bars: ResNet-50 cold <= 60 s, warm <= 5 s; GPT-2 cold <= 60 s. Each run has its own time limit
(``--limit``, default 300 s; a run over it is killed with its worker processes and recorded as timed out).
Writes ``OUT/cache_speed_<gpu>.json`` after every model: ``cold_s``, ``warm_s`` and ``model`` of the first
model at the top level, every model's record under ``runs``. Exits 1 when a warm run was not served from
the cache or a run failed.

``--gpu none`` is a dry run for a machine without a GPU: it checks the script end to end, but nothing is
profiled or cached, so it asserts nothing about the cache and says so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import lzma
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # report this checkout's graphopt version, as the runs use it
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from lowering_bench import gpu_tag, write_atomic  # noqa: E402
from runtime_bench import versions  # noqa: E402
from graphopt.tune.candidate_run import BRIEFLY  # noqa: E402
from graphopt.tune.profiler import TWIN_REASON  # noqa: E402
MODELS = ("resnet50", "gpt2")
SEQ = 128
BARS = {"resnet50": {"cold_s": 60.0, "warm_s": 5.0}, "gpt2": {"cold_s": 60.0}}
# environment that changes what is measured, recorded with the result (CUDA_MODULE_LOADING=EAGER: every
# kernel module loaded when a library loads instead of at its first launch)
ENV_RECORDED = ("CUDA_MODULE_LOADING", "GRAPHOPT_TUNE_WORKERS", "CUDA_VISIBLE_DEVICES")


def _export(name: str, folder: Path) -> Path:
    """torchvision ResNet-50 / transformers GPT-2 124M, random weights, dynamic batch (bench/e2e.py)."""
    from torch_models import build_module, export

    path = folder / f"{name}.onnx"
    if not path.exists():
        export(name, build_module(name), path)
    return path


def _shape(name: str, batch: int) -> str:
    return f"input={batch}x{SEQ}" if name == "gpt2" else f"input={batch}x3x224x224"


def _run(cmd: list[str], env: dict, limit_s: float) -> tuple[float, int | None, str]:
    """(seconds, exit code or None on a timeout, stderr tail); its own process group, so a timeout also
    ends the profiler's worker processes."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=limit_s)
        return time.perf_counter() - t, proc.returncode, err.strip()[-2000:]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return time.perf_counter() - t, None, f"timed out after {limit_s:g} s (killed)"


def _summary(rep: dict) -> dict:
    modes: dict[str, int] = {}
    for row in rep.get("lowerings", []):
        modes[row["mode"]] = modes.get(row["mode"], 0) + 1
    return {"mode": rep.get("mode"), "target": rep.get("target"), "node_modes": dict(sorted(modes.items())),
            "custom_ops": rep.get("custom_ops"), "selection_summary": rep.get("selection_summary"),
            "optimize_seconds": rep.get("seconds"), "select_seconds": rep.get("timings", {}).get("select"),
            "tuning_time": rep.get("tuning_time"), "twins_measured_once": _with_reason(rep, TWIN_REASON),
            "timed_briefly": _with_reason(rep, BRIEFLY)}


def _with_reason(rep: dict, prefix: str) -> int:
    """Distinct (signature, candidate) pairs whose timing's reason starts with ``prefix``: the twins
    measured under another candidate's key (``TWIN_REASON``), the candidates timed briefly (``BRIEFLY``)."""
    return len({(row.get("signature"), t.get("candidate")) for row in rep.get("lowerings", [])
                for t in row.get("timings") or [] if str(t.get("reason", "")).startswith(prefix)})


def served_from_cache(rep: dict) -> bool:
    """The warm run's report says nothing was measured: mode ``cached``, or every node ``cached``, or
    (a node whose every candidate failed falls back to the heuristic) all of that node's timings came
    from the cache too. A node chosen by heuristic without any timings was not served from the cache."""
    rows = rep.get("lowerings", [])
    if rep.get("mode") == "cached":
        return True
    if not rows:
        return False

    def from_cache(row: dict) -> bool:
        if row.get("mode") == "cached":
            return True
        timings = row.get("timings") or []
        return row.get("mode") == "heuristic" and bool(timings) and all(
            t.get("cached") or t.get("status") == "pruned" for t in timings)

    return all(from_cache(r) for r in rows)


COLD_RUNS_FILE = Path(tempfile.gettempdir()) / "graphopt-cache-speed-cold-runs"


def earlier_cold_runs() -> int:
    """Cold tunings this script ran on this machine before the one about to start (counted in a file
    of the temporary directory). On the H100 a cold ResNet-50 with 8 workers took 64.7 s as a
    machine's first and 45.6 s as its second (2026-12-06; graphopt's own caches fresh both times), so
    every record says which it was. The driver's JIT cache explains about 10 s of such a difference;
    the libraries' page cache does not (bench/NOTES_e2e.md, sixth session)."""
    try:
        n = int(COLD_RUNS_FILE.read_text().strip() or 0)
    except (OSError, ValueError):
        n = 0
    try:
        COLD_RUNS_FILE.write_text(f"{n + 1}\n")
    except OSError:
        pass
    return n


def driver_jit_cache() -> dict:
    """Files and MB in the CUDA driver's JIT cache (``CUDA_CACHE_PATH``, default ``~/.nv/ComputeCache``):
    where the driver keeps what it compiled from PTX. Recorded around each run to test whether a
    machine's first cold tuning is slower because cuDNN's kernels are JIT-compiled for this GPU on first
    use (a cuDNN plan's first execution cost 183 ms on a fresh H100 and 54 ms on one that had tuned before,
    our own kernels' 2-4 ms) and whether the cache's size limit (``CUDA_CACHE_MAXSIZE``, 256 MiB unless set)
    is reached."""
    root = Path(os.environ.get("CUDA_CACHE_PATH") or Path.home() / ".nv" / "ComputeCache")
    files = size = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            try:
                size += os.path.getsize(os.path.join(dirpath, n))
                files += 1
            except OSError:
                pass
    return {"path": str(root), "files": files, "mb": round(size / 2**20, 1),
            "maxsize_env": os.environ.get("CUDA_CACHE_MAXSIZE"), "disabled_env": os.environ.get("CUDA_CACHE_DISABLE")}


def measure(name: str, model: Path, gpu: str, batch: int | None, limit_s: float, tmp: Path,
            tune_budget: float | None = None, profile_warm: bool = False) -> dict:
    """Cold then warm ``graphopt optimize`` of ``model``, with fresh caches in ``tmp``."""
    env = dict(os.environ)
    env["GRAPHOPT_CACHE_DIR"] = str(tmp / "tuning")
    env["GRAPHOPT_KERNEL_CACHE"] = str(tmp / "cubin")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("GRAPHOPT_DEBUG", None)
    rec: dict = {"model": name, "file": os.path.relpath(model, ROOT) if model.is_relative_to(ROOT) else model.name,
                 "batch": batch, "limit_s": limit_s, "earlier_cold_runs_on_machine": earlier_cold_runs(),
                 "driver_jit_cache": {"before": driver_jit_cache()}}
    outputs = []
    for phase in ("cold", "warm"):
        out, report = tmp / f"{phase}.onnx", tmp / f"{phase}.json"
        cmd = [sys.executable, "-m", "graphopt.cli", "optimize", str(model), "-o", str(out), "--gpu", gpu,
               "--report", str(report), "--quiet", "--force"]
        if batch is not None:
            cmd += ["--shape", _shape(name, batch)]
        if tune_budget and phase == "cold":  # a diagnosis run: the report (and its tuning_time) is written
            cmd += ["--tune-budget", str(tune_budget)]
        seconds, code, err = _run(cmd, env, limit_s)
        rec["driver_jit_cache"][f"after_{phase}"] = driver_jit_cache()
        rec[f"{phase}_s"] = round(seconds, 3)
        rec[f"{phase}_exit"] = code
        if code != 0:
            rec[f"{phase}_error"] = err
            break
        rec[phase] = _summary(json.loads(report.read_text()))
        outputs.append(out.read_bytes())
        if phase == "cold":
            rec["command"] = " ".join(["graphopt"] + cmd[3:]).replace(str(model), rec["file"]).replace(str(tmp), "$TMP")
    if "warm" in rec:
        rec["warm_served_from_cache"] = served_from_cache(json.loads((tmp / "warm.json").read_text()))
        rec["outputs_byte_identical"] = len(outputs) == 2 and outputs[0] == outputs[1]
        if len(outputs) == 2 and not rec["outputs_byte_identical"]:
            rec["output_differences"] = output_differences(tmp / "cold.onnx", tmp / "warm.onnx")
        if profile_warm:
            rec["warm_profile"] = _profile_warm(cmd, env, limit_s, tmp)
    if tune_budget:
        rec["tune_budget"] = tune_budget
        cut = rec.get("cold", {}).get("mode") == "partial"
        rec["cold_cut_short"] = cut
    for key, bar in BARS.get(name, {}).items():
        value = rec.get(key)
        rec[f"{key.split('_')[0]}_within_{bar:g}s"] = value is not None and rec.get(key.replace("_s", "_exit")) == 0 \
            and value <= bar and not (key == "cold_s" and rec.get("cold_cut_short"))
    return rec


def _text(value) -> str:
    """An attribute value as readable text (ONNX string attributes come back as bytes)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    elif isinstance(value, list):
        value = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
    return str(value)[:120]


def output_differences(a: Path, b: Path, limit: int = 12) -> dict:
    """Where two optimized models differ (why the cold and the warm run did not write the same bytes):
    the graphopt node attributes that differ, by node, then the model-level fields."""
    import onnx

    ma, mb = (onnx.load(str(p), load_external_data=False) for p in (a, b))
    out: dict = {"nodes": len(ma.graph.node), "nodes_other": len(mb.graph.node), "attributes": []}
    for na, nb in zip(ma.graph.node, mb.graph.node):
        if na == nb:
            continue
        aa = {x.name: onnx.helper.get_attribute_value(x) for x in na.attribute if x.type != onnx.AttributeProto.TENSOR}
        ab = {x.name: onnx.helper.get_attribute_value(x) for x in nb.attribute if x.type != onnx.AttributeProto.TENSOR}
        diff = {k: [_text(aa.get(k)), _text(ab.get(k))] for k in sorted(set(aa) | set(ab)) if aa.get(k) != ab.get(k)}
        if na.op_type != nb.op_type or na.input != nb.input or na.output != nb.output:
            diff["node"] = [f"{na.op_type} {list(na.input)}", f"{nb.op_type} {list(nb.input)}"]
        if not diff and na.doc_string != nb.doc_string:
            diff["doc_string"] = [na.doc_string[:120], nb.doc_string[:120]]
        if len(out["attributes"]) < limit:
            out["attributes"].append({"node": na.name, "op": na.op_type, "differs": diff or "other fields"})
    for field in ("metadata_props", "functions", "opset_import"):
        if getattr(ma, field) != getattr(mb, field):
            out.setdefault("model_fields", []).append(field)
    if ma.graph.initializer != mb.graph.initializer:
        out.setdefault("model_fields", []).append("graph.initializer")
    if ma.graph.value_info != mb.graph.value_info:
        out.setdefault("model_fields", []).append("graph.value_info")
    return out


def _profile_warm(cmd: list[str], env: dict, limit_s: float, tmp: Path, top: int = 45) -> dict:
    """One more warm run under cProfile (not timed with the others): where a warm run's seconds go."""
    import pstats

    prof = tmp / "warm.prof"
    pcmd = [cmd[0], "-m", "cProfile", "-o", str(prof)] + cmd[1:]
    pcmd[pcmd.index("-o", 4) + 1] = str(tmp / "warm_profiled.onnx")  # the optimize output, not the profile's
    seconds, code, err = _run(pcmd, env, limit_s)
    if code != 0 or not prof.exists():
        return {"exit": code, "error": err}
    buf = io.StringIO()
    pstats.Stats(str(prof), stream=buf).sort_stats("cumulative").print_stats(top)
    return {"seconds_under_profiler": round(seconds, 3), "top_cumulative": buf.getvalue().splitlines()[:top + 12]}


def keep_cache(src: Path, dest: Path) -> str:
    """Merge the tuning cache in ``src`` into ``dest`` through the CLI's own export and import."""
    dest.mkdir(parents=True, exist_ok=True)
    dump = src.parent / "cache_export.json"
    base = [sys.executable, "-m", "graphopt.cli", "cache"]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for cmd, folder in ((base + ["export", str(dump)], src), (base + ["import", str(dump)], dest)):
        p = subprocess.run(cmd, env=dict(env, GRAPHOPT_CACHE_DIR=str(folder)), capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            return f"failed: {' '.join(cmd[3:5])}: {(p.stderr or p.stdout).strip()[:300]}"
    return "ok"


def _write(path: Path | None, result: dict) -> None:
    if path is None:
        return
    write_atomic(path, json.dumps(result, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default=None, help="the --gpu to optimize for; 'none' is a dry run (default: this "
                                                "machine's GPU as --gpu auto names it, e.g. h200; none without one)")
    ap.add_argument("--models", default=",".join(MODELS), help="named models to export and measure (resnet50,gpt2)")
    ap.add_argument("--model", default=None, help="measure this ONNX file instead of the named models")
    ap.add_argument("--batch", type=int, default=32, help="tune at this batch (--shape); 0: no --shape")
    ap.add_argument("--limit", type=float, default=300.0, help="time limit of each optimize run, seconds")
    ap.add_argument("--out-dir", default=None, help="write OUT_DIR/cache_speed_<gpu>.json (default bench/results, "
                                                    "not for a dry run)")
    ap.add_argument("--out", default=None, help="write the result JSON to this file instead")
    ap.add_argument("--tune-budget", type=float, default=None,
                    help="pass --tune-budget to the cold run (a diagnosis: a run it cuts is not a cold time, and "
                         "the record says so)")
    ap.add_argument("--profile-warm", action="store_true",
                    help="after the timed runs, one more warm run under cProfile; its top functions go in the record")
    ap.add_argument("--keep-cache", default=None,
                    help="after each model, import its cold run's tuning cache into this GRAPHOPT_CACHE_DIR "
                         "(graphopt cache export / import), so that bench/e2e.py --cache-dir reuses the tuning")
    args = ap.parse_args(argv)
    if args.gpu is None:
        tag = gpu_tag()
        args.gpu = "none" if tag == "cpu" else tag
    dry = args.gpu.strip().lower() == "none"
    out = Path(args.out) if args.out else (
        Path(args.out_dir) / f"cache_speed_{args.gpu}.json" if args.out_dir else
        (None if dry else ROOT / "bench" / "results" / f"cache_speed_{args.gpu}.json"))
    result: dict = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "gpu": args.gpu,
        "machine": platform.node(), "versions": versions(), "dry_run": dry, "bars": BARS,
        "env": {k: os.environ[k] for k in ENV_RECORDED if k in os.environ},
        "method": ("cold: fresh empty GRAPHOPT_CACHE_DIR and GRAPHOPT_KERNEL_CACHE, nothing prebuilt, wall time of "
                   "the whole command (Python start-up, compiles, plan builds, profiling included); warm: the same "
                   "command again with those caches"),
        "runs": [],
    }
    if dry:
        result["note"] = ("dry run with --gpu none: nothing is profiled or cached, so the cache claim is not "
                          "checked; run with --gpu h200 on the device")
    ok = True
    with tempfile.TemporaryDirectory(prefix="graphopt-cache-speed-") as tmp:
        tmp = Path(tmp)
        if args.model:
            model = Path(args.model).resolve()
            if not model.exists():
                sys.exit(f"cache_speed: {model} not found")
            jobs = [(model.stem, lambda m=model: m)]
        else:
            (tmp / "models").mkdir()
            jobs = [(n, lambda n=n: _export(n, tmp / "models")) for n in args.models.split(",") if n]
        for name, get in jobs:
            try:
                model = get()
            except Exception as exc:  # noqa: BLE001 - recorded, the next model still runs
                result["runs"].append({"model": name, "error": f"export failed: {type(exc).__name__}: {exc}"[:500]})
                ok = False
                _write(out, result)
                continue
            work = tmp / name
            work.mkdir()
            rec = measure(name, model, args.gpu, args.batch or None, args.limit, work, args.tune_budget, args.profile_warm)
            result["runs"].append(rec)
            if args.keep_cache:
                rec["kept_cache"] = keep_cache(work / "tuning", Path(args.keep_cache))
            if out is not None and (work / "cold.json").exists():  # every candidate's result, for the notes
                # xz-compressed (2-5 MB of JSON a model, a tenth of that packed: the working tree the device
                # call sends is limited to 64 MiB), named by the GPU like every result
                out.parent.mkdir(parents=True, exist_ok=True)
                (out.parent / f"cache_speed_{args.gpu}_{name}_cold_report.json.xz").write_bytes(
                    lzma.compress((work / "cold.json").read_bytes()))
            if not result.get("model"):
                result.update({"model": name, "cold_s": rec.get("cold_s"), "warm_s": rec.get("warm_s")})
            ok = ok and rec.get("cold_exit") == 0 and rec.get("warm_exit") == 0 and (
                dry or bool(rec.get("warm_served_from_cache")))
            _write(out, result)
            print(f"cache_speed: {name}: cold {rec.get('cold_s')} s, warm {rec.get('warm_s')} s, served from cache: "
                  f"{rec.get('warm_served_from_cache')}", file=sys.stderr)
    _write(out, result)
    print(json.dumps(result, indent=2, sort_keys=True))
    if dry:
        print("cache_speed: DRY RUN (--gpu none): nothing was profiled or cached, so nothing about the cache was "
              "checked", file=sys.stderr)
        return 0 if ok else 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
