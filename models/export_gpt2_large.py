"""Export a deep, narrow GPT-2 (about 20,000 ONNX nodes) for the optimizer-speed benchmark.

    /work/venvs/torch/bin/python models/export_gpt2_large.py [--target-nodes 20000]

Writes ``models/torch/gpt2_20k_torchscript_op14.onnx`` with the TorchScript exporter at
opset 14 (decomposed LayerNorm, tanh GELU with Pow(3), SDPA decomposed into
MatMul/Softmax with the IsNaN/Where guard) and prints its node count.  The model is
GPT2LMHeadModel with n_embd=32, n_head=4, n_inner=32 (a 1x MLP instead of GPT-2's 4x
keeps the file small; the node count does not depend on widths), vocab 256,
n_positions=128, random weights.  The number of layers is chosen from two probe exports
(1 and 2 layers) so that the count lands near the target even if the exporter changes.
The file is checked against eager torch and recorded in ``models/torch/manifest.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export_torch as et  # noqa: E402
import torch_modules as tm  # noqa: E402

FILE = "gpt2_20k_torchscript_op14.onnx"
OPSET = 14
WIDTHS = dict(n_embd=32, n_head=4, n_inner=32, vocab=256, n_positions=128)


def spec_for(n_layer: int) -> et.Spec:
    return et.Spec(f"gpt2_{n_layer}l", lambda: tm.GPT2Logits(n_layer=n_layer, **WIDTHS),
                   et._gpt2_inputs(2, 16), ["logits"],
                   {"input_ids": {0: "batch", 1: "seq"},
                    "attention_mask": {0: "batch", 1: "seq"}},
                   et._gpt2_inputs(3, 11),
                   f"GPT2LMHeadModel n_layer={n_layer} n_embd=32 n_head=4 n_inner=32 vocab=256")


def count_nodes(n_layer: int) -> int:
    spec = spec_for(n_layer)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.onnx")
        et.export_one(et.build_module(spec), spec, "torchscript", OPSET, path)
        return len(onnx.load(path).graph.node)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-nodes", type=int, default=20000)
    args = parser.parse_args(argv)
    one, two = count_nodes(1), count_nodes(2)
    per_layer, base = two - one, 2 * one - two
    n_layer = max(1, round((args.target_nodes - base) / per_layer))
    print(f"probe: {per_layer} nodes per layer, {base} outside the layers -> n_layer={n_layer}",
          flush=True)

    spec = spec_for(n_layer)
    module = et.build_module(spec)
    path = os.path.join(et.OUT_DIR, FILE)
    os.makedirs(et.OUT_DIR, exist_ok=True)
    manifest = et.load_manifest()
    manifest["files"].pop(FILE, None)
    manifest["failures"].pop(FILE, None)
    try:
        et.export_one(module, spec, "torchscript", OPSET, path)
        err = et.check_against_torch(path, module, spec)
        if not err <= et.MAX_REL_ERR:
            raise AssertionError(f"{FILE}: onnxruntime differs from torch, max rel err {err:.2e}")
        rec = et.describe(path)
        rec.update(note=spec.note, exporter="torchscript", max_rel_err=err)
        manifest["files"][FILE] = rec
        print(f"{FILE}: {rec['nodes']} nodes, {rec['bytes']} bytes, max rel err {err:.2e}")
        status = 0
    except Exception as exc:  # recorded, never hidden
        manifest["failures"][FILE] = et.last_error_line(exc)
        print(f"FAIL {FILE}: {manifest['failures'][FILE]}")
        status = 1
    et.save_manifest(manifest)
    return status


if __name__ == "__main__":
    sys.exit(main())
