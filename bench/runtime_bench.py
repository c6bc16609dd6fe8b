"""What the whole-model runtime benchmarks share (bench/e2e.py, host_overhead.py, plan_breakdown.py):
the run's versions and GPU, the timer (CUDA events on the caller's stream, or the wall clock in a CPU
dry run), the error measure, and the options of the smaller benchmarks. The per-kernel benchmarks'
equivalents (header, budget, atomic results) are in ``lowering_bench.py``."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def err(e: BaseException) -> str:
    text = str(e).splitlines()[0][:300] if str(e) else ""
    return f"{type(e).__name__}: {text}"


# ------------------------------------------------------------------------------------ environment
def versions() -> dict:
    """The library versions and the code's commit that every result file records (e2e, host_overhead,
    plan_breakdown, cache_speed, and lowering_bench.env_header for the per-kernel benchmarks): one list,
    so no result file names a version another one leaves out. "cudnn" is the frontend package,
    "cudnn_backend" its library, "torch_cudnn" torch's; a module that does not import says why."""
    out = {"python": platform.python_version()}
    for mod in ("torch", "torchvision", "transformers", "cupy", "onnx", "onnxruntime", "numpy", "cudnn"):
        try:
            m = __import__(mod)
            out[mod] = str(getattr(m, "__version__", "?"))
            if mod == "cudnn":
                out["cudnn_backend"] = str(m.backend_version())
        except Exception as e:  # noqa: BLE001
            out[mod] = f"unavailable ({type(e).__name__})"
    try:
        import torch

        out["torch_cudnn"] = str(torch.backends.cudnn.version())
    except Exception:  # noqa: BLE001
        pass
    try:
        import graphopt

        out["graphopt"] = graphopt.__version__
    except Exception:  # noqa: BLE001
        pass
    out["git"] = os.environ.get("HEAD_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return out


def gpu_name(dry: bool) -> str:
    if dry:
        return "none (dry run on the CPU)"
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001
        return f"unknown ({type(e).__name__})"


# ------------------------------------------------------------------------------------ measuring
def timed(fn, sync, warmup: int, repeats: int, budget_s: float, event=None, walls: dict | None = None,
          field: str = "") -> float:
    """Median ms of ``fn`` after ``warmup`` runs (at most ``budget_s`` seconds of repeats).

    With ``event`` (``torch.cuda.Event``): CUDA events recorded on the caller's current stream before
    and after each call, the span every peer's work is ordered into (torch runs there; a graphopt
    session orders its own stream after it and back), host time before the first launch included.
    The host wall time of ``fn`` + ``sync`` is kept too, in ``walls[field]``. Without ``event`` (the
    CPU dry run): the wall time."""
    for _ in range(warmup):
        fn()
        sync()
    times, wall = [], []
    start = time.perf_counter()
    while len(times) < repeats:
        t0 = time.perf_counter()
        if event is not None:
            a, b = event(enable_timing=True), event(enable_timing=True)
            a.record()
            fn()
            b.record()
            sync()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            fn()
            sync()
        wall.append(time.perf_counter() - t0)
        if event is None:
            times.append(wall[-1])
        if time.perf_counter() - start > budget_s:
            break
    if walls is not None and field:
        walls[field] = round(float(np.median(wall) * 1e3), 4)
    return float(np.median(times) * 1e3)


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.abs(out - ref).max() / (np.abs(ref).max() + 1e-12))



# ------------------------------------------------------------------------------------ options
def runtime_bench_parser(doc: str, batches: str, repeats: int, repeats_help: str | None = None):
    """The options of ``host_overhead.py`` and ``plan_breakdown.py``: models and batches (built and
    exported as here), repeats, graphopt optimize's lowering options, the output folder and GPU name."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50,gpt2")
    ap.add_argument("--batches", default=batches)
    ap.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    ap.add_argument("--gpu-args", default="--gpu none", help="graphopt optimize's lowering options")
    ap.add_argument("--out", type=Path, required=True)
    from lowering_bench import GPU_NAME_HELP  # noqa: PLC0415 - lowering_bench imports this module

    ap.add_argument("--gpu-name", default=None, help=GPU_NAME_HELP)
    return ap


def runtime_bench_meta() -> dict:
    """Date, command line, GPU and the library versions (``versions``) of a runtime benchmark's run."""
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": " ".join(sys.argv),
            "gpu": gpu_name(False), **versions()}
