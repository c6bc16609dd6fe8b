"""What one NCHW <-> NHWC activation conversion costs on the device, against the estimate the tuner
counts (``graphopt.tune.layout_choice.conversion_ms``: bytes read + written at ``COPY_GBPS`` plus
``CONVERSION_LAUNCH_MS``).

    python3 bench/layout_conversion.py --out OUT [--max-seconds 120]

For MobileNetV2 / ResNet-50 activation shapes at bs1 and bs32 in fp16 (and one in fp32), each
direction is timed as the runtime does it (a copy into a buffer of the other layout's strides,
``graphopt.lowering.layout``): eagerly with CUDA events (median of batches of 20) and replayed from a
CUDA graph of 20 conversions (no launch cost from Python). Writes OUT/layout_conversion_<gpu>.json
and .md after every shape; stops adding shapes after --max-seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphopt.lowering import layout  # noqa: E402
from graphopt.tune.layout_choice import CONVERSION_LAUNCH_MS, COPY_GBPS, conversion_ms  # noqa: E402

SHAPES = [  # (name, shape, dtype)
    ("mbv2.expand112", (1, 96, 112, 112), "float16"), ("mbv2.expand112", (32, 96, 112, 112), "float16"),
    ("mbv2.block56", (1, 144, 56, 56), "float16"), ("mbv2.block56", (32, 144, 56, 56), "float16"),
    ("mbv2.block14", (1, 384, 14, 14), "float16"), ("mbv2.block14", (32, 384, 14, 14), "float16"),
    ("r50.l1", (1, 256, 56, 56), "float16"), ("r50.l1", (32, 256, 56, 56), "float16"),
    ("r50.l4", (32, 2048, 7, 7), "float16"), ("r50.l1.fp32", (32, 256, 56, 56), "float32"),
]
REPS = 20


def _time_eager(cupy, fn, batches: int = 15) -> float:
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    fn()
    out = []
    for _ in range(batches):
        start.record()
        for _ in range(REPS):
            fn()
        stop.record()
        stop.synchronize()
        out.append(cupy.cuda.get_elapsed_time(start, stop) / REPS)
    return statistics.median(out)


def _time_graph(cupy, fn, batches: int = 15) -> float | None:
    stream = cupy.cuda.Stream(non_blocking=True)
    try:
        with stream:
            stream.begin_capture()
            try:
                for _ in range(REPS):
                    fn()
            finally:
                graph = stream.end_capture()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        graph.launch(stream)
        out = []
        for _ in range(batches):
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            out.append(cupy.cuda.get_elapsed_time(start, stop) / REPS)
        return statistics.median(out)
    except Exception as exc:  # noqa: BLE001 - report, keep the eager number
        print(f"capture failed: {exc}", file=sys.stderr)
        return None


def _write(out: Path, gpu: str, rows: list[dict], meta: dict) -> None:
    (out / f"layout_conversion_{gpu}.json").write_text(json.dumps({**meta, "rows": rows}, indent=2))
    lines = [f"# Layout conversion on {meta['device']} ({meta['date']})", "",
             f"Estimate: 2 x bytes / {COPY_GBPS:g} GB/s + {CONVERSION_LAUNCH_MS * 1e3:g} us.", "",
             "| tensor | shape | dtype | direction | eager us | graph us | estimate us |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        g = "-" if r["graph_us"] is None else f"{r['graph_us']:.2f}"
        lines.append(f"| {r['name']} | {'x'.join(map(str, r['shape']))} | {r['dtype']} | {r['direction']} | "
                     f"{r['eager_us']:.2f} | {g} | {r['estimate_us']:.2f} |")
    (out / f"layout_conversion_{gpu}.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--max-seconds", type=float, default=120.0)
    args = ap.parse_args()
    import cupy

    args.out.mkdir(parents=True, exist_ok=True)
    dev = cupy.cuda.Device()
    raw = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
    name = raw.decode() if isinstance(raw, bytes) else str(raw)
    gpu = "".join(ch for ch in name.lower().split()[-1] if ch.isalnum()) or "gpu"
    meta = {"device": name, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "cupy": cupy.__version__, "copy_gbps": COPY_GBPS, "launch_ms": CONVERSION_LAUNCH_MS,
            "command": " ".join(sys.argv)}
    rows: list[dict] = []
    t0 = time.monotonic()
    for label, shape, dtype in SHAPES:
        if time.monotonic() - t0 > args.max_seconds:
            print(f"stopping after {args.max_seconds:g} s", file=sys.stderr)
            break
        x = cupy.random.standard_normal(shape, dtype=cupy.float32).astype(dtype)
        for direction, src_layout, dst_layout in (("NCHW->NHWC", "NCHW", "NHWC"), ("NHWC->NCHW", "NHWC", "NCHW")):
            src = layout.to_layout(x, src_layout, cupy)
            dst = layout.empty(shape, dtype, dst_layout, cupy)
            fn = lambda src=src, dst=dst: cupy.copyto(dst, src)  # noqa: E731
            fn()
            assert bool(cupy.array_equal(dst, x)) and layout.is_layout(dst, dst_layout)
            rows.append({"name": label, "shape": list(shape), "dtype": dtype, "direction": direction,
                         "eager_us": _time_eager(cupy, fn) * 1e3, "graph_us": (lambda v: None if v is None else v * 1e3)(
                             _time_graph(cupy, fn)),
                         "estimate_us": conversion_ms(shape, x.dtype.itemsize) * 1e3})
            _write(args.out, gpu, rows, meta)
        del x
    print(f"wrote {args.out}/layout_conversion_{gpu}.json ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
