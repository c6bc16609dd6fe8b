"""End to end on the GPU: optimizing the committed GPT-2 / BERT exports for the device present
profiles the fused LayerNorm and Attention nodes with the real kernels (compiled, checked against
the reference, timed), and the optimized file still matches the original under onnxruntime.

Marker ``gpu``; skips without a device. A private tuning cache (tmp dir) keeps the run honest.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

import graphopt  # noqa: E402
from graphopt.tune.results import OK  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FILES = ["gpt2_torchscript_op14.onnx", "bert_torchscript_op17.onnx"]


@pytest.mark.gpu
@pytest.mark.parametrize("file", FILES)
def test_norm_and_attention_nodes_are_profiled(file, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHOPT_CACHE_DIR", str(tmp_path / "cache"))
    original = onnx.load(str(ROOT / "models" / "torch" / file))
    shapes = {v.name: [2, 11] for v in original.graph.input}
    optimized, report = graphopt.optimize(original, gpu="auto", shapes=shapes, verify=True)
    rows = [r for r in report.lowerings if r["op"] in ("LayerNorm", "Attention")]
    assert rows, report.lowerings
    names = {"LayerNorm": {"rows"}, "Attention": {"cublas_softmax", "flash", "flash_mma"}}
    for r in rows:
        assert r["mode"] in ("profiled", "cached"), (r["node"], r["mode"], r["reason"])
        assert r["lowering"] in names[r["op"]], r
        # every candidate that applies (pruned = refused by its own applies(), e.g. vec=8 on fp32)
        # builds, passes the reference check and times
        failed = [(t["candidate"], t["status"], t["reason"]) for t in r["timings"] if t["status"] not in (OK, "pruned")]
        assert any(t["status"] == OK for t in r["timings"]) and not failed, (r["node"], failed)
