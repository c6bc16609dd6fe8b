"""bench/e2e.py's report logic on fake rows (the measurements themselves need the GPU and torch):
acceptance checks use the right ratios, missing values stay unknown, the markdown has every row."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _e2e():
    spec = importlib.util.spec_from_file_location("e2e", ROOT / "bench" / "e2e.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["e2e"] = mod
    spec.loader.exec_module(mod)
    return mod


def _row(model, bs, dtype, **kw):
    base = {k: None for k in ("graphopt_ms", "graphopt_eager_ms", "graphopt_unoptimized_ms", "torch_eager_ms",
                              "torch_compile_ms", "ort_cpu_ms", "optimize_s", "compile_s", "host_us_per_node",
                              "graph_status", "max_rel_err_vs_torch", "optimize_note")}
    base.update(model=model, bs=bs, dtype=dtype, errors={})
    base.update(kw)
    return base


def test_acceptance_ratios_and_unknowns():
    e2e = _e2e()
    rows = [_row("resnet50", 1, "fp16", graphopt_ms=1.0, torch_eager_ms=4.0, host_us_per_node=9.0),
            _row("resnet50", 32, "fp16", graphopt_ms=2.0, torch_eager_ms=2.9, torch_compile_ms=1.9,
                 graphopt_unoptimized_ms=2.7, host_us_per_node=16.0)]
    checks = {c["check"]: c for c in e2e.acceptance(rows)}
    assert checks["resnet50 bs1 fp16: graphopt >= 3.0x torch eager"] == {
        "check": "resnet50 bs1 fp16: graphopt >= 3.0x torch eager", "value": 4.0, "pass": True}
    assert checks["resnet50 bs32 fp16: graphopt >= 1.5x torch eager"]["pass"] is False  # 1.45
    assert checks["resnet50 bs32 fp16: graphopt no slower than torch.compile"]["pass"] is False  # 0.95
    assert checks["resnet50 bs32 fp16: optimized >= 1.3x unoptimized (runtime)"]["value"] == 1.35
    assert checks["gpt2 bs1 fp16: graphopt >= 3.0x torch eager"]["pass"] is None  # not measured
    assert checks["host overhead per node (eager) <= 15 us"] == {
        "check": "host overhead per node (eager) <= 15 us", "value": 16.0, "pass": False}


def test_markdown_lists_every_row_with_its_errors():
    e2e = _e2e()
    rows = [_row("gpt2", 32, "fp16", graphopt_ms=3.25, errors={"torch_compile_ms": "skipped: time budget"})]
    doc = {"gpu": "NVIDIA H200", "date": "2026-12-03T12:00:00+00:00", "command": "python3 bench/e2e.py --quick",
           "elapsed_s": 300.0, "versions": {"torch": "2.11"}, "rows": rows, "acceptance": e2e.acceptance(rows)}
    md = e2e.markdown(doc)
    assert "| gpt2 | 32 | fp16 | 3.250 |" in md and "torch_compile_ms: skipped: time budget" in md
    assert "## Acceptance checks" in md and md.count("\n| ") >= 10
