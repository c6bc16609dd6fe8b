"""How long graphopt's optimizer takes on the ~20,000-node GPT-2 export, next to onnxruntime's own graph
optimizer (level "extended") on the same file, in the same run, each as a fresh process (Python start-up
and imports included for both).

    python bench/optimizer_speed.py [--model models/torch/gpt2_20k_torchscript_op14.onnx] [--repeat 5]
                                    [--gpu a100] [--out bench/results/optimizer_speed.json]

graphopt runs as ``python -m graphopt.cli optimize MODEL -o OUT --gpu a100 --quiet`` (a target that is
not present: lowerings from the heuristic, with the tuning-size shape propagation a GPU target does;
``--gpu none`` skips that); onnxruntime as ``python -c`` building an ``InferenceSession`` with
``ORT_ENABLE_EXTENDED`` and ``optimized_model_filepath`` (the CPU provider). The runs alternate
(graphopt, onnxruntime, graphopt, ...) after one untimed warm-up of each (bytecode and the page cache),
so drift on the machine hits both alike. Wall-clock seconds; medians; ``ratio`` = graphopt median /
onnxruntime median (the issue's bar: at most 1.0). Also records each process's CPU seconds
(user + system of the child), which are less sensitive to other load on a shared machine, and the load
average before and after. Writes the JSON and a short .md beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ORT_CODE = (
    "import sys, onnxruntime as ort\n"
    "so = ort.SessionOptions()\n"
    "so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED\n"
    "so.optimized_model_filepath = sys.argv[2]\n"
    "ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])\n"
)


def _timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one command; exits on failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"optimizer_speed: `{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models/torch/gpt2_20k_torchscript_op14.onnx"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gpu", default="a100", help="graphopt's --gpu (default a100: not present here)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/optimizer_speed.json"))
    args = ap.parse_args(argv)
    import onnx
    import onnxruntime

    model = Path(args.model).resolve()
    nodes = len(onnx.load(model, load_external_data=False).graph.node)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode; so do these runs
    env.pop("GRAPHOPT_DEBUG", None)
    go_wall, go_cpu, ort_wall, ort_cpu = [], [], [], []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        go_cmd = [sys.executable, "-m", "graphopt.cli", "optimize", str(model), "-o", str(Path(tmp) / "go.onnx"),
                  "--gpu", args.gpu, "--quiet", "--force"]
        ort_cmd = [sys.executable, "-c", ORT_CODE, str(model), str(Path(tmp) / "ort.onnx")]
        _timed(go_cmd + ["--report", str(report)], env)  # warm-up (bytecode, page cache), untimed
        _timed(ort_cmd, env)
        for _ in range(args.repeat):
            w, c = _timed(go_cmd, env)
            go_wall.append(w)
            go_cpu.append(c)
            w, c = _timed(ort_cmd, env)
            ort_wall.append(w)
            ort_cpu.append(c)
        rep = json.loads(report.read_text())
    go_med, ort_med = statistics.median(go_wall), statistics.median(ort_wall)
    rel = os.path.relpath(model, ROOT)
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python"] + [Path(sys.argv[0]).as_posix()] + (argv if argv is not None else sys.argv[1:])),
        "graphopt_command": f"graphopt optimize {rel} -o OUT --gpu {args.gpu} --quiet",
        "onnxruntime_command": "python -c '<InferenceSession, ORT_ENABLE_EXTENDED, optimized_model_filepath>'",
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "versions": {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
                     "graphopt": __import__("graphopt").__version__},
        "model": rel,
        "model_nodes": nodes,
        "gpu": args.gpu,
        "repeat": args.repeat,
        "graphopt_seconds": [round(x, 3) for x in go_wall],
        "onnxruntime_extended_seconds": [round(x, 3) for x in ort_wall],
        "graphopt_cpu_seconds": [round(x, 3) for x in go_cpu],
        "onnxruntime_extended_cpu_seconds": [round(x, 3) for x in ort_cpu],
        "graphopt_median_s": round(go_med, 3),
        "onnxruntime_extended_median_s": round(ort_med, 3),
        "ratio": round(go_med / ort_med, 3),
        "cpu_ratio": round(statistics.median(go_cpu) / statistics.median(ort_cpu), 3),
        "graphopt_no_slower": go_med <= ort_med,
        "graphopt_nodes_after": rep.get("nodes_after"),
        "graphopt_custom_ops": rep.get("custom_ops"),
        "graphopt_mode": rep.get("mode"),
        "graphopt_phase_seconds": {k: round(v, 3) for k, v in (rep.get("timings") or {}).items()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    verdict = "at most" if result["graphopt_no_slower"] else "MORE than"
    out.with_suffix(".md").write_text(
        f"# Optimizer speed: graphopt against onnxruntime (extended)\n\n"
        f"`{result['command']}` on {result['date']}, {os.cpu_count()} cores, load average "
        f"{result['machine']['loadavg_before'][0]} before / {result['machine']['loadavg_after'][0]} after.\n\n"
        f"Model `{rel}` ({nodes} nodes). Each tool is a fresh process (Python start-up included), alternating, "
        f"{args.repeat} runs each after one untimed warm-up.\n\n"
        f"| tool | median wall s | runs (s) | median CPU s |\n|---|---|---|---|\n"
        f"| `{result['graphopt_command']}` | {result['graphopt_median_s']} | "
        f"{', '.join(map(str, result['graphopt_seconds']))} | {statistics.median(go_cpu):.3f} |\n"
        f"| onnxruntime {onnxruntime.__version__} ORT_ENABLE_EXTENDED | {result['onnxruntime_extended_median_s']} | "
        f"{', '.join(map(str, result['onnxruntime_extended_seconds']))} | {statistics.median(ort_cpu):.3f} |\n\n"
        f"Ratio (graphopt / onnxruntime, wall medians): **{result['ratio']}**: graphopt takes {verdict} as long "
        f"as onnxruntime's optimizer (the bar is 1.0). CPU-time ratio: {result['cpu_ratio']}.\n\n"
        f"graphopt's phases (one run, seconds): {json.dumps(result['graphopt_phase_seconds'])}.\n")
    print(json.dumps({k: result[k] for k in ("model_nodes", "graphopt_median_s", "onnxruntime_extended_median_s",
                                             "ratio", "cpu_ratio", "graphopt_no_slower")}))


if __name__ == "__main__":
    main()
