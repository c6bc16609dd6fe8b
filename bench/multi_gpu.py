"""Tuning spread over several GPUs of one host (issue "Tuning spread over several GPUs"): one call on a
machine with two GPUs of the same model.

For each model: `graphopt optimize --gpu h200 --precision fp16` with a fresh tuning cache, first with
CUDA_VISIBLE_DEVICES restricted to one GPU, then with both; the wall time of each (compiles included),
the report's per-node rows, and every node whose recorded lowering differs between the two outputs, with
both candidates' times so a difference can be judged against measurement noise. Then the two-GPU run
again with one profiler worker killed (SIGKILL) a few seconds in: the run must finish, the output must
verify against the original (``--verify``), and every custom node must carry a lowering.

    python3 bench/multi_gpu.py --models models/torch/resnet50_dynamo_op18.onnx,models/torch/gpt2_dynamo_op18.onnx \\
        --out bench/results/multi_gpu_h200x2.json

Writes the JSON after every step (a call cut short keeps what it measured) and a short .md beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _children(pid: int) -> list[int]:
    """Every process whose parent chain reaches ``pid`` (from /proc; no psutil needed)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                parent[int(d.name)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def optimize(model: str, out: Path, gpus: str, cache: Path, kill_after: float | None, timeout: float) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "GRAPHOPT_CACHE_DIR": str(cache),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    report = out.with_suffix(".report.json")
    cmd = [sys.executable, "-m", "graphopt.cli", "optimize", model, "-o", str(out), "--gpu", "h200", "--precision", "fp16",
           "--report", str(report), "--verify", "-q", "--force"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    killed = None
    if kill_after is not None:
        time.sleep(kill_after)
        kids = _children(proc.pid)
        if kids:
            killed = kids[-1]
            os.kill(killed, signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return {"error": f"timed out after {timeout} s", "wall_s": timeout}
    row = {"gpus": gpus, "wall_s": round(time.perf_counter() - t0, 1), "exit": proc.returncode,
           "killed_worker_pid": killed, "stderr_tail": err.strip()[-500:]}
    if report.exists():
        rep = json.loads(report.read_text())
        row["mode"] = rep.get("mode")
        row["lowerings"] = rep.get("lowerings", [])
    return row


def lowerings(path: Path) -> dict[str, str]:
    import onnx

    m = onnx.load(path, load_external_data=False)
    out = {}
    for n in m.graph.node:
        if n.domain == "graphopt":
            a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
            low = a.get("lowering", b"")
            params = a.get("lowering_params", b"")
            out[n.name] = f"{low.decode() if isinstance(low, bytes) else low}:{params.decode() if isinstance(params, bytes) else params}"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, help="comma list of ONNX files")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "multi_gpu_h200x2.json"))
    ap.add_argument("--timeout", type=float, default=280.0, help="seconds per optimize")
    ap.add_argument("--kill-after", type=float, default=8.0, help="seconds into the killed-worker run")
    args = ap.parse_args(argv)
    res = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
           "command": "python3 bench/multi_gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "near_tie_rule": "the profiler merges results in model order and breaks equal medians by candidate key; a "
                            "winner may differ between runs only where the two candidates' medians are within noise",
           "models": []}
    out = Path(args.out)

    def save():
        out.write_text(json.dumps(res, indent=1))
        lines = [f"# Tuning on one and two GPUs ({res['date']})", "", f"`{res['command']}`", "",
                 "| model | 1 GPU s | 2 GPUs s | ratio | nodes differing | killed-worker run |", "|---|---|---|---|---|---|"]
        for m in res["models"]:
            one, two, kill = m.get("one", {}), m.get("two", {}), m.get("killed", {})
            ratio = round(two["wall_s"] / one["wall_s"], 2) if one.get("wall_s") and two.get("wall_s") else None
            lines.append(f"| {Path(m['model']).name} | {one.get('wall_s')} | {two.get('wall_s')} | {ratio} | "
                         f"{len(m.get('differing', []))} | exit {kill.get('exit')}, verified {kill.get('exit') == 0} |")
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for model in args.models.split(","):
            entry = {"model": model}
            res["models"].append(entry)
            name = Path(model).stem
            for key, gpus, kill in (("one", "0", None), ("two", "0,1", None), ("killed", "0,1", args.kill_after)):
                cache = tmp / f"{name}-{key}-cache"
                cache.mkdir()
                entry[key] = optimize(model, tmp / f"{name}-{key}.onnx", gpus, cache, kill, args.timeout)
                save()
            a, b = tmp / f"{name}-one.onnx", tmp / f"{name}-two.onnx"
            if a.exists() and b.exists():
                la, lb = lowerings(a), lowerings(b)
                entry["differing"] = [{"node": k, "one_gpu": la[k], "two_gpus": lb.get(k)} for k in la if la[k] != lb.get(k)]
                save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
