"""Export the small models of the fusion-coverage table (issue 18) with both torch exporters.

Tiny configs, random weights (seed 0), static shapes: LLaMA (GQA, RoPE, SwiGLU, RMSNorm; also fp16),
Qwen2 (q/k/v biases), Mistral,
T5 v1.1 encoder (GeGLU), CLIP vision (QuickGELU), Whisper encoder (Conv1d -> GELU), Swin
(shifted-window attention), a MobileNetV3-style block (squeeze-excitation Conv -> HardSigmoid,
Gemm -> HardSwish), a DenseNet-style block (pre-activation BN -> ReLU) and a diffusion-UNet-style
block (GroupNorm -> SiLU -> Conv). Needs its own venv
(torch is never a test dependency)::

    python3 -m venv /work/venvs/torch && /work/venvs/torch/bin/pip install torch==2.13.0 transformers onnxscript
    /work/venvs/torch/bin/python models/export_llm_family.py [--only llama ...]

``llamadyn`` is LLaMA with symbolic batch and sequence dims. Writes ``models/coverage/<name>_<exporter>.onnx`` (TorchScript at opset 17, dynamo at its default
opset) and ``models/coverage/manifest.json`` (each file, or the exporter's error line). Every file
is checked against the eager torch output under onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "coverage")
MANIFEST = os.path.join(OUT, "manifest.json")
MAX_BYTES = 1024 * 1024
B, S = 2, 16


class Unwrap(nn.Module):
    """Return only the first tensor of a transformers model's output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        out = self.model(*args)
        return out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state


def _tokens(vocab=128):
    return (torch.randint(0, vocab, (B, S), generator=torch.Generator().manual_seed(1)),)


def llama(dtype=torch.float32):
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation="eager")
    return Unwrap(LlamaModel(cfg)).to(dtype), _tokens()


def qwen2():
    from transformers import Qwen2Config, Qwen2Model

    cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation="eager")
    return Unwrap(Qwen2Model(cfg)), _tokens()


def mistral():
    from transformers import MistralConfig, MistralModel

    cfg = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        sliding_window=None, head_dim=16, attn_implementation="eager")
    return Unwrap(MistralModel(cfg)), _tokens()


def t5_encoder():
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                   feed_forward_proj="gated-gelu", attn_implementation="eager")
    return Unwrap(T5EncoderModel(cfg)), _tokens()


def clip_vision():
    from transformers import CLIPVisionConfig, CLIPVisionModel

    cfg = CLIPVisionConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8, attn_implementation="eager")
    return Unwrap(CLIPVisionModel(cfg)), (torch.randn(B, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)


def whisper_encoder():
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=96,
                        num_mel_bins=16, max_source_positions=16, attn_implementation="eager")
    return Unwrap(WhisperEncoder(cfg)), (torch.randn(B, 16, 32, generator=torch.Generator().manual_seed(1)),)


def swin():
    from transformers import SwinConfig, SwinModel

    cfg = SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4,
                     attn_implementation="eager")
    return Unwrap(SwinModel(cfg)), (torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)


class MobileNetV3Block(nn.Module):
    """Inverted residual with squeeze-excitation (Conv -> ReLU -> Conv -> Hardsigmoid gate) and the
    classifier (Linear -> Hardswish -> Linear), as torchvision's mobilenet_v3_small writes them."""

    def __init__(self, c=16, e=32):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c), nn.Hardswish())
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(e, e, 3, 1, 1, groups=e, bias=False), nn.BatchNorm2d(e), nn.Hardswish())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(e, 8, 1), nn.ReLU(), nn.Conv2d(8, e, 1),
                                nn.Hardsigmoid())
        self.project = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))
        self.head = nn.Sequential(nn.Linear(c, 32), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(32, 10))

    def forward(self, x):
        x = self.stem(x)
        h = self.dw(self.expand(x))
        h = h * self.se(h)
        x = x + self.project(h)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class DenseNetBlock(nn.Module):
    """Two dense layers (BN -> ReLU -> Conv1x1 -> BN -> ReLU -> Conv3x3, concatenated) and a transition."""

    def __init__(self, c=8, growth=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, 1, 1)
        self.layers = nn.ModuleList()
        for i in range(2):
            cin = c + i * growth
            self.layers.append(nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, 16, 1, bias=False),
                                             nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, growth, 3, 1, 1, bias=False)))
        cout = c + 2 * growth
        self.transition = nn.Sequential(nn.BatchNorm2d(cout), nn.ReLU(), nn.Conv2d(cout, 8, 1, bias=False),
                                        nn.AvgPool2d(2))

    def forward(self, x):
        feats = [self.stem(x)]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        return self.transition(torch.cat(feats, 1))


class GroupNormBlock(nn.Module):
    """A diffusion-UNet-style residual block: GroupNorm -> SiLU -> Conv, twice, plus the skip."""

    def __init__(self, c=16, groups=4):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, 1, 1)
        self.n1, self.c1 = nn.GroupNorm(groups, c), nn.Conv2d(c, c, 3, 1, 1)
        self.n2, self.c2 = nn.GroupNorm(groups, c, eps=1e-6), nn.Conv2d(c, c, 3, 1, 1)
        g = torch.Generator().manual_seed(3)
        for n in (self.n1, self.n2):
            n.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            n.bias.data.copy_(torch.randn(c, generator=g) * 0.1)

    def forward(self, x):
        x = self.stem(x)
        h = self.c1(nn.functional.silu(self.n1(x)))
        return x + self.c2(nn.functional.silu(self.n2(h)))


def groupnorm():
    return GroupNormBlock(), (torch.randn(B, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)


def _randomize_bn(module):
    g = torch.Generator().manual_seed(2)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return module


def mobilenetv3():
    return _randomize_bn(MobileNetV3Block()), (torch.randn(B, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)


def densenet():
    return _randomize_bn(DenseNetBlock()), (torch.randn(B, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)


SPECS = {
    "llama": llama,
    "llama_fp16": lambda: llama(torch.float16),
    "llamadyn": llama,  # dynamic batch and sequence
    "qwen2": qwen2,
    "mistral": mistral,
    "t5enc": t5_encoder,
    "clipvision": clip_vision,
    "whisperenc": whisper_encoder,
    "swin": swin,
    "mobilenetv3": mobilenetv3,
    "densenet": densenet,
    "groupnorm": groupnorm,
}
EXPORTERS = {"torchscript": dict(dynamo=False, opset_version=17), "dynamo": dict(dynamo=True)}
DYNAMIC = {"llamadyn"}  # exported with symbolic batch and sequence dims


def _dynamic(exporter: str) -> dict:
    if exporter == "torchscript":
        return dict(input_names=["input_ids"], dynamic_axes={"input_ids": {0: "batch", 1: "seq"}})
    # Unwrap.forward takes *args: one more tuple level
    return dict(input_names=["input_ids"], dynamic_shapes=(({0: torch.export.Dim("batch", max=64),
                                                            1: torch.export.Dim("seq", max=64)},),))


def export(name, exporter) -> dict:
    torch.manual_seed(0)
    module, args = SPECS[name]()
    module.eval()
    path = os.path.join(OUT, f"{name}_{exporter}.onnx")
    with torch.no_grad():
        expected = module(*args)
        extra = _dynamic(exporter) if name in DYNAMIC else {}
        torch.onnx.export(module, args, path, external_data=False, **EXPORTERS[exporter], **extra)
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    got = sess.run(None, feeds)[0]
    err = float(np.abs(got.astype(np.float64) - expected.float().numpy()).max())
    size = os.path.getsize(path)
    if size > MAX_BYTES:
        os.remove(path)
        raise RuntimeError(f"{size} bytes > {MAX_BYTES}")
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return {"file": os.path.basename(path), "opset": opset, "bytes": size, "nodes": len(model.graph.node),
            "max_abs_err_vs_torch": err}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=sorted(SPECS))
    ns = ap.parse_args(argv)
    os.makedirs(OUT, exist_ok=True)
    manifest = json.load(open(MANIFEST)) if os.path.exists(MANIFEST) else {}
    for name in ns.only or SPECS:
        for exporter in EXPORTERS:
            key = f"{name}_{exporter}"
            try:
                manifest[key] = export(name, exporter)
                print(f"ok   {key}: {manifest[key]}")
            except Exception as exc:  # record the exporter's error line, keep going
                line = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
                manifest[key] = {"error": line}
                print(f"FAIL {key}: {line}")
                if os.environ.get("EXPORT_DEBUG"):
                    traceback.print_exc()
    with open(MANIFEST, "w") as f:
        json.dump(dict(sorted(manifest.items())), f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
