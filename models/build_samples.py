"""Build the small hand-written sample models in ``models/`` with ``onnx.helper``.

Run it from anywhere with the project venv::

    /work/venv/bin/python models/build_samples.py            # writes models/*.onnx
    /work/venv/bin/python models/build_samples.py --out DIR  # writes DIR/*.onnx

The output is fully deterministic: the weights come from ``numpy.random.default_rng``
with a fixed seed per model, names come from per-model counters, and every model sets
its producer fields and the lowest ``ir_version`` its opset needs.  Running the script
twice gives byte-identical files (``tests/models/test_model_files.py`` checks this).

Models (each is checked with ``onnx.checker.check_model(full_check=True)`` before it is
written):

* ``resnet_style.onnx`` (opset 17): stem Conv+BatchNormalization+Relu, MaxPool, two
  bottleneck blocks (the second has the stride-2 3x3 and a Conv+BN projection shortcut),
  residual Add in both operand orders, GlobalAveragePool, Flatten, Gemm.
* ``mobilenetv2_style.onnx`` (opset 14): Conv+BN+Clip(0, 6), inverted residual blocks
  (expand 1x1 + ReLU6, depthwise 3x3 + ReLU6, linear 1x1 bottleneck), a residual Add,
  Conv->HardSwish, Conv->HardSigmoid->Mul (how torch writes hardswish below opset 14),
  and Conv->Sigmoid->Mul (SiLU).  Opset 14 rather than 13 because HardSwish only exists
  from opset 14; Clip still takes min/max as inputs, both as initializers and as
  Constant nodes.
* ``transformer_block.onnx`` (opset 14): one GPT-2-like pre-LN block in the form the
  TorchScript exporter writes: decomposed LayerNorm, fused QKV MatMul+Add then Split,
  head split with Shape/Gather/Unsqueeze/Concat/Reshape/Transpose, MatMul, Div by
  sqrt(d), Softmax, MatMul, head merge, output projection, residual Adds, and an MLP
  with the erf GELU (Div/Erf/Add/Mul/Mul).  Scalars are Constant nodes in the first
  LayerNorm and the GELU and initializers in the second LayerNorm, as both appear in
  real exports.
* ``subgraph_if.onnx`` (opset 17): an If whose branches each run a Conv->Relu (then) or
  Conv->Add->Sigmoid (else) chain on outer-scope weights, followed by an outer
  Conv->Relu.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PRODUCER = "graphopt-models"
PRODUCER_VERSION = "1"


class Builder:
    """Collects nodes and initializers for one graph and hands out unique names.

    Hand-written on purpose: ``onnx.helper`` builds single protos but has no notion of a
    graph under construction, and the only extra logic here is name counters and a seeded
    RNG so that the output bytes are reproducible.
    """

    def __init__(self, seed: int, prefix: str = ""):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.prefix = prefix
        self._counts: dict[str, int] = {}

    def name(self, base: str) -> str:
        """Return ``<prefix><base>_<n>``, unique within this builder."""
        n = self._counts.get(base, 0)
        self._counts[base] = n + 1
        return f"{self.prefix}{base}_{n}"

    def init(self, base: str, array: np.ndarray) -> str:
        """Add ``array`` as an initializer and return its name."""
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(array, order="C"), name))
        return name

    def const(self, base: str, array: np.ndarray) -> str:
        """Add a Constant node producing ``array`` and return its output name."""
        out = self.name(base)
        tensor = numpy_helper.from_array(np.asarray(array, order="C"), out + "_value")
        self.nodes.append(helper.make_node("Constant", [], [out], name=out + "_node", value=tensor))
        return out

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, out: str | None = None,
           **attrs) -> str | list[str]:
        """Add one node; return its output name (or the list of names if ``n_out > 1``).

        ``out`` names the (single) output explicitly, e.g. for a graph output.
        """
        node_name = self.name(op_type)
        if out is not None:
            outs = [out]
        else:
            outs = [f"{node_name}_out{i}" if n_out > 1 else f"{node_name}_out"
                    for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=node_name, **attrs))
        return outs if n_out > 1 else outs[0]

    # --- weights -------------------------------------------------------------------------

    def conv_weight(self, c_out: int, c_in_per_group: int, k: int) -> str:
        fan_in = c_in_per_group * k * k
        w = self.rng.standard_normal((c_out, c_in_per_group, k, k)) * math.sqrt(2.0 / fan_in)
        return self.init("conv_w", w.astype(np.float32))

    def bias(self, n: int, scale: float = 0.1) -> str:
        return self.init("bias", (self.rng.standard_normal(n) * scale).astype(np.float32))

    def batchnorm(self, x: str, c: int, eps: float = 1e-5) -> str:
        scale = self.init("bn_scale", self.rng.uniform(0.5, 1.5, c).astype(np.float32))
        b = self.init("bn_bias", (self.rng.standard_normal(c) * 0.1).astype(np.float32))
        mean = self.init("bn_mean", (self.rng.standard_normal(c) * 0.1).astype(np.float32))
        var = self.init("bn_var", self.rng.uniform(0.5, 1.5, c).astype(np.float32))
        return self.op("BatchNormalization", [x, scale, b, mean, var], epsilon=eps, momentum=0.9)

    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int = 1, group: int = 1,
             with_bias: bool = False) -> str:
        """Conv with 'same'-style symmetric padding k//2, as torch writes it."""
        w = self.conv_weight(c_out, c_in // group, k)
        inputs = [x, w] + ([self.bias(c_out)] if with_bias else [])
        p = k // 2
        return self.op("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[p, p, p, p], dilations=[1, 1], group=group)

    def linear(self, x: str, n_in: int, n_out: int) -> tuple[str, str]:
        """MatMul by a [n_in, n_out] weight, then Add bias. Returns (matmul_out, add_out)."""
        w = self.rng.standard_normal((n_in, n_out)) / math.sqrt(n_in)
        mm = self.op("MatMul", [x, self.init("linear_w", w.astype(np.float32))])
        return mm, self.op("Add", [mm, self.bias(n_out, 0.02)])


def finish(b: Builder, graph_name: str, inputs, outputs, opset: int, doc: str) -> onnx.ModelProto:
    """Wrap the builder's nodes into a checked model with pinned producer/IR fields."""
    graph = helper.make_graph(b.nodes, graph_name, inputs, outputs, initializer=b.inits)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name=PRODUCER,
                              producer_version=PRODUCER_VERSION, doc_string=doc)
    model.ir_version = helper.find_min_ir_version_for(opsets)
    onnx.checker.check_model(model, full_check=True)
    return model


def float_input(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


# ----------------------------------------------------------------------------------------
# ResNet-style
# ----------------------------------------------------------------------------------------

def bottleneck(b: Builder, x: str, c_in: int, c_mid: int, c_out: int, stride: int,
               shortcut_first: bool) -> str:
    """torchvision Bottleneck (v1.5: stride on the 3x3), projection when shapes change."""
    y = b.op("Relu", [b.batchnorm(b.conv(x, c_in, c_mid, 1), c_mid)])
    y = b.op("Relu", [b.batchnorm(b.conv(y, c_mid, c_mid, 3, stride=stride), c_mid)])
    y = b.batchnorm(b.conv(y, c_mid, c_out, 1), c_out)
    if stride != 1 or c_in != c_out:
        shortcut = b.batchnorm(b.conv(x, c_in, c_out, 1, stride=stride), c_out)
    else:
        shortcut = x
    add_in = [shortcut, y] if shortcut_first else [y, shortcut]
    return b.op("Relu", [b.op("Add", add_in)])


def build_resnet_style() -> onnx.ModelProto:
    b = Builder(seed=1)
    x = b.op("Relu", [b.batchnorm(b.conv("input", 3, 32, 3), 32)])
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])  # 16x16
    x = bottleneck(b, x, 32, 16, 32, stride=1, shortcut_first=False)  # Add(branch, shortcut)
    x = bottleneck(b, x, 32, 32, 64, stride=2, shortcut_first=True)   # Add(shortcut, branch), 8x8
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    w = (b.rng.standard_normal((10, 64)) / 8.0).astype(np.float32)
    b.op("Gemm", [x, b.init("fc_w", w), b.bias(10)], out="logits", alpha=1.0, beta=1.0,
         transB=1)
    return finish(b, "resnet_style", [float_input("input", ["batch", 3, 32, 32])],
                  [float_input("logits", ["batch", 10])], 17,
                  "ResNet-style bottleneck sample built by models/build_samples.py")


# ----------------------------------------------------------------------------------------
# MobileNetV2-style
# ----------------------------------------------------------------------------------------

def relu6(b: Builder, x: str, as_constant_nodes: bool = False) -> str:
    """Clip(x, 0, 6) with min/max as inputs (opset >= 11)."""
    make = b.const if as_constant_nodes else b.init
    lo = make("clip_min", np.array(0.0, dtype=np.float32))
    hi = make("clip_max", np.array(6.0, dtype=np.float32))
    return b.op("Clip", [x, lo, hi])


def inverted_residual(b: Builder, x: str, c_in: int, c_out: int, stride: int, expand: int,
                      constant_clip: bool = False) -> str:
    """torchvision InvertedResidual: [1x1 expand + ReLU6], dw 3x3 + ReLU6, linear 1x1."""
    hidden = c_in * expand
    y = x
    if expand != 1:
        y = relu6(b, b.batchnorm(b.conv(y, c_in, hidden, 1), hidden), constant_clip)
    y = relu6(b, b.batchnorm(b.conv(y, hidden, hidden, 3, stride=stride, group=hidden), hidden),
              constant_clip)
    y = b.batchnorm(b.conv(y, hidden, c_out, 1), c_out)  # linear bottleneck: no activation
    if stride == 1 and c_in == c_out:
        y = b.op("Add", [x, y])
    return y


def build_mobilenetv2_style() -> onnx.ModelProto:
    b = Builder(seed=2)
    x = relu6(b, b.batchnorm(b.conv("input", 3, 16, 3, stride=2), 16))            # 16x16
    x = inverted_residual(b, x, 16, 8, stride=1, expand=1)
    x = inverted_residual(b, x, 8, 16, stride=2, expand=6)                         # 8x8
    x = inverted_residual(b, x, 16, 16, stride=1, expand=4, constant_clip=True)    # residual
    x = inverted_residual(b, x, 16, 16, stride=1, expand=4)                        # residual
    # Conv -> HardSwish (native op, opset 14)
    x = b.op("HardSwish", [b.conv(x, 16, 32, 1, with_bias=True)])
    # Conv -> HardSigmoid -> Mul: hardswish as torch writes it below opset 14
    c = b.conv(x, 32, 32, 3, group=32, with_bias=True)
    x = b.op("Mul", [c, b.op("HardSigmoid", [c], alpha=1.0 / 6.0, beta=0.5)])
    # Conv -> Sigmoid -> Mul (SiLU), the Mul with the Conv output second
    c = b.batchnorm(b.conv(x, 32, 48, 1), 48)
    x = b.op("Mul", [b.op("Sigmoid", [c]), c])
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    w = (b.rng.standard_normal((10, 48)) / math.sqrt(48)).astype(np.float32)
    b.op("Gemm", [x, b.init("fc_w", w), b.bias(10)], out="logits", transB=1)
    return finish(b, "mobilenetv2_style", [float_input("input", ["batch", 3, 32, 32])],
                  [float_input("logits", ["batch", 10])], 14,
                  "MobileNetV2-style sample built by models/build_samples.py")


# ----------------------------------------------------------------------------------------
# GPT-2-like transformer block (TorchScript-exporter form, opset 14)
# ----------------------------------------------------------------------------------------

def scalar(b: Builder, value, as_constant_node: bool, dtype=np.float32) -> str:
    arr = np.array(value, dtype=dtype)
    return b.const("scalar", arr) if as_constant_node else b.init("scalar", arr)


def layer_norm(b: Builder, x: str, d: int, constants_as_nodes: bool, eps: float = 1e-5) -> str:
    """ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add, as torch < opset 17 writes it."""
    mean = b.op("ReduceMean", [x], axes=[-1], keepdims=1)
    centered = b.op("Sub", [x, mean])
    sq = b.op("Pow", [centered, scalar(b, 2.0, constants_as_nodes)])
    var = b.op("ReduceMean", [sq], axes=[-1], keepdims=1)
    std = b.op("Sqrt", [b.op("Add", [var, scalar(b, eps, constants_as_nodes)])])
    normed = b.op("Div", [centered, std])
    gamma = b.init("ln_weight", b.rng.uniform(0.8, 1.2, d).astype(np.float32))
    beta = b.init("ln_bias", (b.rng.standard_normal(d) * 0.02).astype(np.float32))
    return b.op("Add", [b.op("Mul", [normed, gamma]), beta])


def dim_of(b: Builder, shape: str, index: int) -> str:
    """Shape -> Gather(index) -> Unsqueeze(0): one dynamic dim as a 1-D int64 tensor."""
    g = b.op("Gather", [shape, b.const("idx", np.array(index, dtype=np.int64))], axis=0)
    return b.op("Unsqueeze", [g, b.const("axes", np.array([0], dtype=np.int64))])


def build_transformer_block(d: int = 64, heads: int = 4, mlp: int = 256) -> onnx.ModelProto:
    b = Builder(seed=3)
    dh = d // heads
    x = "input"
    h = layer_norm(b, x, d, constants_as_nodes=True)
    _, qkv = b.linear(h, d, 3 * d)
    split = b.init("split_sizes", np.array([d, d, d], dtype=np.int64))
    q, k, v = b.op("Split", [qkv, split], n_out=3, axis=2)

    shape = b.op("Shape", [h])
    batch, seq = dim_of(b, shape, 0), dim_of(b, shape, 1)
    head_shape = b.op("Concat", [batch, seq, b.const("heads", np.array([heads, dh], np.int64))],
                      axis=0)

    def heads_of(t: str, perm: list[int]) -> str:
        return b.op("Transpose", [b.op("Reshape", [t, head_shape])], perm=perm)

    qh = heads_of(q, [0, 2, 1, 3])            # [B, H, S, dh]
    kt = heads_of(k, [0, 2, 3, 1])            # [B, H, dh, S]
    vh = heads_of(v, [0, 2, 1, 3])            # [B, H, S, dh]
    scores = b.op("Div", [b.op("MatMul", [qh, kt]), b.const("sqrt_d", np.array(math.sqrt(dh),
                                                                                np.float32))])
    probs = b.op("Softmax", [scores], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, vh])], perm=[0, 2, 1, 3])
    merged_shape = b.op("Concat", [batch, seq, b.const("d", np.array([d], np.int64))], axis=0)
    ctx = b.op("Reshape", [ctx, merged_shape])
    _, attn_out = b.linear(ctx, d, d)
    x = b.op("Add", [x, attn_out])              # residual 1

    h = layer_norm(b, x, d, constants_as_nodes=False)
    _, fc = b.linear(h, d, mlp)
    # GELU, erf form: x * 0.5 * (1 + erf(x / sqrt(2))) written as Div/Erf/Add/Mul/Mul
    e = b.op("Erf", [b.op("Div", [fc, scalar(b, math.sqrt(2.0), True)])])
    g = b.op("Mul", [b.op("Mul", [fc, b.op("Add", [e, scalar(b, 1.0, True)])]),
                     scalar(b, 0.5, True)])
    _, proj = b.linear(g, mlp, d)
    b.op("Add", [x, proj], out="output")        # residual 2
    return finish(b, "transformer_block", [float_input("input", ["batch", "seq", d])],
                  [float_input("output", ["batch", "seq", d])], 14,
                  "GPT-2-like transformer block (TorchScript form) built by "
                  "models/build_samples.py")


# ----------------------------------------------------------------------------------------
# If with subgraphs that use outer-scope weights
# ----------------------------------------------------------------------------------------

def build_subgraph_if(c: int = 8) -> onnx.ModelProto:
    outer = Builder(seed=4)
    w_then = outer.conv_weight(c, c, 3)
    b_then = outer.bias(c)
    w_else = outer.conv_weight(c, c, 3)
    b_else = outer.init("bias_chw", (outer.rng.standard_normal((c, 1, 1)) * 0.1).astype(
        np.float32))
    conv_attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])

    def branch(name: str, build) -> onnx.GraphProto:
        sb = Builder(seed=0, prefix=name + "_")
        build(sb, name + "_y")
        return helper.make_graph(sb.nodes, name, [], [float_input(name + "_y", ["batch", c, 16,
                                                                               16])])

    then_g = branch("then", lambda sb, out: sb.op(
        "Relu", [sb.op("Conv", ["input", w_then, b_then], **conv_attrs)], out=out))
    # the else bias is a [C,1,1] outer initializer added after a bias-free Conv
    else_g = branch("else", lambda sb, out: sb.op("Sigmoid", [sb.op("Add", [
        sb.op("Conv", ["input", w_else], **conv_attrs), b_else])], out=out))
    y = outer.op("If", ["cond"], then_branch=then_g, else_branch=else_g)
    outer.op("Relu", [outer.conv(y, c, c, 3, with_bias=True)], out="output")
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    return finish(outer, "subgraph_if", [float_input("input", ["batch", c, 16, 16]), cond],
                  [float_input("output", ["batch", c, 16, 16])], 17,
                  "If with Conv chains on outer-scope weights, built by models/build_samples.py")


BUILDERS = {
    "resnet_style.onnx": build_resnet_style,
    "mobilenetv2_style.onnx": build_mobilenetv2_style,
    "transformer_block.onnx": build_transformer_block,
    "subgraph_if.onnx": build_subgraph_if,
}


def build_all(out_dir: str) -> dict[str, bytes]:
    """Build every sample, write it to ``out_dir`` and return {file name: bytes}."""
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    for fname, build in BUILDERS.items():
        data = build().SerializeToString(deterministic=True)
        with open(os.path.join(out_dir, fname), "wb") as f:
            f.write(data)
        written[fname] = data
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                        help="output folder (default: the models/ folder)")
    args = parser.parse_args(argv)
    for fname, data in build_all(args.out).items():
        model = onnx.load_from_string(data)
        print(f"{fname}: {len(data)} bytes, {len(model.graph.node)} nodes, "
              f"opset {model.opset_import[0].version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
