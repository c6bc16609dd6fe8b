"""Small ONNX graphs for testing rules: the exported shapes each shipped rule is meant to catch.

``family_model(family, act, variant)`` builds, with ``onnx.helper``, the subgraph a rule family
matches (``conv``, ``conv_add``, ``conv_residual``, ``cbr``, ``matmul``, ``matmul_add``, ``gemm``,
``gemmact``) followed by the activation ``act`` written the way exporters write it, plus a
``variant`` that should make the rule refuse (a second consumer, an intermediate graph output,
a bias that is not per-channel, a non-constant bias). Sizes are odd on purpose.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Builder:
    """A tiny graph builder over onnx.helper with automatic, deterministic names."""

    def __init__(self, opset: int = 17, seed: int = 0):
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.outputs: list[str] = []
        self.n = 0

    def _name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def input(self, name: str, shape, elem: int = TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def const(self, value, hint: str = "c", dtype=np.float32) -> str:
        name = self._name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def rand(self, shape, hint: str = "w") -> str:
        return self.const(self.rng.standard_normal(shape).astype(np.float32) * 0.5, hint)

    def op(self, op_type: str, inputs, domain: str = "", **attrs) -> str:
        out = self._name(op_type.lower() + "_out")
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=self._name(op_type), domain=domain, **attrs))
        return out

    def output(self, name: str) -> None:
        self.outputs.append(name)

    def model(self) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in self.outputs]
        graph = helper.make_graph(self.nodes, "test", self.inputs, outs, self.inits)
        opsets = [helper.make_opsetid("", self.opset)]
        if any(n.domain == "graphopt" for n in self.nodes):
            opsets.append(helper.make_opsetid("graphopt", 1))
        model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
        # Give the outputs their inferred types (onnx.checker's full check wants output shapes).
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        for out in probe.graph.output:  # let inference type them (fp16 graphs too)
            out.type.tensor_type.elem_type = TensorProto.UNDEFINED
        if len(opsets) > 1:
            from graphopt.ops import attach_functions

            probe = attach_functions(probe)
        try:
            inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=True)
        except onnx.shape_inference.InferenceError:  # deliberately ill-shaped test graphs stay untyped
            return model
        types = {vi.name: vi.type for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
        for out in model.graph.output:
            if out.name in types and types[out.name].tensor_type.HasField("shape"):
                out.type.CopyFrom(types[out.name])
        return model


# ----------------------------------------------------------------------------------------------
# Activations as exporters write them

CONV_ACTS = ("relu", "sigmoid", "hardswish", "hardsigmoid", "leakyrelu", "clip", "silu", "hardsigmoid_mul", "quickgelu")
GEMM_ACTS = ("relu", "gelu", "silu", "sigmoid", "hardswish", "hardsigmoid", "leakyrelu", "clip", "hardsigmoid_mul",
             "quickgelu", "gelu_erf_a_div", "gelu_erf_a_mul", "gelu_erf_b_div", "gelu_erf_b_mul",
             "gelu_erf_c_div", "gelu_erf_c_mul", "gelu_tanh_pow", "gelu_tanh_cube")

SQRT2 = 1.4142135623730951


def act_nodes(b: Builder, act: str, y: str) -> str:
    """Emit the nodes of activation ``act`` reading ``y``; return the output tensor."""
    if act in ("relu", "sigmoid", "hardswish"):
        return b.op({"relu": "Relu", "sigmoid": "Sigmoid", "hardswish": "HardSwish"}[act], [y])
    if act == "leakyrelu":
        return b.op("LeakyRelu", [y], alpha=0.2)
    if act == "clip":
        if b.opset < 11:
            return b.op("Clip", [y], min=0.0, max=6.0)
        return b.op("Clip", [y, b.const(0.0, "lo"), b.const(6.0, "hi")])
    if act == "silu":
        return b.op("Mul", [b.op("Sigmoid", [y]), y])  # gate first: exercises commutative matching
    if act == "hardsigmoid_mul":
        return b.op("Mul", [y, b.op("HardSigmoid", [y], alpha=1.0 / 6.0, beta=0.5)])
    if act == "hardsigmoid":  # MobileNetV3's squeeze-excitation gate (torch's hardsigmoid: 1/6, 0.5)
        return b.op("HardSigmoid", [y], alpha=1.0 / 6.0, beta=0.5)
    if act == "quickgelu":  # CLIP: x * sigmoid(1.702 x)
        return b.op("Mul", [y, b.op("Sigmoid", [b.op("Mul", [y, b.const(1.702, "k")])])])
    if act == "gelu":
        return b.op("Gelu", [y])
    if act == "gelu_tanh":
        return b.op("Gelu", [y], approximate="tanh")
    if act == "gelu_tanh_pow":  # Hugging Face NewGELU
        cube = b.op("Pow", [y, b.const(3.0, "three")])
        inner = b.op("Mul", [b.op("Add", [y, b.op("Mul", [cube, b.const(0.044715, "kappa")])]), b.const(0.7978845608, "beta")])
        return b.op("Mul", [b.op("Mul", [y, b.const(0.5, "half")]), b.op("Add", [b.op("Tanh", [inner]), b.const(1.0, "one")])])
    if act == "gelu_tanh_cube":  # torch.onnx F.gelu(approximate="tanh") below opset 20
        cube = b.op("Mul", [y, b.op("Mul", [y, y])])
        inner = b.op("Mul", [b.const(0.7978845608, "beta"), b.op("Add", [y, b.op("Mul", [b.const(0.044715, "kappa"), cube])])])
        return b.op("Mul", [b.const(0.5, "half"), b.op("Mul", [y, b.op("Add", [b.const(1.0, "one"), b.op("Tanh", [inner])])])])
    if act.startswith("gelu_erf_"):
        form, scale = act.split("_")[2:]
        inner = b.op("Div", [y, b.const(SQRT2, "sqrt2")]) if scale == "div" else b.op("Mul", [b.const(1 / SQRT2, "isqrt2"), y])
        erf = b.op("Erf", [inner])
        if form == "a":  # torch.onnx (TorchScript): (x * (erf + 1)) * 0.5
            return b.op("Mul", [b.op("Mul", [y, b.op("Add", [erf, b.const(1.0, "one")])]), b.const(0.5, "half")])
        if form == "b":  # x * 0.5 * (1 + erf)
            return b.op("Mul", [b.op("Mul", [b.const(0.5, "half"), y]), b.op("Add", [b.const(1.0, "one"), erf])])
        # x * (0.5 * (1 + erf))
        return b.op("Mul", [y, b.op("Mul", [b.op("Add", [erf, b.const(1.0, "one")]), b.const(0.5, "half")])])
    raise ValueError(f"unknown test activation {act!r}")


# ----------------------------------------------------------------------------------------------
# Rule families

CONV_FAMILIES = ("conv", "conv_add", "conv_residual", "cbr", "bn")
GEMM_FAMILIES = ("matmul", "matmul_add", "gemm", "gemm_reshape", "gemmact")

VARIANTS = ("fires", "second_consumer", "graph_output", "bias_not_per_channel", "bias_not_constant")


def _producer(b: Builder, family: str, variant: str) -> tuple[str, str]:
    """(the value the activation reads, i.e. ``y`` of the rules; the first intermediate before it)."""
    m = 5  # conv output channels / matmul output features
    if family in CONV_FAMILIES:
        x = b.input("x", [2, 3, 7, 9])
        if family == "bn":  # a standalone inference BatchNormalization (DenseNet's pre-activation)
            var = b.const(b.rng.random(3) + 0.5, "var")
            bn = b.op("BatchNormalization", [x, b.rand([3], "scale"), b.rand([3], "bias"), b.rand([3], "mean"), var],
                      epsilon=1e-3)
            return bn, bn
        w, bias = b.rand([m, 3, 3, 3]), b.rand([m], "b")
        if family == "cbr":
            y = b.op("CBR", [x, w, bias], domain="graphopt", pads=[1, 1, 1, 1], activation="none")
            return y, y
        conv = b.op("Conv", [x, w, bias], pads=[1, 1, 1, 1], strides=[1, 1])
        if family == "conv":
            return conv, conv
        if family == "conv_add":
            if variant == "bias_not_constant":
                c = b.input("c", [1, m, 1, 1])
            elif variant == "bias_not_per_channel":
                c = b.rand([1, 1, 7, 9], "c")
            else:
                c = b.rand([1, m, 1, 1], "c")
            return b.op("Add", [c, conv]), conv  # constant first: exercises commutative matching
        r = b.input("r", [2, m, 7, 9])
        return b.op("Add", [r, conv]), conv
    a = b.input("a", [2, 3, 6])
    if family in ("gemm", "gemm_reshape"):
        a2 = b.input("a2", [3, 6])
        y = b.op("Gemm", [a2, b.rand([m, 6]), b.rand([m], "c")], transB=1, alpha=0.5)
        if family == "gemm_reshape":
            return b.op("Reshape", [y, b.const([1, 3, m], "shape", np.int64)]), y
        return y, y
    w = b.rand([6, m])
    if family == "gemmact":
        y = b.op("GemmAct", [a, w, b.rand([m], "c")], domain="graphopt", mode="matmul", activation="none")
        return y, y
    mm = b.op("MatMul", [a, w])
    if family == "matmul":
        return mm, mm
    if variant == "bias_not_constant":
        c = b.input("c", [m])
    elif variant == "bias_not_per_channel":
        c = b.rand([3, m], "c")
    else:
        c = b.rand([m], "c")
    return b.op("Add", [mm, c]), mm


def family_model(family: str, act: str | None, variant: str = "fires", opset: int | None = None) -> onnx.ModelProto:
    """The model a rule ``<family>_<act>`` fires on (``act=None``: the family alone, no activation)."""
    if opset is None:
        opset = 20 if act in ("gelu", "gelu_tanh") else 17  # native Gelu needs opset 20
    b = Builder(opset)
    y, inner = _producer(b, family, variant)
    out = act_nodes(b, act, y) if act else y
    b.output(out)
    shared = y if act else inner  # the intermediate right before the rule's root
    if variant == "second_consumer":
        b.output(b.op("Neg", [shared]))
    elif variant == "graph_output":
        b.output(shared)
    return b.model()


def random_feeds(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        dtype = np.float16 if vi.type.tensor_type.elem_type == TensorProto.FLOAT16 else np.float32
        feeds[vi.name] = (rng.standard_normal(shape) * 2.0).astype(dtype)
    return feeds


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """Run on onnxruntime's CPU provider (graphopt function bodies attached first)."""
    import onnxruntime as ort

    from graphopt.ops import attach_functions

    m = onnx.ModelProto()
    m.CopyFrom(model)
    m = attach_functions(m)  # idempotent; also finds graphopt nodes inside subgraphs
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def rewrite_inferred(model: onnx.ModelProto, rules, explain: bool = False):
    """``(graph, report)``: ``rules`` applied to a copy of ``model`` with onnx's inferred shapes (graphopt
    function bodies attached first, so shapes flow through graphopt nodes), as the optimize pipeline sees
    it; the graph is linted. ``model`` is not modified."""
    from graphopt.ir import from_model
    from graphopt.ops import attach_functions
    from graphopt.rewrite import apply_rules

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = from_model(onnx.shape_inference.infer_shapes(attach_functions(m)))
    report = apply_rules(g, rules, explain=explain)
    g.lint()
    return g, report
