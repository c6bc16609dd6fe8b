"""Optimize a model with more than 2 GB of external weights and measure time and peak memory.

Usage: PYTHONPATH=. python bench/large_model.py [--layers 32] [--dim 4096] [--workdir DIR] [--verify]

Builds ``layers`` MatMul -> Add -> Relu layers of ``dim`` x ``dim`` float32 weights (32 x 4096^2 =
2.15 GB), written straight to ``model.onnx.data`` (never whole in memory), then runs
``graphopt optimize --gpu none`` (and, with ``--verify``, ``--verify``) in a child process and reads
the child's peak RSS (``ru_maxrss``). Writes bench/results/large_model.json and .md (atomically).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))
from lowering_bench import write_atomic  # noqa: E402


def build(folder: Path, layers: int, dim: int) -> tuple[Path, int]:
    rng = np.random.default_rng(0)
    nodes, inits, offset, prev = [], [], 0, "x"
    with open(folder / "model.onnx.data", "wb") as f:
        for i in range(layers):
            for name, arr in ((f"w{i}", (rng.standard_normal((dim, dim), dtype=np.float32) / np.float32(np.sqrt(dim)))),
                              (f"b{i}", np.zeros(dim, np.float32))):
                raw = arr.astype(np.float32).tobytes()
                f.write(raw)
                t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=arr.shape, data_location=TensorProto.EXTERNAL)
                for k, v in (("location", "model.onnx.data"), ("offset", str(offset)), ("length", str(len(raw)))):
                    t.external_data.add(key=k, value=v)
                offset += len(raw)
                inits.append(t)
            nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                      helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]), helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]
            prev = f"r{i}"
    g = helper.make_graph(nodes, "large", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dim])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", dim])], inits)
    p = folder / "model.onnx"
    p.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return p, offset


# The child reports its own peak RSS (ru_maxrss of the process, all threads, onnxruntime's included) at exit.
_CHILD = """
import atexit, resource, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)))
from graphopt.cli import main
main(args=sys.argv[1:], prog_name="graphopt")
"""


def run(argv: list[str], folder: Path) -> dict:
    """Run one graphopt command in a fresh child; its wall time, exit code and peak RSS."""
    peak_file = folder / "peak.txt"
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _CHILD, str(peak_file), *argv], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    seconds = time.perf_counter() - t
    peak = int(peak_file.read_text()) if peak_file.exists() else 0
    return {"argv": argv, "rc": r.returncode, "seconds": round(seconds, 1), "peak_rss_mib": round(peak / 1024),
            "stderr": r.stderr.strip()[-400:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--verify", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        folder = Path(tmp)
        model, weight_bytes = build(folder, args.layers, args.dim)
        rows = [run(["optimize", str(model), "--gpu", "none", "-q", "-o", str(folder / "out.onnx")], folder)]
        if rows[0]["rc"] == 0:
            onnx.checker.check_model(str(folder / "out.onnx"), full_check=True)
            rows[0]["output_checked"] = True
        if args.verify:
            (folder / "out.onnx").unlink()
            (folder / "out.onnx.data").unlink()  # disk: the input and one output at a time
            rows.append(run(["optimize", str(model), "--gpu", "none", "-q", "--verify", "-o", str(folder / "out2.onnx")], folder))
    for r in rows:
        r["peak_over_weights"] = round(r["peak_rss_mib"] * 2**20 / weight_bytes, 2)
    import onnxruntime

    machine = (f"{platform.machine()} Linux, {os.cpu_count()} CPU cores (shared), "
               f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM; Python "
               f"{platform.python_version()}, onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}")
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine, "layers": args.layers, "dim": args.dim,
           "weight_bytes": weight_bytes, "runs": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    md = [f"# Optimizing a model with {weight_bytes / 1e9:.2f} GB of external weights ({doc['date']})", "",
          f"`PYTHONPATH=. python bench/large_model.py --layers {args.layers} --dim {args.dim}"
          + (" --verify" if args.verify else "") + f"` on {doc['machine']}.", "",
          "Peak RSS is the graphopt process's own `ru_maxrss` (all threads, onnxruntime's included). The weights "
          "stay in their files while graphopt works and are streamed into the output's data file; `--verify` "
          "writes both models to a temporary folder and runs them under onnxruntime one after the other.", "",
          "| command | exit | seconds | peak RSS | peak / weights |", "|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| `graphopt {' '.join(a if '/' not in a else Path(a).name for a in r['argv'])}` | {r['rc']} | "
                  f"{r['seconds']} | {r['peak_rss_mib']} MiB | {r['peak_over_weights']}x |")
    for name, text in (("large_model.json", json.dumps(doc, indent=1) + "\n"), ("large_model.md", "\n".join(md) + "\n")):
        write_atomic(RESULTS / name, text)
    print("\n".join(md))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
