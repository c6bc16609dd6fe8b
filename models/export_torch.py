"""Export small real PyTorch models to ONNX with both torch exporters.

Needs its own venv (torch is never a test dependency)::

    python3 -m venv /work/venvs/torch
    /work/venvs/torch/bin/pip install torch==2.13.0 transformers onnx onnxscript numpy
    /work/venvs/torch/bin/python models/export_torch.py            # all models
    /work/venvs/torch/bin/python models/export_torch.py --only gpt2 --only bert

It writes ``models/torch/<name>_<exporter>_op<N>.onnx`` for each model with the
TorchScript exporter (``dynamo=False``) at opsets 13 and 17 and the dynamo exporter
(``dynamo=True``) at opset 18, all with inline weights and dynamic batch (and sequence
for text models).  Every file is checked with ``onnx.checker`` (full) and run in
onnxruntime against the eager torch output at a *different* batch/sequence size than
the one traced.  ``models/torch/manifest.json`` records each file (or the exporter's
error line), and ``models/torch/README.md`` is regenerated from it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import traceback

import numpy as np
import onnx
import onnxruntime as ort
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_modules as tm  # noqa: E402

OUT_DIR = os.path.join(HERE, "torch")
MANIFEST = os.path.join(OUT_DIR, "manifest.json")
SEED = 0
MAX_FILE_BYTES = 2 * 1024 * 1024
MAX_REL_ERR = 1e-4

# (exporter, opset) pairs each model is exported with.  The transformer models also get
# TorchScript opset 14: SDPA (their default attention) needs opset >= 14, so their
# opset-13 attempt fails and is recorded in the README.
CNN_EXPORTS = [("torchscript", 13), ("torchscript", 17), ("dynamo", 18)]
TEXT_EXPORTS = [("torchscript", 13), ("torchscript", 14), ("torchscript", 17), ("dynamo", 18)]
# The "<name>eager" variants use attn_implementation="eager" (explicit MatMul/Softmax in
# Python), which the TorchScript exporter handles at opset 13 as well.
EAGER_EXPORTS = [("torchscript", 13)]


class Spec:
    """One model to export: a factory, example inputs and the dynamic axes."""

    def __init__(self, name, factory, inputs, outputs, dynamic, check_inputs, note="",
                 exports=CNN_EXPORTS):
        self.name = name
        self.exports = exports          # [(exporter, opset)]
        self.factory = factory          # () -> nn.Module
        self.inputs = inputs            # ordered {name: example tensor} (traced sizes)
        self.outputs = outputs          # output names
        self.dynamic = dynamic          # {input name: {axis: dim name}}
        self.check_inputs = check_inputs  # {name: tensor} at other sizes, for the ORT check
        self.note = note


def _image(batch: int, size: int) -> torch.Tensor:
    return torch.randn(batch, 3, size, size)


def _tokens(batch: int, seq: int, vocab: int = 256) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), dtype=torch.int64)


def _gpt2_inputs(batch: int, seq: int) -> dict:
    mask = torch.ones(batch, seq, dtype=torch.int64)
    # One right-padded row keeps the mask path live.  Left padding would create query rows
    # with every key masked; their outputs are meaningless and differ between eager torch
    # and the dynamo export (measured: ~0.1 abs), so they are not used for the check.
    mask[-1, seq - seq // 3:] = 0
    return {"input_ids": _tokens(batch, seq), "attention_mask": mask}


def _bert_inputs(batch: int, seq: int) -> dict:
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, seq // 2:] = 0  # one padded row so the mask path is live
    return {"input_ids": _tokens(batch, seq), "attention_mask": mask,
            "token_type_ids": torch.randint(0, 2, (batch, seq), dtype=torch.int64)}


def specs() -> list[Spec]:
    """The models, built lazily so --only skips the rest."""
    torch.manual_seed(SEED)
    img_dyn = {"x": {0: "batch"}}
    txt = {0: "batch", 1: "seq"}
    return [
        Spec("resnet18", lambda: tm.resnet18(width=4), {"x": _image(2, 64)}, ["logits"],
             img_dyn, {"x": _image(3, 64)}, "torchvision ResNet-18 layout, base width 4"),
        Spec("resnet50", lambda: tm.resnet50(width=4), {"x": _image(2, 64)}, ["logits"],
             img_dyn, {"x": _image(3, 64)}, "torchvision ResNet-50 layout, base width 4"),
        Spec("mobilenetv2", lambda: tm.MobileNetV2(width_mult=0.25, last_channel=320),
             {"x": _image(2, 64)}, ["logits"], img_dyn, {"x": _image(3, 64)},
             "torchvision MobileNetV2 layout, width_mult 0.25, last_channel 320"),
        Spec("gpt2", lambda: tm.GPT2Logits(), _gpt2_inputs(2, 16), ["logits"],
             {"input_ids": txt, "attention_mask": txt}, _gpt2_inputs(3, 11),
             "GPT2LMHeadModel n_layer=2 n_embd=64 n_head=4 vocab=256 n_positions=128",
             TEXT_EXPORTS),
        Spec("gpt2eager", lambda: tm.GPT2Logits(attn="eager"), _gpt2_inputs(2, 16),
             ["logits"], {"input_ids": txt, "attention_mask": txt}, _gpt2_inputs(3, 11),
             "as gpt2, attn_implementation=eager", EAGER_EXPORTS),
        Spec("bert", lambda: tm.BertHidden(), _bert_inputs(2, 16),
             ["last_hidden_state", "pooler_output"],
             {"input_ids": txt, "attention_mask": txt, "token_type_ids": txt},
             _bert_inputs(3, 11), "BertModel hidden 32, 2 layers, 2 heads, vocab 256",
             TEXT_EXPORTS),
        Spec("berteager", lambda: tm.BertHidden(attn="eager"), _bert_inputs(2, 16),
             ["last_hidden_state", "pooler_output"],
             {"input_ids": txt, "attention_mask": txt, "token_type_ids": txt},
             _bert_inputs(3, 11), "as bert, attn_implementation=eager", EAGER_EXPORTS),
        Spec("vit", lambda: tm.ViTLogits(), {"pixel_values": _image(2, 32)}, ["logits"],
             {"pixel_values": {0: "batch"}}, {"pixel_values": _image(3, 32)},
             "ViTForImageClassification image 32, patch 8, hidden 32, 2 layers, 2 heads",
             TEXT_EXPORTS),
        Spec("viteager", lambda: tm.ViTLogits(attn="eager"), {"pixel_values": _image(2, 32)},
             ["logits"], {"pixel_values": {0: "batch"}}, {"pixel_values": _image(3, 32)},
             "as vit, attn_implementation=eager", EAGER_EXPORTS),
    ]


def build_module(spec: Spec) -> torch.nn.Module:
    torch.manual_seed(SEED)
    return spec.factory().eval()


def export_one(module, spec: Spec, exporter: str, opset: int, path: str) -> None:
    """Run one torch.onnx.export call; raises whatever the exporter raises."""
    args = tuple(spec.inputs.values())
    common = dict(input_names=list(spec.inputs), output_names=spec.outputs,
                  opset_version=opset)
    if exporter == "torchscript":
        torch.onnx.export(module, args, path, dynamo=False, dynamic_axes=spec.dynamic,
                          do_constant_folding=True, **common)
    else:
        dims: dict[str, torch.export.Dim] = {}

        def dim(name: str):
            if name not in dims:
                dims[name] = torch.export.Dim(name, min=1, max=128 if name == "seq" else 1024)
            return dims[name]

        shapes = {k: ({a: dim(n) for a, n in spec.dynamic[k].items()} if k in spec.dynamic
                      else None) for k in spec.inputs}
        torch.onnx.export(module, args, path, dynamo=True, dynamic_shapes=shapes,
                          external_data=False, optimize=True, **common)


def op_histogram(model: onnx.ModelProto) -> collections.Counter:
    """Op types of the main graph and all nested subgraphs and functions."""
    hist: collections.Counter = collections.Counter()

    def walk(graph):
        for node in graph.node:
            hist[node.op_type if node.domain in ("", "ai.onnx") else
                 f"{node.domain}.{node.op_type}"] += 1
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    for fn in model.functions:
        for node in fn.node:
            hist[node.op_type] += 1
    return hist


def describe(path: str) -> dict:
    """Size, node count, opset, op histogram and symbolic input dims of one file."""
    model = onnx.load(path)
    hist = op_histogram(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    inputs = {}
    for vi in model.graph.input:
        dims = [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
        inputs[vi.name] = dims
    return {"file": os.path.basename(path), "bytes": os.path.getsize(path),
            "nodes": len(model.graph.node), "opset": opset, "ir_version": model.ir_version,
            "producer": f"{model.producer_name} {model.producer_version}".strip(),
            "inputs": inputs, "top_ops": hist.most_common(12)}


def check_against_torch(path: str, module, spec: Spec) -> float:
    """Full onnx check, then max relative error of ORT vs eager torch at other sizes."""
    onnx.checker.check_model(onnx.load(path), full_check=True)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {k: v.numpy() for k, v in spec.check_inputs.items()}
    feeds = {i.name: feeds[i.name] for i in sess.get_inputs()}  # exporters may drop unused
    got = sess.run(None, feeds)
    with torch.no_grad():
        want = module(*spec.check_inputs.values())
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    worst = 0.0
    for g, w in zip(got, want):
        w = w.numpy()
        if g.shape != w.shape:
            raise AssertionError(f"{os.path.basename(path)}: output shape {g.shape} != torch "
                                 f"{w.shape}")
        err = float(np.max(np.abs(g - w)) / (np.max(np.abs(w)) + 1e-12))
        worst = max(worst, err)
    return worst


def last_error_line(exc: BaseException) -> str:
    lines = [ln for ln in "".join(traceback.format_exception_only(exc)).splitlines()
             if ln.strip()]
    return lines[0][:400] if lines else repr(exc)


def load_manifest() -> dict:
    if os.path.exists(MANIFEST):
        with open(MANIFEST) as f:
            return json.load(f)
    return {"files": {}, "failures": {}}


def save_manifest(manifest: dict) -> None:
    manifest["versions"] = {"torch": torch.__version__,
                            "transformers": __import__("transformers").__version__,
                            "onnx": onnx.__version__,
                            "onnxscript": __import__("onnxscript").__version__,
                            "onnxruntime": ort.__version__,
                            "python": platform.python_version()}
    with open(MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    write_readme(manifest)


def write_readme(manifest: dict) -> None:
    v = manifest["versions"]
    lines = [
        "# Real torch exports",
        "",
        "Generated by `models/export_torch.py` and `models/export_gpt2_large.py` (do not edit",
        "by hand; rerun the scripts). Random weights, eval mode, fixed seed, no downloads.",
        "",
        f"Versions: torch {v['torch']}, transformers {v['transformers']}, onnx {v['onnx']},"
        f" onnxscript {v['onnxscript']}, onnxruntime {v['onnxruntime']}, Python {v['python']}.",
        "",
        "Commands:",
        "",
        "```",
        "python3 -m venv /work/venvs/torch",
        "/work/venvs/torch/bin/pip install torch==2.13.0 transformers onnx onnxscript numpy",
        "/work/venvs/torch/bin/python models/export_torch.py",
        "/work/venvs/torch/bin/python models/export_gpt2_large.py",
        "```",
        "",
        "Exporters: `torchscript` = `torch.onnx.export(..., dynamo=False, dynamic_axes=...)`,",
        "`dynamo` = `torch.onnx.export(..., dynamo=True, dynamic_shapes=..., "
        "external_data=False, optimize=True)`.",
        "The transformers models use their default attention implementation (SDPA), which is",
        "what users get from `torch.onnx.export` today; the `*eager` files use",
        "`attn_implementation=\"eager\"` (the classic MatMul/scale/mask-Add/Softmax/MatMul",
        "form), which also exports at opset 13.",
        "`max rel err` is max|ORT - torch| / max|torch| at a batch/sequence size different",
        "from the traced one (batch 3, sequence 11), so it also checks the dynamic axes.",
        "",
        "| file | model | KiB | nodes | opset | max rel err | top ops |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for fname in sorted(manifest["files"]):
        r = manifest["files"][fname]
        top = ", ".join(f"{op} {n}" for op, n in r["top_ops"][:6])
        err = r.get("max_rel_err")
        err_s = f"{err:.1e}" if isinstance(err, float) else "-"
        lines.append(f"| {fname} | {r.get('note', '')} | {r['bytes'] / 1024:.0f} | "
                     f"{r['nodes']} | {r['opset']} | {err_s} | {top} |")
    lines += [
        "",
        "## Notes",
        "",
        "- Both exporters fold BatchNormalization into the Conv weights in eval mode (the",
        "  dynamo one through onnxscript's optimizer), so these CNN files have no",
        "  BatchNormalization nodes; `models/resnet_style.onnx` and",
        "  `models/mobilenetv2_style.onnx` keep them for the Conv+BN folding pass.",
        "- GPT-2 is exported with `input_ids` and `attention_mask`: without a mask,",
        "  transformers 5 calls `torch.diff` (packed-sequence detection), which the",
        "  TorchScript exporter cannot export (`aten::diff` unsupported at opsets 13 and 17).",
        "- With left padding, query rows whose keys are all masked give different outputs in",
        "  eager torch and the dynamo GPT-2 export (about 0.1 abs); those rows are",
        "  meaningless, so the check uses right padding. Compare only unpadded positions",
        "  when verifying left-padded inputs.",
        "- Random-input tests should feed attention masks of ones (see",
        "  `tests/models/test_model_files.py`).",
    ]
    lines += ["", "## Failures", ""]
    if manifest["failures"]:
        for key in sorted(manifest["failures"]):
            lines.append(f"- `{key}`: {manifest['failures'][key]}")
    else:
        lines.append("None.")
    total = sum(r["bytes"] for r in manifest["files"].values())
    lines += ["", f"Total size: {total / 1024 / 1024:.2f} MiB in {len(manifest['files'])} files.",
              ""]
    with open(os.path.join(OUT_DIR, "README.md"), "w") as f:
        f.write("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export the small torch sample models.")
    parser.add_argument("--only", action="append", help="model name(s) to export")
    args = parser.parse_args(argv)
    os.makedirs(OUT_DIR, exist_ok=True)
    manifest = load_manifest()
    status = 0
    for spec in specs():
        if args.only and spec.name not in args.only:
            continue
        module = build_module(spec)
        for exporter, opset in spec.exports:
            fname = f"{spec.name}_{exporter}_op{opset}.onnx"
            path = os.path.join(OUT_DIR, fname)
            manifest["files"].pop(fname, None)
            manifest["failures"].pop(fname, None)
            try:
                export_one(module, spec, exporter, opset, path)
                err = check_against_torch(path, module, spec)
                if not err <= MAX_REL_ERR:
                    raise AssertionError(f"{fname}: onnxruntime differs from torch, max rel "
                                         f"err {err:.2e} > {MAX_REL_ERR}")
                rec = describe(path)
                if rec["bytes"] > MAX_FILE_BYTES:
                    raise RuntimeError(f"{fname} is {rec['bytes']} bytes, over the 2 MiB cap")
                rec.update(note=spec.note, exporter=exporter, max_rel_err=err)
                manifest["files"][fname] = rec
                print(f"ok   {fname}: {rec['bytes']} B, {rec['nodes']} nodes, err {err:.2e}",
                      flush=True)
            except Exception as exc:  # record every exporter failure, never hide it
                status = 1
                manifest["failures"][fname] = last_error_line(exc)
                print(f"FAIL {fname}: {manifest['failures'][fname]}", flush=True)
                if os.path.exists(path):
                    os.remove(path)
            save_manifest(manifest)
    return status


if __name__ == "__main__":
    sys.exit(main())
