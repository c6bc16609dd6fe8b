"""GPT-2, BERT and ViT exported by both torch exporters (opsets 13-18): after optimize every LayerNorm,
GELU and attention block is a graphopt op, the counts equal what the configs in
models/torch/manifest.json imply, and onnxruntime CPU outputs match the original within 1e-4
relative (fp32) on fresh random inputs with a right-padded attention mask.

The counting is bench/fusion_counts.py's (loaded from the file), so the committed results table
and this test cannot disagree on what a fused block is."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import graphopt
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SLOW_BYTES = 5 * 1024 * 1024


def _bench():
    return load_script("bench/fusion_counts.py")


FC = _bench()
FILES = [pytest.param(f, id=f, marks=[pytest.mark.slow] if (FC.TORCH / f).stat().st_size > SLOW_BYTES else [])
         for f in FC.transformer_files()]


def test_every_family_and_exporter_is_covered():
    files = FC.transformer_files()
    for fam in FC.FAMILIES:
        kinds = {FC.exporter_opset(f) for f in files if FC.family(f) == fam}
        assert {e for e, _ in kinds} == {"torchscript", "dynamo"}, fam
        assert {o for _, o in kinds} >= {13, 14, 17, 18}, fam


@pytest.mark.parametrize("file", FILES)
def test_transformer_blocks_are_fused_and_outputs_match(file):
    original = onnx.load(str(FC.TORCH / file))
    optimized, report = graphopt.optimize(original, gpu="none")
    onnx.checker.check_model(optimized, full_check=True)
    counts = FC.fused_counts(optimized)
    for op, n in FC.expected_counts(file).items():
        assert counts.get(op, 0) == n, (file, op, counts, report.rewrites)
    left = {k: v for k, v in counts.items() if k.startswith("unfused ")}
    assert left == ({"unfused Tanh": 1} if FC.family(file) == "bert" else {}), left  # BERT's pooler Tanh
    # the residual stream: every LayerNorm but the first folds its residual Add
    assert counts.get("SkipLayerNorm", 0) >= FC.expected_counts(file)["LayerNorm"] - 1
    for seed in (0, 1):
        err = FC.max_rel_err(original, optimized, seed)
        assert err <= 1e-4, f"{file}: max relative error {err:.2e}"


def test_counts_are_deterministic_and_the_table_is_current():
    """The committed table was made by the current rules (rerun bench/fusion_counts.py if this fails)."""
    import json

    committed = {r["model"]: r for r in json.loads((ROOT / "bench/results/transformer_fusions.json").read_text())}
    assert sorted(committed) == FC.transformer_files()
    for file in ("gpt2_torchscript_op14.onnx", "bert_dynamo_op18.onnx", "viteager_torchscript_op13.onnx"):
        row = FC.measure(file)
        assert row["counts"] == committed[file]["counts"] and row["rewrites"] == committed[file]["rewrites"]


@pytest.mark.parametrize("file", ["gpt2_torchscript_op14.onnx", "bert_torchscript_op17.onnx", "vit_torchscript_op14.onnx"])
def test_fused_norm_and_attention_nodes_have_gpu_lowerings(file):
    """With concrete input shapes, every LayerNorm and Attention node the rules make is a signature
    some GPU candidate accepts (SkipLayerNorm's skip may be a broadcast [1, S, D] embedding)."""
    from graphopt.ir import from_model
    from graphopt.kernels.registry import candidates_for
    from graphopt.tune.select import bind_dims, infer_missing_shapes, node_signature

    optimized, _ = graphopt.optimize(onnx.load(str(FC.TORCH / file)), gpu="none")
    g = from_model(optimized)
    nodes = [(sg, n) for sg, n in g.walk() if n.op_type in ("LayerNorm", "Attention")]
    infer_missing_shapes(g, nodes)
    shapes = {v.name: ([2, 3, 32, 32] if v.name == "pixel_values" else [2, 11]) for v in optimized.graph.input}
    dims = bind_dims(g, shapes)
    assert len(nodes) == sum(FC.expected_counts(file)[op] for op in ("LayerNorm", "Attention"))
    for sg, n in nodes:
        sig, _ = node_signature(sg, n, dims, shapes)
        reasons = [c.applies(sig, (9, 0)) for c in candidates_for(sig)]
        assert None in reasons, (n.name, sig.key(), reasons[:2])
