"""bench/e2e.py's bookkeeping, without torch or a GPU (tested on the CPU in tests/runtime/test_e2e_report.py):
which rows a run makes, whether a tuning was complete (from ``graphopt optimize --report``), merging rows
of several calls into one file, issue 15's acceptance checks and the markdown table."""

from __future__ import annotations

import json
from pathlib import Path

from lowering_bench import write_atomic
from torch_models import MODELS

FP32_MODELS = ("resnet50", "bert")
FP16_RTOL = 1e-2  # the runtime's documented fp16 tolerance (tests/gpu/test_runtime_gpu.py)
FP32_RTOL = 1e-3  # issue 15: outputs match onnxruntime CPU within 1e-3 relative in fp32
FIELDS = ("model", "bs", "dtype", "graphopt_ms", "graphopt_unoptimized_ms", "torch_eager_ms", "torch_compile_ms",
          "host_us_per_node", "optimize_s", "tuning_complete", "peak_mb", "torch_peak_mb")


def row_plan(models, batches, dtypes) -> list[tuple[str, int, str]]:
    """(model, bs, dtype) in run order: fp16 for every model, fp32 only for FP32_MODELS."""
    return [(m, bs, dt) for m in models for dt in dtypes for bs in batches if dt == "fp16" or m in FP32_MODELS]


def tuning_status(report: dict) -> tuple[bool, dict]:
    """(complete, summary) from ``graphopt optimize --report``: complete when every fused node was
    profiled, served from the cache, or had every candidate measured (and fail) before the heuristic
    took it. A node left to the heuristic without measurements (nothing profiled, a timeout, a worker
    that could not start) makes it incomplete."""
    rows = report.get("lowerings") or []
    modes: dict[str, int] = {}
    unmeasured = []
    for r in rows:
        mode = r.get("mode")
        modes[mode] = modes.get(mode, 0) + 1
        if mode in ("profiled", "cached"):
            continue
        timings = r.get("timings") or []
        measured = [t for t in timings if t.get("status") != "pruned"]
        if mode == "heuristic" and measured and all(t.get("status") not in ("timeout", "worker_failed") for t in measured):
            continue  # every candidate was measured and failed
        unmeasured.append(r.get("node"))
    summary = {"report_mode": report.get("mode"), "node_modes": dict(sorted(modes.items(), key=lambda kv: str(kv[0]))),
               "unmeasured_nodes": unmeasured[:20], "selection_summary": report.get("selection_summary")}
    return (report.get("mode") not in (None, "none") and not unmeasured), summary


def chosen_ms(node: dict) -> float | None:
    """The tuned time (ms) of the candidate a report's node row chose, or None where it has none."""
    chosen = node.get("lowering", "") + (f":{node['params']}" if node.get("params") else "")
    return next((float(t["ms"]) for t in node.get("timings") or [] if t.get("candidate") == chosen and t.get("ms")), None)


def fused_nodes_ms(report: dict) -> tuple[float, int]:
    """(sum of the chosen candidates' tuned times in ms, nodes without one) over the report's fused nodes:
    what the model's custom ops cost one by one, so ``graphopt_ms`` less it is what the standard steps
    and the gaps between nodes cost (EfficientNet-B0 bs32 on the H200: 0.954 of 1.943 ms)."""
    total, missing = 0.0, 0
    for r in report.get("lowerings") or []:
        ms = chosen_ms(r)
        if ms is None:
            missing += 1
        else:
            total += float(ms)
    return total, missing


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """Rows keyed by (model, bs, dtype); a newer row (by its ``date``, else by coming later) replaces an older one. When the older row's tuning
    was cut, its ``optimize_s_all_calls`` is added to the newer one's (the tuning resumed from the cache).
    Sorted by model order, dtype, batch."""
    by_key = {(r["model"], r["bs"], r["dtype"]): r for r in old}
    for r in new:
        k = (r["model"], r["bs"], r["dtype"])
        prev = by_key.get(k)
        if prev is not None and r.get("date") and prev.get("date") and r["date"] < prev["date"]:
            continue  # an older measurement (a device call's copy of a file merged before) never wins
        r = dict(r)
        if prev is not None and prev.get("tuning_complete") is False and r.get("optimize_s") is not None:
            r["optimize_s_all_calls"] = round((prev.get("optimize_s_all_calls") or prev.get("optimize_s") or 0.0)
                                              + r["optimize_s"], 1)
        by_key[k] = r
    order = {m: i for i, m in enumerate(MODELS)}
    return sorted(by_key.values(), key=lambda r: (order.get(r["model"], 99), r["model"], r["dtype"], r["bs"]))


def ratio(a, b):
    return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def acceptance(rows: list[dict]) -> list[dict]:
    """Issue 15's acceptance checks on the merged rows; value None: not measured."""
    checks = []
    get = {(r["model"], r["bs"], r["dtype"]): r for r in rows}

    def add(check, value, ok):
        checks.append({"check": check, "value": value, "pass": None if value is None else bool(ok(value))})

    for m in MODELS:
        for bs in (1, 32):
            r = get.get((m, bs, "fp16")) or {}
            need = 0.8 if (m, bs) in (("resnet50", 32), ("gpt2", 1)) else 1.0
            # the paired rounds' ratio where the row has it (both peers timed a second apart), else the medians'
            value = r.get("paired_ratio") or ratio(r.get("graphopt_ms"), r.get("torch_compile_ms"))
            add(f"{m} bs{bs} fp16: graphopt <= {need} x torch.compile (fully tuned)",
                value if r.get("tuning_complete") else None, lambda v, need=need: v <= need)
    for r in rows:
        add(f"{r['model']} bs{r['bs']} {r['dtype']}: optimized >= 1.3x unoptimized",
            ratio(r.get("graphopt_unoptimized_ms"), r.get("graphopt_ms")), lambda v: v >= 1.3)
        if r["dtype"] == "fp32":
            add(f"{r['model']} bs{r['bs']} fp32: max rel err vs onnxruntime CPU <= {FP32_RTOL}",
                r.get("max_rel_err_vs_ort_cpu"), lambda v: v <= FP32_RTOL)
        else:
            add(f"{r['model']} bs{r['bs']} fp16: max rel err vs torch <= {FP16_RTOL}",
                r.get("max_rel_err_vs_torch"), lambda v: v <= FP16_RTOL)
    hs = [r["host_us_per_node"] for r in rows if r.get("host_us_per_node") is not None]
    add("host time per node without CUDA graphs <= 15 us (worst row)", max(hs) if hs else None, lambda v: v <= 15.0)
    return checks


def _f(v, nd=3):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def markdown(doc: dict) -> str:
    rows = doc["rows"]
    lines = [f"# End to end on {doc.get('gpu', '?')}", "",
             f"Merged from {len(doc.get('runs', []))} run(s); the last: {doc.get('date')}, `{doc.get('command')}`. "
             "Each row's date, GPU, versions and command are in the JSON.", "",
             "Median ms per batch, timed with CUDA events recorded on the caller's stream around each call (host "
             "time before the first launch included); a row without a `timing` field in the JSON was timed with the "
             "host's wall clock and a synchronisation instead, and `wall_ms` keeps that figure for newer rows. "
             "graphopt = the optimized model (tuned on this GPU) on the graphopt runtime with "
             "CUDA graphs; unopt = the runtime on the exported model; host us/node = host time per step without CUDA "
             "graphs; peak MB = GPU memory (graphopt: CuPy pool high-water mark; torch: max_memory_allocated); "
             "err = max |out - ref| / max |ref| against torch eager (and onnxruntime CPU for fp32). graphopt/compile "
             "paired = the median ratio over rounds that time the two alternately (a second apart, the machine in "
             "one state); the acceptance check takes it where a row has it.", "",
             "| model | bs | dtype | graphopt | unopt | torch eager | torch.compile | compile/graphopt | "
             "graphopt/compile paired | host us/node | "
             "optimize s | tuned | peak MB | torch peak MB | err vs torch | err vs ORT | notes |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        notes = "; ".join(f"{k}: {v}" for k, v in (r.get("errors") or {}).items())
        if r.get("graphopt_static_outputs_ms") is not None:  # copy_outputs=False: torch.compile's output contract
            paired = f", paired {_f(r['paired_ratio_static_outputs'], 3)}" if r.get("paired_ratio_static_outputs") else ""
            notes = "; ".join(x for x in (f"outputs not copied: {_f(r['graphopt_static_outputs_ms'])} ms{paired}", notes) if x)
        if r.get("graphopt_all_barriers_ms") is not None:  # the runtime's barrier rule switched off
            b = r.get("barriers") or {}
            paired = f", paired {_f(r['paired_ratio_barrier_rule'], 3)}" if r.get("paired_ratio_barrier_rule") else ""
            dropped = f" ({b.get('dropped')} of {b.get('dropped', 0) + b.get('kept', 0)} dropped)" if b else ""
            notes = "; ".join(x for x in (f"every barrier kept: {_f(r['graphopt_all_barriers_ms'])} ms{paired}{dropped}",
                                          notes) if x)
        if r.get("fused_nodes_ms") is not None:
            notes = "; ".join(x for x in (f"fused nodes alone: {_f(r['fused_nodes_ms'])} ms", notes) if x)
        if r.get("fp16_model") and "precision" not in r["fp16_model"]:
            notes = "; ".join(x for x in (f"fp16 model: {r['fp16_model']}", notes) if x)
        opt = r.get("optimize_s")
        if r.get("optimize_s_all_calls"):
            opt = f"{_f(opt, 1)} ({_f(r['optimize_s_all_calls'], 1)} over calls)"
        lines.append(
            f"| {r['model']} | {r['bs']} | {r['dtype']} | {_f(r.get('graphopt_ms'))} | {_f(r.get('graphopt_unoptimized_ms'))} | "
            f"{_f(r.get('torch_eager_ms'))} | {_f(r.get('torch_compile_ms'))} | "
            f"{_f(ratio(r.get('torch_compile_ms'), r.get('graphopt_ms')), 2)} | {_f(r.get('paired_ratio'), 3)} | "
            f"{_f(r.get('host_us_per_node'), 1)} | "
            f"{opt if isinstance(opt, str) else _f(opt, 1)} | {_f(r.get('tuning_complete'))} | {_f(r.get('peak_mb'), 0)} | "
            f"{_f(r.get('torch_peak_mb'), 0)} | {_f(r.get('max_rel_err_vs_torch'), 5)} | {_f(r.get('max_rel_err_vs_ort_cpu'), 5)} | "
            f"{notes.replace('|', '/')} |")
    lines += ["", "## Acceptance checks (issue 15)", "", "| check | value | pass |", "|---|---:|---|"]
    for c in doc.get("acceptance", []):
        lines.append(f"| {c['check']} | {_f(c['value'], 3)} | {'-' if c['pass'] is None else ('yes' if c['pass'] else 'NO')} |")
    return "\n".join(lines) + "\n"


def load_doc(path: Path) -> dict:
    if not path.exists():
        return {"rows": [], "runs": []}
    doc = json.loads(path.read_text())
    doc.setdefault("runs", [])
    doc["rows"] = [r for r in doc.get("rows", []) if r.get("bs") is not None and r.get("dtype")]
    return doc


def merge_files(dest: Path, sources: list[Path]) -> dict:
    """Merge the e2e JSON files that device calls brought back into ``dest`` (rows by ``merge_rows``, in the
    order given; runs de-duplicated, by date), recompute the acceptance checks from the merged rows and
    write ``dest`` and its markdown beside it."""
    doc = load_doc(dest)
    runs = {json.dumps(r, sort_keys=True): r for r in doc["runs"]}
    for src in sources:
        new = load_doc(src)
        doc["rows"] = merge_rows(doc["rows"], new["rows"])
        runs.update((json.dumps(r, sort_keys=True), r) for r in new["runs"])
        doc.update({k: v for k, v in new.items() if k not in ("rows", "runs", "acceptance")})
    doc["runs"] = sorted(runs.values(), key=lambda r: r.get("date", ""))
    doc["acceptance"] = acceptance(doc["rows"])
    write_atomic(dest, json.dumps(doc, indent=1) + "\n")
    write_atomic(dest.with_suffix(".md"), markdown(doc))
    return doc


if __name__ == "__main__":  # python3 bench/e2e_report.py bench/results/e2e_h200.json OUT1/e2e_h200.json ...
    import sys

    if len(sys.argv) < 3:
        raise SystemExit("usage: python3 bench/e2e_report.py DEST.json SOURCE.json... (merges device results into DEST)")
    merge_files(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
