"""The best measured time per (signature, family) from a tuning-cache export, as a results table.

Every candidate the tuner profiles is timed on the GPU (CUDA events, median of several runs) and kept
in the tuning cache with its samples, GPU and versions; this script turns an export of that cache
(``graphopt cache export FILE.json``) into a table for one op and GPU, the best candidate of each
family (graphopt's own kernels against each vendor) per signature, so a claim about which source wins
where rests on a committed file:

    GRAPHOPT_CACHE_DIR=DIR graphopt cache export /tmp/cache.json
    python3 bench/cache_timings.py /tmp/cache.json --gpu h100 --op CBR --grep group= --out bench/results/X

``--grep`` keeps signatures containing every given substring (``group=`` then drops ``group=1,``
with ``--exclude``). Writes ``X.json`` and ``X.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from lowering_bench import provider_of, write_atomic  # bench/ is the script's directory: on sys.path

from graphopt.kernels.registry import candidate_from_key


def family(entry: dict) -> str:
    """The source a timed candidate comes from, as ``lowering_bench.provider_of`` names it ("own" for
    graphopt's kernels, else the provider module); its lowering name for a key no longer known."""
    try:
        return provider_of(candidate_from_key(str(entry.get("op")), str(entry.get("candidate"))))
    except Exception:  # noqa: BLE001 - a key from an older graphopt: name it by its lowering
        return str(entry.get("lowering", "?"))


def best_per_family(entries: list[dict], gpu: str, op: str, grep: list[str], exclude: list[str],
                    since: float = 0.0, by: str = "source") -> list[dict]:
    """Per signature, each family's fastest ``ok`` timing; a family is the candidate's source (``own``,
    ``cudnn``, ...) or, with ``by="lowering"``, its lowering (``direct_k3``, ``depthwise_nhwc``, ...).
    ``since`` (epoch seconds) keeps only timings made then or later (a cache also holds older kernel
    versions' timings)."""
    rows: dict[str, dict] = {}
    for e in entries:
        sig = str(e.get("signature", ""))
        if (e.get("gpu") != gpu or e.get("op") != op or e.get("status") != "ok" or e.get("ms") is None
                or float(e.get("created") or 0.0) < since
                or not all(g in sig for g in grep) or any(x in sig for x in exclude)):
            continue
        row = rows.setdefault(sig, {"signature": sig, "best": {}})
        fam = family(e) if by == "source" else str(e.get("lowering", "?"))
        if fam not in row["best"] or float(e["ms"]) < row["best"][fam]["ms"]:
            row["best"][fam] = {"ms": float(e["ms"]), "candidate": e.get("candidate"), "samples": len(e.get("samples") or [])}
    return [rows[k] for k in sorted(rows)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", help="a `graphopt cache export` JSON file")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--op", default="CBR")
    ap.add_argument("--grep", action="append", default=[], help="keep signatures containing this (repeatable)")
    ap.add_argument("--exclude", action="append", default=[], help="drop signatures containing this (repeatable)")
    ap.add_argument("--out", required=True, help="output path without suffix (.json and .md are written)")
    ap.add_argument("--source", default="", help="where the cache came from (a device call, a date), recorded")
    ap.add_argument("--by", choices=("source", "lowering"), default="source",
                    help="group candidates by their source (own kernels, each provider) or by lowering")
    ap.add_argument("--since", default="", help="keep timings made at or after this UTC time (ISO, e.g. 2026-12-06T02:40)")
    args = ap.parse_args(argv)
    try:
        since = datetime.fromisoformat(args.since).replace(tzinfo=timezone.utc).timestamp() if args.since else 0.0
    except ValueError:
        print(f"cache_timings: --since {args.since!r} is not an ISO date/time (e.g. 2026-12-06T02:40)", file=sys.stderr)
        return 2
    try:
        data = json.loads(Path(args.export).read_text())
    except (OSError, ValueError) as exc:
        print(f"cache_timings: cannot read {args.export}: {exc}", file=sys.stderr)
        return 2
    entries = data.get("entries", []) if isinstance(data, dict) else []
    rows = best_per_family(entries, args.gpu, args.op, args.grep, args.exclude, since, args.by)
    versions = sorted({(e.get("cuda"), e.get("driver"), e.get("cupy")) for e in entries if e.get("gpu") == args.gpu})
    out = {"gpu": args.gpu, "op": args.op, "grep": args.grep, "exclude": args.exclude, "source": args.source, "since": args.since, "by": args.by,
           "versions (cuda, driver, cupy)": versions, "method": "tuner timings: CUDA events, median of the "
           "samples, each candidate checked against the float64 reference first", "command": " ".join(
               ["python3", "bench/cache_timings.py"] + (argv if argv is not None else sys.argv[1:])), "rows": rows}
    write_atomic(args.out + ".json", json.dumps(out, indent=1) + "\n")
    fams = sorted({f for r in rows for f in r["best"]})
    lines = [f"# Best measured time per {args.by}: {args.op} on {args.gpu}", "",
             f"Source: {args.source or 'a tuning cache (not named)'}"
             + (f" (timings made since {args.since} UTC)" if args.since else "") + f"; `{out['command']}`. Microseconds, the "
             f"best candidate of each {args.by} per signature (CUDA events, median of the tuner's samples).", "",
             "| signature | " + " | ".join(f"{f} us" for f in fams) + " | fastest |",
             "|---|" + "---:|" * len(fams) + "---|"]
    for r in rows:
        cells = [f"{r['best'][f]['ms'] * 1e3:.1f}" if f in r["best"] else "-" for f in fams]
        win = min(r["best"], key=lambda f: r["best"][f]["ms"])
        parts = r["signature"].split("|")  # op | shapes | dtypes | attributes | layout
        dtype = next((d for d in parts[2].split(",") if d), "") if len(parts) > 3 else ""
        lines.append(f"| `{parts[1]}` {dtype} {parts[3] if len(parts) > 3 else ''} | " + " | ".join(cells)
                     + f" | {win} |")
    write_atomic(args.out + ".md", "\n".join(lines) + "\n")
    print(f"cache_timings: {len(rows)} signatures -> {args.out}.json, .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
