"""The benchmark models, built from torchvision / transformers configurations with random weights and
exported to ONNX here (no downloads): one home for bench/e2e.py and bench/device_bench.sh.

    python3 bench/torch_models.py --export gpt2 --out /tmp/gpt2.onnx      # one model, fp32, dynamic batch

Every model has one input named ``input`` (images: float (B, 3, 224, 224); transformers: int64 token
ids (B, 128)) and one output named ``output``. ``tiny=True`` builds a few-layer configuration of the
transformers models for a CPU dry run (the torchvision ones have no tiny form: they need torchvision).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SEQ = 128
VOCAB = {"gpt2": 50257, "bert": 30522, "llama": 32000}
# name -> (what it is, input kind)
MODELS = {
    "resnet50": ("torchvision resnet50", "image"),
    "mobilenetv2": ("torchvision mobilenet_v2", "image"),
    "efficientnet_b0": ("torchvision efficientnet_b0", "image"),
    "gpt2": ("transformers GPT2LMHeadModel, 124M config, seq 128", "tokens"),
    "bert": ("transformers BertModel, bert-base config, seq 128", "tokens"),
    "vit_b16": ("transformers ViTModel, ViT-B/16 config (224, patch 16)", "image"),
}
# models outside issue 15's set (its acceptance checks and e2e.py's default list are MODELS): rows of their own
MORE = {
    # grouped-query attention (rule attention_grouped_kv), RMSNorm, RoPE, SwiGLU: TinyLlama-1.1B's layer shape
    # (hidden 2048, 32 query heads and 4 K/V heads of 64, MLP 5632), 4 of its 22 layers (under 2 GB in fp32)
    "llama": ("transformers LlamaForCausalLM, TinyLlama-1.1B config with 4 layers, seq 128", "tokens"),
}
# the same modules exported by torch.onnx's dynamo exporter (torch's default since 2.9) instead of the
# TorchScript one: the graphs differ (bench/NOTES_e2e.md, seventeenth session), the peers do not
VARIANTS = {f"{m}_dynamo": (f"{spec[0]}, dynamo export", spec[1]) for m, spec in {**MODELS, **MORE}.items()}
ALL_MODELS = {**MODELS, **MORE, **VARIANTS}
DYNAMO_SUFFIX = "_dynamo"


def base_model(name: str) -> str:
    """The module a model name builds: ``gpt2_dynamo`` builds ``gpt2``."""
    return name[: -len(DYNAMO_SUFFIX)] if name in VARIANTS else name


def _wrap(model, call):
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input):  # noqa: A002 - the ONNX input's name
            return call(self.m, input)

    return Wrapped(model).eval()


def _import_torchvision():
    """torchvision; where its compiled ops do not match the installed torch (a CPU torch beside a
    CUDA torchvision: "operator torchvision::nms does not exist"), the model code without them (the
    classification models never call those ops)."""
    try:
        import torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        import sys
        import types

        for mod in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[mod]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision
    return torchvision


def build_module(name: str, tiny: bool = False):
    """The torch module of ``name`` (eval mode, seeded random weights)."""
    import torch

    torch.manual_seed(0)
    name = base_model(name)
    if name in ("resnet50", "mobilenetv2", "efficientnet_b0"):
        torchvision = _import_torchvision()

        fn = {"resnet50": torchvision.models.resnet50, "mobilenetv2": torchvision.models.mobilenet_v2,
              "efficientnet_b0": torchvision.models.efficientnet_b0}[name]
        return fn(weights=None).eval()
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        kw = dict(n_layer=2, n_embd=64, n_head=2) if tiny else {}
        lm = GPT2LMHeadModel(GPT2Config(n_positions=1024, use_cache=False, **kw)).eval()
        # the mask is passed: without it transformers 5 calls torch.diff, which TorchScript cannot export
        return _wrap(lm, lambda m, ids: m(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                                          return_dict=False)[0])
    if name == "bert":
        from transformers import BertConfig, BertModel

        kw = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128) if tiny else {}
        bert = BertModel(BertConfig(**kw), add_pooling_layer=False).eval()
        return _wrap(bert, lambda m, ids: m(input_ids=ids, attention_mask=torch.ones_like(ids), return_dict=False)[0])
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        kw = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2) if tiny else
              dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=32,
                   num_key_value_heads=4))
        lm = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB["llama"], max_position_embeddings=2048, use_cache=False,
                                          **kw)).eval()
        return _wrap(lm, lambda m, ids: m(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                                          return_dict=False)[0])
    if name == "vit_b16":
        from transformers import ViTConfig, ViTModel

        kw = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128) if tiny else {}
        vit = ViTModel(ViTConfig(image_size=224, patch_size=16, **kw), add_pooling_layer=False).eval()
        return _wrap(vit, lambda m, x: m(pixel_values=x, return_dict=False)[0])
    raise ValueError(f"unknown model {name!r}; known: {', '.join(ALL_MODELS)}")


def example_input(name: str, bs: int, device: str = "cpu", seed: int | None = None):
    """The benchmark input of ``name`` at batch ``bs`` (float32 images or int64 token ids)."""
    import torch

    g = torch.Generator().manual_seed(bs if seed is None else seed)
    if ALL_MODELS[name][1] == "tokens":
        return torch.randint(0, 1000, (bs, SEQ), generator=g).to(device)
    return torch.randn(bs, 3, 224, 224, generator=g).to(device)


def input_shape(name: str, bs: int) -> str:
    """The ``--shape`` value of ``graphopt optimize`` for batch ``bs``."""
    return f"input={bs}x{SEQ}" if ALL_MODELS[name][1] == "tokens" else f"input={bs}x3x224x224"


def export(name: str, module, path: Path, device: str = "cpu") -> str:
    """ONNX export with a dynamic batch dim: the TorchScript exporter (opset 17), else dynamo; a
    ``*_dynamo`` name (``VARIANTS``) takes dynamo directly. The module's dtype and device are kept (an
    fp16 module on the GPU exports an fp16 model)."""
    import torch

    x = example_input(name, 2, device)
    if ALL_MODELS[name][1] == "image":
        x = x.to(next(module.parameters()).dtype)
    first = ""
    if name not in VARIANTS:
        try:
            torch.onnx.export(module, (x,), str(path), opset_version=17, dynamo=False, input_names=["input"],
                              output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
            return "torchscript opset 17"
        except Exception as e:  # noqa: BLE001 - the legacy exporter may be gone: try dynamo
            first = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    batch = torch.export.Dim("batch", min=1, max=1024)
    # dynamic_shapes by position: torchvision's modules name their argument x, the wrapped ones input
    torch.onnx.export(module, (x,), str(path), dynamo=True, input_names=["input"], output_names=["output"],
                      dynamic_shapes=({0: batch},), external_data=False)
    return f"dynamo (torchscript failed: {first})" if first else "dynamo"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", required=True, choices=sorted(ALL_MODELS))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tiny", action="store_true", help="a few-layer configuration (transformers models; CPU checks)")
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    how = export(args.export, build_module(args.export, args.tiny), args.out)
    print(f"{args.export}: {how} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
