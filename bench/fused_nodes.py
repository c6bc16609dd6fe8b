"""The fused nodes' tuned times summed, per ``graphopt optimize --report`` file: what a model's custom
ops cost one by one, to set beside its end-to-end time (``bench/e2e.py`` records the same per row as
``fused_nodes_ms``). A report made offline from a device call's tuning cache gives the choices and
times that call made (``GRAPHOPT_CACHE_DIR=DIR graphopt optimize M.onnx --gpu h200 --report R.json``,
every node served from the cache).

    python3 bench/fused_nodes.py NAME=REPORT.json [...] --out bench/results/fused_nodes_h200.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections import defaultdict
from pathlib import Path

from e2e_report import chosen_ms, fused_nodes_ms  # bench/ is the script's directory: on sys.path
from lowering_bench import write_atomic


def summarize(report: dict) -> dict:
    total, missing = fused_nodes_ms(report)
    by: dict[str, float] = defaultdict(float)
    for r in report.get("lowerings") or []:
        ms = chosen_ms(r)
        if ms is not None:
            by[r.get("lowering", "?")] += ms
    return {"fused_nodes": len(report.get("lowerings") or []), "fused_nodes_ms": round(total, 4), "untimed_nodes": missing,
            "ms_by_lowering": {k: round(v, 4) for k, v in sorted(by.items())}, "mode": report.get("mode"),
            "layout_summary": report.get("layout_summary")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", help="NAME=REPORT.json")
    ap.add_argument("--out", type=Path, help="write the rows here (JSON)")
    ap.add_argument("--source", default="", help="where the reports came from, recorded")
    args = ap.parse_args(argv)
    rows = []
    for spec in args.reports:
        name, _, path = spec.partition("=")
        try:
            report = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            print(f"fused_nodes: cannot read {path or spec}: {exc}", file=sys.stderr)
            return 2
        rows.append({"model": name, **summarize(report)})
        print(f"{name}: {rows[-1]['fused_nodes']} fused nodes, {rows[-1]['fused_nodes_ms']} ms summed"
              + (f" ({missing} untimed)" if (missing := rows[-1]["untimed_nodes"]) else ""))
    if args.out:
        doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "source": args.source,
               "command": " ".join(["python3", "bench/fused_nodes.py"] + (argv if argv is not None else sys.argv[1:])),
               "method": "per node, the tuned time (CUDA events, median of the tuner's samples) of the candidate the report chose",
               "rows": rows}
        write_atomic(args.out, json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
