"""Latency measurement for ``graphopt bench`` and bench/e2e.py: feeds at a batch size, timed runs,
median / p90 / throughput, the per-op breakdown and the host overhead per node.

Timing is ``time.perf_counter`` around one run plus a device synchronisation (on cuda), after
warm-up runs (the first run traces the plan, the second captures the CUDA graph); a time budget
caps the repeats so a slow backend (numpy, ORT CPU on a big batch) cannot stall a benchmark.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from graphopt.errors import UsageError
from graphopt.files import atomic_write
from graphopt.runtime import host_time

DEFAULT_DIM = 16  # symbolic non-batch dims (sequence lengths) without a --shape


def bench_feeds(model: onnx.ModelProto, batch: int | None, shapes: Mapping[str, Sequence[int]] | None = None,
                seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds: ``shapes`` per input, else the declared dims with the first (batch) dim set to
    ``batch`` when it is symbolic and other symbolic dims ``DEFAULT_DIM``."""
    from graphopt.compare import check_shape_overrides, make_inputs

    check_shape_overrides(model, shapes)
    shapes = dict(shapes or {})
    full: dict[str, list[int]] = {}
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits or vi.name in shapes:
            continue
        dims = []
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            fixed = d.dim_value if d.HasField("dim_value") else None
            if i == 0 and batch is not None:
                if fixed is not None and fixed != batch:
                    raise UsageError(f"--batch {batch}: input {vi.name!r} has a fixed batch dimension {fixed}; "
                                     "leave --batch out, or export the model with a dynamic batch dimension")
                dims.append(batch)
            else:
                dims.append(fixed if fixed is not None else DEFAULT_DIM)
        full[vi.name] = dims
    full.update({k: list(v) for k, v in shapes.items()})
    return make_inputs(model, full, seed=seed)


@dataclass
class Timing:
    label: str
    batch: int
    times_s: list[float] = field(default_factory=list)
    error: str | None = None
    note: str = ""

    @property
    def median_ms(self) -> float | None:
        return float(np.median(self.times_s) * 1e3) if self.times_s else None

    @property
    def p90_ms(self) -> float | None:
        return float(np.percentile(self.times_s, 90) * 1e3) if self.times_s else None

    @property
    def throughput(self) -> float | None:
        m = self.median_ms
        return self.batch / (m / 1e3) if m else None

    def to_dict(self) -> dict:
        return {"label": self.label, "batch": self.batch, "median_ms": self.median_ms, "p90_ms": self.p90_ms,
                "throughput_per_s": self.throughput, "runs": len(self.times_s), "error": self.error, "note": self.note}


def time_runs(label: str, batch: int, fn: Callable[[], Any], sync: Callable[[], None] = lambda: None, *,
              warmup: int = 3, repeats: int = 20, budget_s: float = 20.0) -> Timing:
    """Time ``fn`` (then ``sync``) ``repeats`` times after ``warmup`` runs, within ``budget_s`` seconds
    (at least one timed run); an exception is recorded as the row's error, never raised."""
    t = Timing(label, batch)
    try:
        start = time.perf_counter()
        for _ in range(warmup):
            fn()
            sync()
            if time.perf_counter() - start > budget_s / 2:
                break
        start = time.perf_counter()
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            fn()
            sync()
            t.times_s.append(time.perf_counter() - t0)
            if time.perf_counter() - start > budget_s:
                t.note = f"stopped after {len(t.times_s)} runs (time budget {budget_s:g} s)"
                break
    except Exception as e:  # noqa: BLE001 - a measurement that fails is reported in its row
        t.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        t.times_s = []
    return t


def time_session(label: str, sess, feeds: Mapping[str, Any], batch: int, **kw) -> Timing:
    """Time ``sess.run(feeds)`` with feeds moved to the session's device once, outside the timing."""
    dev_feeds = dict(feeds)
    if getattr(sess, "device", None) == "cuda":
        import cupy

        dev_feeds = {k: cupy.asarray(v) for k, v in feeds.items()}
    t = time_runs(label, batch, lambda: sess.run(dev_feeds), sess.synchronize, **kw)
    if getattr(sess, "device", None) == "cuda" and not t.error:
        barriers = (sess.plan_summary() or {}).get("barriers") or {}
        said = ", ".join(f"{n} {what}" for what, n in barriers.items()) if any(barriers.values()) else ""
        t.note = "; ".join(x for x in (t.note, f"CUDA graphs: {sess.graph_status}",
                                       said and f"stream barriers: {said}") if x)
    return t


def host_overhead_us(sess, feeds: Mapping[str, Any], repeats: int = 20) -> tuple[float, int]:
    """(microseconds of host time per executed step, steps) for eager runs: the best run's wall time
    with the GPU held busy and no synchronisation inside the timed region, divided by the plan's
    steps (``graphopt.runtime.host_time``, the one method every report uses)."""
    h = host_time.measure(sess, feeds, repeats=repeats, idle=False)
    return h.us_per_step, h.steps


def top_ops(profile: Mapping[str, float], n: int = 15, total_ms: float | None = None) -> list[tuple[str, float, float]]:
    """(op, ms, percent of the total) for the ``n`` costliest op types.

    ``profile`` is measured with a synchronisation after every step, so its sum exceeds a normal run;
    with ``total_ms`` (the measured median of the same configuration) each op's time is its share of
    that total, so the rows never add up to more than the run they break down."""
    measured = sum(profile.values()) or 1.0
    scale = 1e3 if total_ms is None else min(1e3, total_ms / measured)
    rows = sorted(profile.items(), key=lambda kv: -kv[1])[:n]
    return [(op, s * scale, 100.0 * s / measured) for op, s in rows]


def plot(path, timings: Sequence[Timing], breakdown: Sequence[tuple[str, float, float]], title: str) -> None:
    """Latency bars and the per-op breakdown, written atomically as a PNG (needs matplotlib: the
    ``plot`` extra)."""
    import io
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    ok = [t for t in timings if t.median_ms is not None]
    ax1.barh([f"{t.label} (bs {t.batch})" for t in ok], [t.median_ms for t in ok], color="tab:blue")
    ax1.set_xlabel("median latency (ms)")
    ax1.invert_yaxis()
    ax1.set_title(title)
    ax2.barh([op for op, _, _ in breakdown], [ms for _, ms, _ in breakdown], color="tab:orange")
    ax2.set_xlabel("time per run (ms)")
    ax2.invert_yaxis()
    ax2.set_title("per-op time (optimized, eager)")
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=110)
    finally:
        plt.close(fig)
    atomic_write(Path(path), [buf.getvalue()])
