"""Transformer fusion counts on the committed torch exports (GPT-2, BERT, ViT; both exporters).

For every ``models/torch/{gpt2,bert,vit}*.onnx`` this optimizes the file (``gpu="none"``: no
lowering is profiled), counts the fused LayerNorm (and how many fold the residual as
SkipLayerNorm), Attention and GELU nodes (a ``graphopt.Gelu`` or a GemmAct/CBR whose epilogue is
Gelu/GeluTanh), lists the unfused ops that would mean a missed block (Softmax, Erf, ReduceMean,
LayerNormalization, Tanh outside BERT's pooler), and compares onnxruntime CPU outputs of the
optimized and the original model on inputs with a right-padded attention mask. The expected counts
come from the configs in ``models/torch/manifest.json``: per layer one attention block, one GELU and
two LayerNorms, plus the final (GPT-2 ``ln_f``, ViT ``layernorm``) or embedding (BERT) LayerNorm.

    python bench/fusion_counts.py            # writes bench/results/transformer_fusions.{json,md}

tests/models/test_transformer_fusions.py imports ``expected_counts`` / ``fused_counts`` /
``make_feeds`` from this file, so the committed table and the tests count the same way.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
TORCH = ROOT / "models" / "torch"
FAMILIES = ("gpt2", "bert", "vit")
GELU_ACTS = ("Gelu", "GeluTanh")
UNFUSED = ("Softmax", "Erf", "Tanh", "ReduceMean", "LayerNormalization")
BATCH, SEQ, PAD = 2, 11, 3  # batch item 1 has its last PAD positions padded (right padding)


def manifest() -> dict:
    return json.loads((TORCH / "manifest.json").read_text())["files"]


def transformer_files() -> list[str]:
    return sorted(f for f in manifest() if f.startswith(FAMILIES))


def family(file: str) -> str:
    return next(f for f in FAMILIES if file.startswith(f))


def exporter_opset(file: str) -> tuple[str, int]:
    m = re.search(r"_(torchscript|dynamo)_op(\d+)\.onnx$", file)
    return m.group(1), int(m.group(2))


def layers(file: str) -> int:
    """The layer count from the manifest note; "as gpt2, ..." notes refer to the base export's config."""
    files = manifest()
    note = files[file]["note"]
    if note.startswith("as "):
        base = note[3:].split(",")[0].strip()
        note = next(v["note"] for k, v in sorted(files.items())
                    if re.match(rf"{re.escape(base)}_(torchscript|dynamo)_op\d+\.onnx$", k))
    m = re.search(r"n_layer=(\d+)", note) or re.search(r"(\d+) layers", note)
    if m is None:
        raise ValueError(f"{file}: no layer count in the manifest note {note!r}")
    return int(m.group(1))


def expected_counts(file: str) -> dict[str, int]:
    n = layers(file)
    return {"LayerNorm": 2 * n + 1, "Attention": n, "GELU": n}


def _attr(node: onnx.NodeProto, name: str):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return None


def fused_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Fused-node counts (graphopt domain) and the unfused ops left, over the main graph."""
    c: collections.Counter = collections.Counter()
    for node in model.graph.node:
        if node.domain == "graphopt":
            c[node.op_type] += 1
            act = _attr(node, "activation")
            act = act.decode() if isinstance(act, bytes) else act
            if node.op_type == "Gelu" or act in GELU_ACTS:
                c["GELU"] += 1
            if node.op_type == "LayerNorm" and len(node.input) > 3 and node.input[3]:
                c["SkipLayerNorm"] += 1
                if _attr(node, "sum_output"):
                    c["SkipLayerNorm with sum output"] += 1
        elif node.op_type in UNFUSED:
            c[f"unfused {node.op_type}"] += 1
    return dict(sorted(c.items()))


def make_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """input_ids in [0, 256), token types in {0, 1}, a right-padded attention mask, pixels ~ N(0, 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (BATCH if i == 0 else SEQ) for i, d in enumerate(tt.shape.dim)]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if "mask" in vi.name:
            mask = np.ones(shape, dtype=dtype)
            mask[1, -PAD:] = 0
            feeds[vi.name] = mask
        elif "token_type" in vi.name:
            feeds[vi.name] = rng.integers(0, 2, size=shape).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            feeds[vi.name] = rng.integers(0, 256, size=shape).astype(dtype)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def max_rel_err(original: onnx.ModelProto, optimized: onnx.ModelProto, seed: int = 0, feeds: dict | None = None) -> float:
    """max |optimized - original| / max |original| over every output, onnxruntime CPU, on ``feeds``
    (default: ``make_feeds(original, seed)``)."""
    import onnxruntime as ort

    feeds = make_feeds(original, seed) if feeds is None else feeds
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    runs = [ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
            for m in (original, optimized)]
    worst = 0.0
    for a, b in zip(*runs):
        assert a.shape == b.shape
        worst = max(worst, float(np.max(np.abs(b.astype(np.float64) - a)) / max(float(np.max(np.abs(a))), 1e-30)))
    return worst


def measure(file: str) -> dict:
    import graphopt

    original = onnx.load(str(TORCH / file))
    optimized, report = graphopt.optimize(original, gpu="none")
    exporter, opset = exporter_opset(file)
    return {"model": file, "family": family(file), "exporter": exporter, "opset": opset, "layers": layers(file),
            "expected": expected_counts(file), "counts": fused_counts(optimized), "rewrites": report.rewrites,
            "max_rel_err": max_rel_err(original, optimized)}


def markdown(rows: list[dict]) -> str:
    lines = ["# Transformer fusions on the committed torch exports", "",
             "Generated by `python bench/fusion_counts.py` (CPU only: onnxruntime compares the optimized file "
             f"with the original on batch {BATCH}, sequence {SEQ}, the second row right-padded by {PAD}).", "",
             "| model | exporter | opset | layers | LayerNorm (exp.) | of which Skip (with sum) | Attention (exp.) "
             "| GELU (exp.) | unfused left | max rel err |", "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        c, e = r["counts"], r["expected"]
        left = ", ".join(f"{k[8:]} {v}" for k, v in c.items() if k.startswith("unfused ")) or "none"
        lines.append(f"| {r['model']} | {r['exporter']} | {r['opset']} | {r['layers']} | "
                     f"{c.get('LayerNorm', 0)} ({e['LayerNorm']}) | {c.get('SkipLayerNorm', 0)} "
                     f"({c.get('SkipLayerNorm with sum output', 0)}) | {c.get('Attention', 0)} ({e['Attention']}) | "
                     f"{c.get('GELU', 0)} ({e['GELU']}) | {left} | {r['max_rel_err']:.1e} |")
    lines += ["", "GELU counts standalone `graphopt.Gelu` nodes and GemmAct epilogues with Gelu/GeluTanh. "
              "The one Tanh left in BERT is its pooler's activation, not a GELU.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for transformer_fusions.{json,md}")
    args = ap.parse_args(argv)
    rows = [measure(f) for f in transformer_files()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from graphopt.files import atomic_write

    for name, text in (("transformer_fusions.json", json.dumps(rows, indent=1, sort_keys=True) + "\n"),
                       ("transformer_fusions.md", markdown(rows))):
        atomic_write(out / name, [text.encode()])
    bad = [r["model"] for r in rows if any(r["counts"].get(k, 0) != v for k, v in r["expected"].items())]
    print(f"wrote {out / 'transformer_fusions.md'}; {len(rows)} models" + (f"; counts differ: {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
