"""A cold run (every signature profiled) and a warm run (every node served from the tuning cache)
of ``optimize_file`` write byte-identical models: the file records the choices, not the cache's state.

The GPU is faked at the edges the real run goes through (``detect_devices``, the kernels' backend,
the isolated runner), with timings derived from the signature and candidate keys, so the cold run
chooses exactly what the cache then serves; everything between (selection, layouts, metadata,
writing) is the real code."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import graphopt.tune.profiler as profiler_mod
import graphopt.tune.tuner as tuner_mod
from graphopt.pipeline import optimize_file
from graphopt.tune.gpus import DeviceInfo

MODELS = Path(__file__).resolve().parents[2] / "models"
H200 = DeviceInfo(0, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0", 140 << 30, 50 << 20, 132)


class KeyedRunner:
    """Stands in for the isolated worker: every candidate passes, in a time fixed by its keys."""

    workers_started = 0
    broken = None

    def __init__(self, *args, **kwargs):
        pass

    def run(self, sig, cand):
        h = int(hashlib.sha256((sig.key() + cand.key()).encode()).hexdigest()[:8], 16)
        ms = 0.01 + (h % 1000) / 1e4
        return {"status": "ok", "samples": [ms * (1 + i / 1000) for i in range(5)], "reason": "", "phases": {}}

    def close(self):
        pass


@pytest.fixture
def fake_h200(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tuner_mod, "detect_devices", lambda: [H200])
    monkeypatch.setattr(tuner_mod, "kernels_backend",
                        lambda: (tuner_mod.TuningBackend(tuner_mod.kernel_candidates(), None, None, None, None), ""))
    monkeypatch.setattr(profiler_mod, "IsolatedRunner", KeyedRunner)


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
