"""How long graphopt's optimizer takes on a ~20,000-node GPT-2 export, next to onnxruntime's own
graph optimizer (level "extended") on the same file, in the same run.

    python bench/optimizer_speed.py [--model models/torch/gpt2_20k_torchscript_op14.onnx] [--repeat 3]

Writes bench/results/optimizer_speed.json (date, machine, versions, command, every timing, medians).
Both are timed end to end from the file on disk to the optimized file on disk: graphopt with
``--gpu none`` (no profiling), onnxruntime by building a session with ``optimized_model_filepath``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def time_graphopt(model: Path, out: Path) -> tuple[float, dict]:
    from graphopt.pipeline import optimize_file

    t = time.perf_counter()
    _, report = optimize_file(model, out, gpu="none")
    return time.perf_counter() - t, report.to_dict()


def time_ort(model: Path, out: Path) -> float:
    import onnxruntime as ort

    t = time.perf_counter()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models/torch/gpt2_20k_torchscript_op14.onnx"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench/results/optimizer_speed.json"))
    args = ap.parse_args()
    import onnx
    import onnxruntime

    model = Path(args.model)
    nodes = len(onnx.load(model, load_external_data=False).graph.node)
    go, ortt = [], []
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):  # interleaved, so drift on the machine hits both alike
            s, report = time_graphopt(model, Path(tmp) / f"go{i}.onnx")
            go.append(s)
            ortt.append(time_ort(model, Path(tmp) / f"ort{i}.onnx"))
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "graphopt": __import__("graphopt").__version__},
        "model": str(model.relative_to(ROOT) if model.is_relative_to(ROOT) else model),
        "model_nodes": nodes,
        "graphopt_seconds": go,
        "onnxruntime_extended_seconds": ortt,
        "graphopt_median_s": statistics.median(go),
        "onnxruntime_extended_median_s": statistics.median(ortt),
        "graphopt_nodes_after": report.get("nodes_after"),
        "graphopt_rewrites": report.get("rewrites"),
        "graphopt_custom_ops": report.get("custom_ops"),
        "graphopt_phase_seconds": report.get("timings"),
        "graphopt_no_slower": statistics.median(go) <= statistics.median(ortt),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("model_nodes", "graphopt_median_s", "onnxruntime_extended_median_s", "graphopt_no_slower")}))


if __name__ == "__main__":
    main()
