"""The CPU side of a cold and a warm ``graphopt optimize`` with the GPU present, measured without a GPU.

The GPU is faked at the edges the real run goes through (``detect_devices`` says an H200 is there,
the kernels' backend is the real candidate list, and the isolated worker answers every candidate
with a time fixed by its keys), so selection, the tuning cache, the layout choice and the writing
are the real code, and a warm run is served from the cache exactly as on the device. What this
does not contain: CUDA start-up, CuPy's and cuDNN's imports and listings (cuDNN is absent here, so
its candidates only say why), and the device's own CPU speed.

    python3 bench/warm_cpu.py --model M.onnx --shape input=32x3x224x224 --out bench/results/warm_cpu \
        [--tree /path/to/other/checkout ...] [--warm-runs 5]

Each ``--tree`` (default: this checkout) is measured in fresh processes with that tree first on
``sys.path``: one cold run on an empty cache, then ``--warm-runs`` warm runs, each its own process
(as a user's second command). Written: OUT.json and OUT.md with the median warm ``optimize_file``
seconds, its selection seconds, the cold ones, and whether the warm output is byte-identical to the
cold one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "bench"))  # as when run as a script: its siblings importable
from optimize_wall import git_commit  # noqa: E402

CHILD = r'''
import json, sys, time
sys.path.insert(0, sys.argv[4])  # bench/: this script, for the fake (its tree has no graphopt package)
t0 = time.perf_counter()
from warm_cpu import install_fake_h200
install_fake_h200()
from graphopt.pipeline import optimize_file
imports = time.perf_counter() - t0
model, out, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t = time.perf_counter()
_, rep = optimize_file(model, out, shapes=shapes or None, force=True)
import graphopt
print(json.dumps({"imports_s": imports, "optimize_s": time.perf_counter() - t, "mode": rep.mode, "graphopt": graphopt.__file__,
                  "select_s": rep.timings.get("select"), "timings": rep.timings}))
'''


class KeyedRunner:
    """Stands in for the profiler's isolated worker: every candidate passes, in a time fixed by the
    signature's and the candidate's keys (so a warm run's cache serves exactly what the cold run chose)."""

    workers_started = 0
    broken = None

    def __init__(self, *args, **kwargs):
        pass

    def run(self, sig, cand):
        import hashlib

        h = int(hashlib.sha256((sig.key() + cand.key()).encode()).hexdigest()[:8], 16)
        ms = 0.01 + (h % 1000) / 1e4
        return {"status": "ok", "samples": [ms * (1 + i / 1000) for i in range(5)], "reason": "", "phases": {}}

    def close(self):
        pass


def install_fake_h200(set_attr=setattr) -> None:
    """Make ``graphopt optimize`` in this process see an H200 and profile through :class:`KeyedRunner`
    (``set_attr``: ``monkeypatch.setattr`` in a test, so it is undone)."""
    import graphopt.tune.profiler as profiler
    import graphopt.tune.tuner as tuner
    from graphopt.tune.gpus import DeviceInfo

    h200 = DeviceInfo(0, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0", 140 << 30, 50 << 20, 132)
    set_attr(tuner, "detect_devices", lambda: [h200])
    set_attr(tuner, "kernels_backend",
             lambda: (tuner.TuningBackend(tuner.kernel_candidates(), None, None, None, None), ""))
    set_attr(profiler, "IsolatedRunner", KeyedRunner)


def _run(tree: Path, model: str, out: Path, shapes: dict, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "GRAPHOPT_CACHE_DIR": str(cache),
           "GRAPHOPT_KERNEL_CACHE": str(cache / "kernels")}
    # run from the output's folder: ``-c`` puts the working directory first on sys.path, and a run from
    # a checkout would import that checkout's graphopt whatever PYTHONPATH says
    proc = subprocess.run([sys.executable, "-c", CHILD, str(Path(model).resolve()), str(out), json.dumps(shapes),
                           str(HERE / "bench")], env=env, cwd=str(out.parent), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"warm_cpu: the run with {tree} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(tree: Path, model: str, shapes: dict, warm_runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="graphopt-warm-cpu-") as tmp:
        tmp = Path(tmp)
        cold = _run(tree, model, tmp / "cold.onnx", shapes, tmp / "cache")
        warms = [_run(tree, model, tmp / "warm.onnx", shapes, tmp / "cache") for _ in range(warm_runs)]
        identical = (tmp / "cold.onnx").read_bytes() == (tmp / "warm.onnx").read_bytes()
    med = lambda key: round(statistics.median(w[key] for w in warms), 3)  # noqa: E731
    if not Path(cold["graphopt"]).resolve().is_relative_to(tree):
        raise SystemExit(f"warm_cpu: {tree} was asked for, {cold['graphopt']} was imported")
    return {"tree": str(tree), "commit": git_commit(tree), "cold_optimize_s": round(cold["optimize_s"], 3),
            "cold_select_s": round(cold["select_s"], 3), "cold_mode": cold["mode"],
            "warm_optimize_s_median": med("optimize_s"), "warm_select_s_median": med("select_s"),
            "warm_imports_s_median": med("imports_s"), "warm_mode": warms[-1]["mode"], "warm_runs": warm_runs,
            "warm_optimize_s_all": [round(w["optimize_s"], 3) for w in warms],
            "outputs_byte_identical": identical}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--shape", action="append", default=[], help="NAME=D1xD2x... (repeatable)")
    ap.add_argument("--tree", action="append", default=[], help="a graphopt checkout to measure (repeatable)")
    ap.add_argument("--warm-runs", type=int, default=5)
    ap.add_argument("--out", required=True, help="output path without suffix (.json and .md are written)")
    args = ap.parse_args(argv)
    shapes = {}
    for item in args.shape:
        name, _, dims = item.partition("=")
        shapes[name] = [int(d) for d in dims.split("x")]
    trees = [Path(t).resolve() for t in args.tree] or [HERE]
    rows = []
    for tree in trees:
        rows.append(measure(tree, args.model, shapes, args.warm_runs))
        print(f"warm_cpu: {rows[-1]['commit']}: cold {rows[-1]['cold_optimize_s']} s, warm median "
              f"{rows[-1]['warm_optimize_s_median']} s (selection {rows[-1]['warm_select_s_median']} s), "
              f"byte-identical {rows[-1]['outputs_byte_identical']}", flush=True)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{platform.node()} ({os.cpu_count()} CPUs), Python {platform.python_version()}, no GPU",
           "command": " ".join(["python3", "bench/warm_cpu.py"] + (argv if argv is not None else sys.argv[1:])),
           "model": args.model, "shapes": shapes, "method": __doc__.split("\n\n")[1].replace("\n", " "), "rows": rows}
    Path(args.out + ".json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"# Cold and warm optimize, CPU side, GPU faked ({res['date']})", "", f"Command: `{res['command']}`; "
             f"{res['machine']}. {res['method']}", "",
             "| commit | cold s | cold selection s | warm s (median) | warm selection s | warm imports s | byte-identical |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['commit']} | {r['cold_optimize_s']} | {r['cold_select_s']} | {r['warm_optimize_s_median']} | "
                     f"{r['warm_select_s_median']} | {r['warm_imports_s_median']} | {r['outputs_byte_identical']} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
