"""Which kernel configurations earn their place: reads kernel_explore_h200.json (or cbr_layers_h200.json)
and prints, per candidate key, on how many (layer, batch) rows it is the fastest and within 5% / 15%
of the fastest. Configurations that are never within 15% anywhere are candidates for removal from
the families in graphopt/kernels/cbr.py (pruning from data, not from guesses).

    python3 bench/prune_configs.py bench/results/kernel_explore_h200.json
"""

from __future__ import annotations

import collections
import json
import sys


def rank(rows: list[dict]) -> dict[str, collections.Counter]:
    stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in rows:
        times = row.get("times") or row.get("candidates") or {}
        ok = {k: v for k, v in times.items() if isinstance(v, (int, float))}
        if not ok:
            continue
        best = min(ok.values())
        for key, t in ok.items():
            s = stats[key]
            s["rows"] += 1
            s["best"] += t == best
            s["within5"] += t <= best * 1.05
            s["within15"] += t <= best * 1.15
    return stats


def main(path: str) -> None:
    with open(path) as f:
        data = json.load(f)
    stats = rank(data["rows"])
    print(f"{'best':>4} {'<=5%':>4} {'<=15%':>5} {'rows':>4}  key")
    for key, s in sorted(stats.items(), key=lambda kv: (-kv[1]["within5"], -kv[1]["within15"], kv[0])):
        print(f"{s['best']:4d} {s['within5']:4d} {s['within15']:5d} {s['rows']:4d}  {key}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/kernel_explore_h200.json")
