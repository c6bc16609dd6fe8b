"""The report of ``bench/stem_engines.py``: its rows as JSON and as a Markdown table (plans fastest first, torch's
kernels and executed configuration, the descriptor diff), written atomically."""

from __future__ import annotations

import json
import os

from lowering_bench import write_atomic


def write(out_dir: str, tag: str, header: dict, rows: list) -> None:
    write_atomic(os.path.join(out_dir, f"stem_engines_{tag}.json"), json.dumps({"header": header, "rows": rows}, indent=1))
    lines = [f"# Stem engines on {header.get('gpu', tag)} ({header.get('date', '')})", "",
             f"Command: `{header.get('command', '')}`. Eager device time in us (median, CUDA events); error: max |y - "
             "ref| / max |ref| against a float32 convolution (TF32 off).", ""]
    for r in rows:
        lines += [f"## {r['layer']} bs{r['bs']} {r['dtype']}", "", "torch's kernels (profiler, mean us):", ""]
        lines += [f"- `{k}`: {v['mean_us']} us x{v['count']}" for k, v in r["torch_kernels"].items()]
        tp = r.get("torch_plan") or {}
        if tp:
            lines += ["", f"torch's executed configuration (cuDNN API log, {tp.get('log_bytes', 0)} bytes; the one it "
                      f"executed most): `{tp.get('function', '-')}` engine {tp.get('engine_id', '-')} knobs "
                      f"{json.dumps(tp.get('knobs', {}))}"
                      + (f" algo {tp['algo']}" if "algo" in tp else "") + (f"; {tp['error']}" if "error" in tp else "")]
            if tp.get("executions"):
                lines.append("- every configuration it executed: " + "; ".join(
                    f"engine {e['engine_id']} {json.dumps(e['knobs'])} x{e['count']}" for e in tp["executions"]))
        if "frontend_alignment" in r:
            lines.append(f"- the frontend's own tensor byte alignment for graphopt's graph: {json.dumps(r['frontend_alignment'])}")
        for e in r.get("torch_plan_on_graphopt_graph", []):
            lines.append(f"- on graphopt's graph with {e['knobs']}: " + (f"`{e.get('name')}` {e['us']} us, max rel err "
                         f"{e['max_rel_err']}" if "us" in e else f"refused: {e.get('refused')}"))
        if "descriptor_diff" in r:
            gp = r.get("graphopt_plan_log") or {}
            lines += ["", "What cuDNN was given, torch's execution against graphopt's with the same engine and knobs "
                      f"(graphopt's log: engine {gp.get('engine_id', '-')} knobs {json.dumps(gp.get('knobs', {}))}"
                      + (f"; {gp['error']}" if "error" in gp else "") + "):", "", "```diff"]
            lines += r["descriptor_diff"] or ["(no difference in the descriptors)"]
            lines += ["```"]
        timed = [e for e in r.get("heuristics_unfiltered", []) + r.get("engines", []) if "us" in e]
        timed.sort(key=lambda e: e["us"])
        lines += ["", "| source | plan | us | max rel err | barred by graphopt | workspace |", "|---|---|---:|---:|---|---:|"]
        for e in timed[:40]:
            src = f"heur {e['mode']}" if "mode" in e else f"engine {e['engine']}"
            lines.append(f"| {src} | `{e.get('name')}` | {e['us']} | {e['max_rel_err']} | {e.get('barred', '')} | {e['workspace']} |")
        for note, names in (r.get("barred_by_note") or {}).items():
            lines.append(f"- barred by `{note}`: {', '.join(f'`{n}`' for n in names) if isinstance(names, list) else names}")
        refused = [e for e in r.get("engines", []) if "refused" in e]
        tried = [e for e in r.get("engines", []) if "engine" in e]
        lines += ["", f"Engines refused: {len(refused)} of {len(tried)}.", ""]
        head = next((e for e in r.get("engines", []) if "engine_count" in e), None)
        if head:
            lines += [f"create_execution_plan after heuristics A: {json.dumps({k: v for k, v in head['appends'].items() if k != 'names'})}", ""]
    write_atomic(os.path.join(out_dir, f"stem_engines_{tag}.md"), "\n".join(lines) + "\n")
