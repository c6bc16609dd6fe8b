"""A cold run (every signature profiled) and a warm run (every node served from the tuning cache)
of ``optimize_file`` write byte-identical models: the file records the choices, not the cache's state.

The GPU is faked at the edges the real run goes through (``detect_devices``, the kernels' backend,
the isolated runner: ``bench/warm_cpu.install_fake_h200``), with timings derived from the signature
and candidate keys, so the cold run chooses exactly what the cache then serves; everything between
(selection, layouts, metadata, writing) is the real code."""

from __future__ import annotations

from pathlib import Path

import pytest

from _scripts import load_script
from graphopt.pipeline import optimize_file

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture
def fake_h200(monkeypatch, tmp_path):
    """The GPU faked as ``bench/warm_cpu.py`` fakes it (one fake for both), undone after the test."""
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path / "cache"))
    load_script("bench/warm_cpu.py").install_fake_h200(monkeypatch.setattr)


@pytest.mark.parametrize("model, shapes", [
    ("resnet_style.onnx", {"input": [4, 3, 32, 32]}),
    ("transformer_block.onnx", None),
])
def test_cold_and_warm_runs_write_the_same_bytes(fake_h200, tmp_path, model, shapes):
    written, modes = [], []
    for run in ("cold", "warm"):
        out = tmp_path / f"{run}.onnx"
        _, rep = optimize_file(MODELS / model, out, shapes=shapes, precision="fp16", io_fp16=True, force=True)
        written.append(out.read_bytes())
        modes.append(rep.mode)
    assert modes == ["profiled", "cached"]  # the report still says the second run was served from the cache
    assert written[0] == written[1]
