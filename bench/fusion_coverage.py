"""Fusion coverage over the exports of ``models/export_llm_family.py`` (issue 18): per model and
pattern, how many instances became a graphopt op and how many were left unfused.

For every ``models/coverage/*.onnx`` this optimizes the file (``gpu="none"``), counts per pattern
the fused nodes and the tell-tale ops left behind, and compares onnxruntime CPU outputs of the
optimized and the original model on random inputs (token ids in [0, 100), images ~ N(0, 1)).

    python bench/fusion_coverage.py        # writes bench/results/fusion_coverage.{json,md}

tests/models/test_coverage_models.py imports ``coverage_counts`` / ``make_feeds`` from this file.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graphopt.ir import from_model  # noqa: E402
from graphopt.rewrite.causal import causal_mask  # noqa: E402
from fusion_counts import max_rel_err as _counts_max_rel_err  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models" / "coverage"
GELU_ACTS = ("Gelu", "GeluTanh", "QuickGelu")
ACT_OPS = ("Relu", "HardSigmoid", "HardSwish", "Sigmoid", "Clip", "LeakyRelu", "Gelu", "Erf", "Tanh")
PRODUCERS = ("Conv", "BatchNormalization", "Gemm", "MatMul")
# pattern -> (what counts as fused, what counts as left)
PATTERNS = {
    "gated MLP": ("GatedMLP", "Mul of an activated projection and a projection"),
    "RMSNorm / LayerNorm / GroupNorm": ("RMSNorm, LayerNorm, GroupNorm",
                                        "LayerNormalization, InstanceNormalization, a ReduceMean of a square or read by a Sub"),
    "GELU (incl. QuickGELU)": ("Gelu, or a CBR/GemmAct Gelu/GeluTanh/QuickGelu epilogue", "Erf, Tanh, Gelu"),
    "attention": ("Attention", "Softmax"),
    "conv/BN/GN/gemm + activation": ("CBR/GemmAct/GroupNorm with an activation", "an activation op right after Conv/BN/Gemm/MatMul, a BatchNormalization"),
    "Shape/Size": ("(folded)", "Shape, Size"),
    "RoPE": ("RoPE", "Neg (of a rotate_half / rotate_every_two)"),
    "grouped K/V": ("an Attention's K or V read with kv_groups > 1", "an Expand (repeat_kv's) feeding an Attention's K or V"),
    "residual Add into norm": ("a LayerNorm / RMSNorm with a skip input", "an Add read by a LayerNorm / RMSNorm"),
    "head split into RoPE": ("a RoPE with x_bshd=1", "a Transpose feeding a RoPE"),
    "causal mask": ("an Attention with causal=1 and no mask",
                    "an Attention whose constant mask is exactly the causal mask (rewrite/causal.py's test)"),
}


def files() -> list[str]:
    return sorted(p.name for p in MODELS.glob("*.onnx"))


def _attr(node: onnx.NodeProto, name: str):
    for a in node.attribute:
        if a.name == name:
            v = onnx.helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return None


def _causal_but_masked(graph, node: onnx.NodeProto) -> bool:
    """The Attention reads a mask that ``attention_causal_mask`` would have turned into causal=1."""
    if len(node.input) < 4 or not node.input[3]:
        return False
    return causal_mask(graph, node.input[3], graph.node(node.name)) is None


def coverage_counts(model: onnx.ModelProto) -> dict[str, list[int]]:
    """pattern -> [fused, left] over the main graph."""
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output}
    consumers = collections.defaultdict(list)
    for n in nodes:
        for t in n.input:
            consumers[t].append(n.op_type)
    # the tensors an Expand feeds into an Attention's K or V, directly or through one Reshape (repeat_kv)
    kv_in = {t for n in nodes if n.domain == "graphopt" and n.op_type == "Attention" for t in n.input[1:3] if t}
    kv_in |= {producer[t].input[0] for t in list(kv_in) if t in producer and producer[t].op_type == "Reshape"}
    consumers_of = collections.defaultdict(bool, {t: True for t in kv_in})
    c = {p: [0, 0] for p in PATTERNS}
    graph = from_model(model)

    def prod(t):
        n = producer.get(t)
        return None if n is None else (n.op_type if n.domain != "graphopt" else f"graphopt.{n.op_type}")

    for n in nodes:
        act = _attr(n, "activation") if n.domain == "graphopt" else None
        if n.domain == "graphopt":
            if n.op_type == "GatedMLP":
                c["gated MLP"][0] += 1
            elif n.op_type in ("RMSNorm", "LayerNorm", "GroupNorm"):
                c["RMSNorm / LayerNorm / GroupNorm"][0] += 1
            elif n.op_type == "Attention":
                c["attention"][0] += 1
                if (_attr(n, "kv_groups") or 1) > 1:
                    c["grouped K/V"][0] += 2
            elif n.op_type == "RoPE":
                c["RoPE"][0] += 1
                if _attr(n, "x_bshd"):
                    c["head split into RoPE"][0] += 1
                elif prod(n.input[0]) == "Transpose":
                    c["head split into RoPE"][1] += 1
            if n.op_type in ("RMSNorm", "LayerNorm"):
                skip_at = 2 if n.op_type == "RMSNorm" else 3
                if len(n.input) > skip_at and n.input[skip_at]:
                    c["residual Add into norm"][0] += 1
                elif prod(n.input[0]) == "Add":
                    c["residual Add into norm"][1] += 1
            if n.op_type == "Attention":
                if _attr(n, "causal") and (len(n.input) < 4 or not n.input[3]):
                    c["causal mask"][0] += 1
                elif _causal_but_masked(graph, n):
                    c["causal mask"][1] += 1
            if n.op_type == "Gelu" or act in GELU_ACTS:
                c["GELU (incl. QuickGELU)"][0] += 1
            elif n.op_type in ("CBR", "GemmAct", "GroupNorm") and act not in (None, "none"):
                c["conv/BN/GN/gemm + activation"][0] += 1
            continue
        op = n.op_type
        if op in ("LayerNormalization", "InstanceNormalization") or op == "ReduceMean" and (
                prod(n.input[0]) in ("Pow", "Mul") or "Sub" in consumers[n.output[0]]):  # not a global pool
            c["RMSNorm / LayerNorm / GroupNorm"][1] += 1
        elif op in ("Erf", "Tanh", "Gelu"):
            c["GELU (incl. QuickGELU)"][1] += 1
        elif op == "Softmax":
            c["attention"][1] += 1
        elif op in ("Shape", "Size"):
            c["Shape/Size"][1] += 1
        elif op == "Neg":
            c["RoPE"][1] += 1
        elif op == "BatchNormalization":
            c["conv/BN/GN/gemm + activation"][1] += 1
        elif op == "Expand" and any(consumers_of[t] for t in n.output):
            c["grouped K/V"][1] += 1
        if op in ACT_OPS and n.input and prod(n.input[0]) in PRODUCERS:
            c["conv/BN/GN/gemm + activation"][1] += 1
        if op == "Mul" and len(n.input) == 2:
            kinds = {prod(t) for t in n.input}
            if kinds & {"MatMul", "graphopt.GemmAct"} and kinds & {"Mul", "Sigmoid", "graphopt.GemmAct", "graphopt.Gelu"} \
                    and all(k is not None for k in kinds) and "graphopt.GatedMLP" not in kinds:
                c["gated MLP"][1] += 1
    return c


def make_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.integer):
            feeds[vi.name] = rng.integers(0, 100, size=shape).astype(dtype)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def max_rel_err(original: onnx.ModelProto, optimized: onnx.ModelProto, seed: int = 0) -> float:
    """fusion_counts.max_rel_err on this file's feeds."""
    return _counts_max_rel_err(original, optimized, feeds=make_feeds(original, seed))


def measure(file: str) -> dict:
    import graphopt

    original = onnx.load(str(MODELS / file))
    optimized, report = graphopt.optimize(original, gpu="none")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(original.graph.output[0].type.tensor_type.elem_type).name
    return {"model": file, "dtype": dtype, "nodes_before": report.nodes_before, "nodes_after": len(optimized.graph.node),
            "custom_ops": report.custom_ops, "coverage": coverage_counts(optimized),
            "max_rel_err": max_rel_err(original, optimized)}


def markdown(rows: list[dict]) -> str:
    pats = list(PATTERNS)
    lines = ["# Fusion coverage on the issue-18 exports", "",
             "Generated by `python bench/fusion_coverage.py` from `models/coverage/*.onnx` (written by "
             "`models/export_llm_family.py`: tiny configs, random weights, TorchScript at opset 17 and dynamo at "
             "its default opset 20). Each cell is **fused / left**; `-` means the model has none of that pattern.",
             "", "| model | dtype | nodes | " + " | ".join(pats) + " | max rel err |",
             "|---|---|---|" + "---:|" * len(pats) + "---:|"]
    for r in rows:
        cells = []
        for p in pats:
            fused, left = r["coverage"][p]
            cells.append("-" if fused == left == 0 else f"{fused} / {left}")
        lines.append(f"| {r['model']} | {r['dtype']} | {r['nodes_before']} → {r['nodes_after']} | " + " | ".join(cells)
                     + f" | {r['max_rel_err']:.1e} |")
    lines += ["", "What each column counts:", ""]
    lines += [f"- **{p}**: fused = {f}; left = {l}." for p, (f, l) in PATTERNS.items()]
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for fusion_coverage.{json,md}")
    args = ap.parse_args(argv)
    rows = [measure(f) for f in files()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from graphopt.files import atomic_write

    for name, text in (("fusion_coverage.json", json.dumps(rows, indent=1, sort_keys=True) + "\n"),
                       ("fusion_coverage.md", markdown(rows))):
        atomic_write(out / name, [text.encode()])
    print(f"wrote {out / 'fusion_coverage.md'}; {len(rows)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
