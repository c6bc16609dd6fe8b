"""Wall time of ``graphopt optimize`` on big exports, this checkout against another one, on the CPU.

    python bench/optimize_wall.py --model /tmp/gpt2.onnx --shape input=32x128 --other /tmp/old_checkout \
        [--gpu none] [--repeat 3] --out bench/results/optimize_wall_cpu.json

The models are bench/torch_models.py exports (``python bench/torch_models.py``: GPT-2 124M is 650 MB,
torchvision ResNet-50 100 MB; not committed). Each run is a fresh process (``python -m graphopt.cli
optimize ... -q --force``) with ``PYTHONPATH`` set to one checkout; the two checkouts alternate after
one untimed warm-up each (the page cache), so drift hits both alike. Records medians, every run, the
output files' equality (byte for byte) and the machine. Several ``--model``/``--shape`` pairs may be
given; the JSON is rewritten after each model.
"""

from __future__ import annotations

import argparse
import datetime as dt
import filecmp
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_commit(checkout: Path) -> str:
    """The short commit of a checkout ("?" outside git): ``bench/warm_cpu.py`` labels its rows with it too."""
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def _run(checkout: Path, model: str, shape: str, gpu: str, out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, "-m", "graphopt.cli", "optimize", model, "-o", str(out), "--gpu", gpu, "--shape", shape,
           "-q", "--force"]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, cwd=tempfile.gettempdir())
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--shape", action="append", required=True)
    ap.add_argument("--other", required=True, type=Path, help="the checkout to compare with (its root folder)")
    ap.add_argument("--gpu", default="none")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    if len(args.model) != len(args.shape):
        ap.error("give one --shape per --model")
    doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "command": " ".join([sys.executable] + sys.argv),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
           "this": {"checkout": str(ROOT), "git": git_commit(ROOT)}, "other": {"checkout": str(args.other), "git": git_commit(args.other)},
           "gpu": args.gpu, "models": []}
    with tempfile.TemporaryDirectory(prefix="graphopt-wall-") as tmp:
        for model, shape in zip(args.model, args.shape):
            outs = {k: Path(tmp) / f"{k}.onnx" for k in ("this", "other")}
            roots = {"this": ROOT, "other": args.other}
            for k in roots:  # warm-up: the page cache, bytecode
                _run(roots[k], model, shape, args.gpu, outs[k])
            runs: dict[str, list[float]] = {"this": [], "other": []}
            for _ in range(args.repeat):
                for k in ("other", "this"):
                    runs[k].append(round(_run(roots[k], model, shape, args.gpu, outs[k]), 3))
            row = {"model": model, "bytes": os.path.getsize(model), "shape": shape, "runs_s": runs,
                   "median_s": {k: round(statistics.median(v), 3) for k, v in runs.items()},
                   "outputs_identical": filecmp.cmp(outs["this"], outs["other"], shallow=False)}
            doc["models"].append(row)
            print(json.dumps(row))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
