"""Helpers to test graphopt ops (and rules that produce them) against onnxruntime and the references.

Kept in the package rather than under tests/ so rule tests elsewhere can use the same checks.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphopt.ops.functions import attach_functions

_NP_TO_ONNX = {np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.float64): onnx.TensorProto.DOUBLE,
               np.dtype(np.float16): onnx.TensorProto.FLOAT16, np.dtype(np.bool_): onnx.TensorProto.BOOL}


# (activation, its parameters): every activation, and the parameter variants that change the body.
ACT_SPECS = [
    ("none", {}),
    ("Relu", {}),
    ("Clip", {"clip_min": 0.0, "clip_max": 6.0}),
    ("Clip", {"clip_min": -0.5}),
    ("Clip", {"clip_max": 0.7}),
    ("Clip", {}),
    ("LeakyRelu", {}),
    ("LeakyRelu", {"act_alpha": 0.3}),
    ("Sigmoid", {}),
    ("SiLU", {}),
    ("HardSwish", {}),
    ("HardSigmoidMul", {}),
    ("HardSigmoidMul", {"act_alpha": 0.25, "act_beta": 0.4}),
    ("Gelu", {}),
    ("GeluTanh", {}),
]


def onnx_dtype(array: np.ndarray) -> int:
    """The TensorProto element type of a NumPy array (float16/32/64, bool)."""
    return _NP_TO_ONNX[np.asarray(array).dtype]


def one_node_model(op_type: str, inputs: Sequence[tuple[str, np.ndarray | None]], attrs: Mapping,
                   opset: int, out_shape: Sequence[int], out_dtype: int | None = None,
                   extra_outputs: Sequence[tuple[str, Sequence[int]]] = ()) -> onnx.ModelProto:
    """A model with one graphopt node; present inputs become graph inputs, then attach_functions.

    ``inputs`` is ``[(name, array or None)]`` in the op's input order (None = omitted). The
    output ``Y`` is declared with ``out_shape`` so the full checker compares it with the shape
    inferred through the function body; ``extra_outputs`` ``[(name, shape)]`` declares further
    outputs (LayerNorm's sum ``S``) with Y's element type.
    """
    names = [name if arr is not None else "" for name, arr in inputs]
    while names and names[-1] == "":
        names.pop()
    first = next(arr for _, arr in inputs if arr is not None)
    outs = [("Y", out_shape)] + list(extra_outputs)
    node = helper.make_node(op_type, names, [n for n, _ in outs], domain="graphopt", name=f"{op_type.lower()}_0",
                            **dict(attrs))
    graph = helper.make_graph(
        [node], f"{op_type}_test",
        [helper.make_tensor_value_info(n, onnx_dtype(a), list(a.shape)) for n, a in inputs if a is not None],
        [helper.make_tensor_value_info(n, out_dtype or onnx_dtype(first), list(shape)) for n, shape in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10,
                              producer_name="graphopt-tests")
    return attach_functions(model)


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``model`` on onnxruntime's CPU provider."""
    import onnxruntime as ort  # imported lazily: graphopt.ops itself does not need onnxruntime

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, dict(feeds))


def assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float = 1e-5, what: str = "") -> None:
    """``actual`` matches ``expected`` within ``rtol`` relative to the larger of |expected| and its max.

    An absolute floor of ``rtol * max|expected|`` keeps near-zero elements of a sum of many terms
    from failing on rounding alone; shapes and dtypes must match exactly.
    """
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != expected {expected.dtype}"
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    finite = np.abs(e[np.isfinite(e)])  # NaN (fully masked attention rows) must match position for position
    scale = float(finite.max()) if finite.size else 0.0
    np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * max(scale, 1e-30), err_msg=what)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def plain_activation(act: str, params: dict, x: str, opset: int, inits: list) -> tuple[list, str]:
    """Plain-ONNX nodes computing ``act(x)`` at ``opset``, written independently of graphopt's emitters.

    Returns (nodes, output name); scalar constants are appended to ``inits`` as float32
    initializers. Tests compare graphopt's function bodies with these unfused forms.
    """
    nodes: list = []

    def c(name, value):
        inits.append(_const(name, value))
        return name

    def clip(inp, out, lo, hi):
        if opset < 11:
            kw = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
            nodes.append(helper.make_node("Clip", [inp], [out], **kw))
        else:
            ins = [inp, c(out + "_lo", lo) if lo is not None else "", c(out + "_hi", hi) if hi is not None else ""]
            nodes.append(helper.make_node("Clip", ins, [out]))

    if act == "none":
        return nodes, x
    if act in ("Relu", "Sigmoid"):
        nodes.append(helper.make_node(act, [x], ["act"]))
    elif act == "Clip":
        clip(x, "act", params.get("clip_min"), params.get("clip_max"))
    elif act == "LeakyRelu":
        nodes.append(helper.make_node("LeakyRelu", [x], ["act"], **({"alpha": params["act_alpha"]} if params else {})))
    elif act == "SiLU":
        nodes += [helper.make_node("Sigmoid", [x], ["sig"]), helper.make_node("Mul", [x, "sig"], ["act"])]
    elif act == "HardSwish" and opset >= 14:
        nodes.append(helper.make_node("HardSwish", [x], ["act"]))
    elif act == "HardSwish":  # x * relu6(x + 3) / 6
        nodes.append(helper.make_node("Add", [x, c("three", 3.0)], ["xp3"]))
        clip("xp3", "r6", 0.0, 6.0)
        nodes += [helper.make_node("Mul", [x, "r6"], ["xr6"]), helper.make_node("Div", ["xr6", c("six", 6.0)], ["act"])]
    elif act == "HardSigmoidMul":
        kw = {"alpha": params["act_alpha"], "beta": params["act_beta"]} if params else {}
        nodes += [helper.make_node("HardSigmoid", [x], ["hs"], **kw), helper.make_node("Mul", [x, "hs"], ["act"])]
    elif act == "HardSigmoid":
        kw = {"alpha": params["act_alpha"], "beta": params["act_beta"]} if params else {}
        nodes.append(helper.make_node("HardSigmoid", [x], ["act"], **kw))
    elif act == "QuickGelu":
        nodes += [helper.make_node("Mul", [x, c("k", 1.702)], ["kx"]), helper.make_node("Sigmoid", ["kx"], ["sig"]),
                  helper.make_node("Mul", [x, "sig"], ["act"])]
    elif act in ("Gelu", "GeluTanh") and opset >= 20:
        nodes.append(helper.make_node("Gelu", [x], ["act"], approximate="none" if act == "Gelu" else "tanh"))
    elif act == "Gelu":
        nodes += [helper.make_node("Div", [x, c("sqrt2", math.sqrt(2.0))], ["xs"]),
                  helper.make_node("Erf", ["xs"], ["erf"]),
                  helper.make_node("Add", ["erf", c("one", 1.0)], ["erf1"]),
                  helper.make_node("Mul", [x, "erf1"], ["xe"]),
                  helper.make_node("Mul", ["xe", c("half", 0.5)], ["act"])]
    elif act == "GeluTanh":
        nodes += [helper.make_node("Pow", [x, c("three", 3.0)], ["x3"]),
                  helper.make_node("Mul", ["x3", c("k", 0.044715)], ["kx3"]),
                  helper.make_node("Add", [x, "kx3"], ["inner"]),
                  helper.make_node("Mul", ["inner", c("s2pi", math.sqrt(2.0 / math.pi))], ["targ"]),
                  helper.make_node("Tanh", ["targ"], ["th"]),
                  helper.make_node("Add", ["th", c("one", 1.0)], ["th1"]),
                  helper.make_node("Mul", [x, "th1"], ["xt"]),
                  helper.make_node("Mul", ["xt", c("half", 0.5)], ["act"])]
    else:  # pragma: no cover - a new activation needs its unfused form here
        raise AssertionError(f"no unfused form for {act}")
    return nodes, "act"
