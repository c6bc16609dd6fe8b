"""Replays a cold tuning's schedule on the CPU: the real profiler, its worker processes and GPU lock,
with candidates that sleep for the phases a device report measured (no GPU needed).

A cold ResNet-50 on the H100 (``bench/results/cache_speed_h100_resnet50_cold_report_a276967.json.xz``,
one candidate a GPU turn) spent 64 s in selection while its 4 workers' recorded phases (restarts
aside) sum to about 33 s a worker. This script asks
whether the turn-taking (``graphopt.tune.candidate_run._gpu_turn``: checks hold the GPU lock shared,
timings exclusively) explains the gap: every candidate of the report becomes a sleeping candidate with
its lowering's average build, check and timing seconds, spread over the report's signatures as the
profiler spreads them, and the replay's wall time is compared with the lower bounds (all timings in a
row; every worker's own work).

    python bench/tuning_schedule_cpu.py [--report R.json.xz] [--workers 4] [--batch 8] [--scale 1.0] [--out F.json]

``--scale`` shrinks every sleep (0.25: a quarter of the time) so a replay takes less than the run.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import platform
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from graphopt.lowering.contract import Candidate, Signature  # noqa: E402
from graphopt.tune.gpus import DeviceInfo  # noqa: E402
from graphopt.tune.profiler import Profiler  # noqa: E402

DEFAULT_REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                              "cache_speed_h100_resnet50_cold_report_a276967.json.xz")


class _Sleeper:
    """A built candidate: its check and timing sleep for the report's seconds."""

    def __init__(self, check_s: float, time_s: float):
        self.check_s, self.time_s = check_s, time_s

    def __call__(self, inputs, outputs):
        return None


@dataclass(frozen=True)
class SleepCandidate(Candidate):
    """params: (("i", n), ("build", s), ("check", s), ("time", s))."""

    def applies(self, sig, compute_capability=(9, 0)):
        return None

    def source_hash(self) -> str:
        return "sleep"

    def build(self, sig, arch):
        p = dict(self.params)
        time.sleep(p["build"])
        return _Sleeper(p["check"], p["time"])


def sleep_checker(sig, launch):
    time.sleep(launch.check_s)  # the Lowering build() was wrapped in hands on the _Sleeper's attributes
    return None


def sleep_timer(launch, inputs, outputs):
    t = launch.time_s
    time.sleep(t)
    return [t * 1e3 / 50] * 5  # ms per run as a real timer reports it (any positive figure serves)


def per_run_phases(report: dict) -> dict[str, tuple[int, float, float, float]]:
    """lowering -> (runs, build s, check s, time s per run) from the report's tuning_time."""
    tt = report["tuning_time"]
    out = {}
    for low, runs in tt["runs_by_lowering"].items():
        ph = tt["lowering_phases_s"].get(low, {})
        out[low] = (runs, ph.get("build", 0.0) / runs, ph.get("check", 0.0) / runs, ph.get("time", 0.0) / runs)
    return out


def signatures_of(report: dict, phases, scale: float) -> list[tuple[Signature, list[SleepCandidate]]]:
    """The report's distinct signatures, each with its candidates that ran (not pruned, not cached),
    every candidate sleeping its lowering's average phases."""
    seen: dict[str, list[SleepCandidate]] = {}
    k = 0
    for row in report.get("lowerings", []):
        sig = row.get("signature")
        if not sig or sig in seen:
            continue
        cands = seen[sig] = []
        for t in row.get("timings", []):
            if t.get("status") == "pruned" or t.get("cached") or t["lowering"] not in phases:
                continue
            _, b, c, tm = phases[t["lowering"]]
            cands.append(SleepCandidate(t["lowering"], (("i", k), ("build", b * scale), ("check", c * scale),
                                                        ("time", tm * scale))))
            k += 1
    return [(Signature(op="Sleep", input_shapes=((i,),), dtypes=("float16",)), cs) for i, cs in enumerate(seen.values())]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", default=DEFAULT_REPORT)
    ap.add_argument("--workers", type=int, default=4, help="workers sharing the GPU (the report's run: 16 cores, so 4)")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=0, help="candidates a worker checks before one timing turn "
                    "(default: the profiler's, graphopt.tune.runners.TIME_BATCH)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    opener = lzma.open if args.report.endswith(".xz") else open
    with opener(args.report, "rt") as f:
        report = json.load(f)
    from graphopt.tune import runners

    if args.batch:
        runners.TIME_BATCH = args.batch
    import tuning_schedule_cpu as this  # the worker unpickles these classes by module name, not __main__

    phases = per_run_phases(report)
    sigs = this.signatures_of(report, phases, args.scale)
    by_sig = {s.key(): cs for s, cs in sigs}
    dev = DeviceInfo(0, "replay", "h100", (9, 0), "13.0", "13.0", "14.2.0")
    t0 = time.perf_counter()
    with Profiler(lambda sig: by_sig[sig.key()], timer=this.sleep_timer, checker=this.sleep_checker, device=dev,
                  workers_per_gpu=args.workers) as prof:
        prof.profile_many([s for s, _ in sigs])
        tt = prof.tuning_time()
    wall = time.perf_counter() - t0
    build_s, check_s, time_s = (sum(runs * per[i] for runs, *per in phases.values()) * args.scale for i in range(3))
    per_worker = (build_s + check_s + time_s) / args.workers
    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:])),
        "machine": f"{platform.node()} ({os.cpu_count()} cores), Python {platform.python_version()}",
        "report": os.path.relpath(args.report), "workers": args.workers, "scale": args.scale,
        "batch": runners.TIME_BATCH,
        "signatures": len(sigs), "candidates": sum(len(cs) for _, cs in sigs),
        "replay_wall_s": round(wall, 2),
        "report_select_s": round(report.get("timings", {}).get("select", 0.0) * args.scale, 2),
        "bound_all_timings_s": round(time_s, 2),
        "bound_work_per_worker_s": round(per_worker, 2),
        "phases_s": tt.get("phases_s"),
    }
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
