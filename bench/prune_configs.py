"""Which kernel configurations earn their place: reads kernel_explore_h200.json (or cbr_layers_h200.json)
and prints, per candidate key, on how many (layer, batch, dtype) rows it is the fastest and within 5% /
15% of the fastest. Each provider's best plan competes too (the tactic competition the tuner runs): the
rows of ``bench/cbr_layers.py`` carry it (``<provider>_best_us``, measured in the same run); for an older
file without them, ``--with-cudnn cudnn_layers_h200.json`` brings cuDNN's from another run. So an own
configuration earns its place only where it is within 5% of the best of all. Configurations never within
5% anywhere are retired in graphopt/kernels/earned.py (pruning from data, not from guesses).

    python3 bench/prune_configs.py bench/results/cbr_layers_h200.json --md bench/results/prune_configs_h200.md
"""

from __future__ import annotations

import argparse
import collections
import json


def rank(rows: list[dict], vendor: dict | None = None) -> dict[str, collections.Counter]:
    stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in rows:
        times = row.get("times") or row.get("candidates") or {}
        ok = {k: v for k, v in times.items() if isinstance(v, (int, float))}
        if not ok:
            continue
        best = min(ok.values())
        # the providers' best plans compete: from another file (--with-cudnn), or from the row itself
        # (cbr_layers.py runs every provider beside our kernels and records each one's best)
        others = [(vendor or {}).get((row.get("layer"), row.get("bs"), row.get("dtype")))]
        others += [v for k, v in row.items() if k.endswith("_best_us") and k != "own_best_us"]
        for other in others:
            if isinstance(other, (int, float)):
                best = min(best, other)
        for key, t in ok.items():
            s = stats[key]
            s["rows"] += 1
            s["best"] += t == best
            s["within5"] += t <= best * 1.05
            s["within15"] += t <= best * 1.15
    return stats


def vendor_best(path: str) -> dict:
    with open(path) as f:
        rows = json.load(f)["rows"]
    return {(r["layer"], r["bs"], r["dtype"]): r["cudnn_best_us"] for r in rows if r.get("cudnn_best_us")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="?", default="bench/results/kernel_explore_h200.json")
    ap.add_argument("--with-cudnn", default=None, help="bench/results/cudnn_layers_h200.json: cuDNN competes")
    ap.add_argument("--md", default=None, help="also write this markdown table")
    args = ap.parse_args(argv)
    with open(args.results) as f:
        data = json.load(f)
    stats = rank(data["rows"], vendor_best(args.with_cudnn) if args.with_cudnn else None)
    lines = [f"{'best':>4} {'<=5%':>4} {'<=15%':>5} {'rows':>4}  key"]
    order = sorted(stats.items(), key=lambda kv: (-kv[1]["within5"], -kv[1]["within15"], kv[0]))
    for key, s in order:
        lines.append(f"{s['best']:4d} {s['within5']:4d} {s['within15']:5d} {s['rows']:4d}  {key}")
    print("\n".join(lines))
    if args.md:
        keep = [k for k, s in order if s["within5"]]
        with open(args.md, "w") as f:
            other = (f"cuDNN's best plan per fp16 layer from {args.with_cudnn} (another run, same GPU)" if args.with_cudnn
                     else "each provider's best plan measured in the same run (the rows' `<provider>_best_us`)")
            f.write(f"# Own CBR configurations against the fastest of all sources\n\n`python3 bench/prune_configs.py "
                    f"{args.results}{' --with-cudnn ' + args.with_cudnn if args.with_cudnn else ''}`: own timings from "
                    f"{args.results} against the other own configurations and {other}. {len(keep)} of {len(stats)} "
                    f"configurations are within 5% of the fastest on at least one (layer, batch, dtype) row."
                    f"\n\n| best | <=5% | <=15% | rows | key |\n|---|---|---|---|---|\n")
            for key, s in order:
                f.write(f"| {s['best']} | {s['within5']} | {s['within15']} | {s['rows']} | `{key}` |\n")


if __name__ == "__main__":
    main()
