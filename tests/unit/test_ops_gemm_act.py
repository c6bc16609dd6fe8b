"""graphopt.GemmAct: function body under onnxruntime == NumPy reference == unfused MatMul/Gemm graph."""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphopt.ops import get_schema
from graphopt.ops.testing import ACT_SPECS, assert_close, one_node_model, onnx_dtype, plain_activation, run

GEMM = get_schema("GemmAct")

# (id, A shape, B shape, C shape or None, attributes)
MATMUL_CASES = [
    ("mm_2d", (5, 7), (7, 3), (3,), {}),
    ("mm_batched_2d_b", (2, 5, 7), (7, 4), (4,), {}),
    ("mm_broadcast_batch", (2, 1, 5, 6), (3, 6, 4), (5, 4), {}),
    ("mm_vec_out", (1, 9), (9, 1), (1,), {}),
    ("mm_batched_c3d", (4, 6, 5), (4, 5, 3), (4, 1, 3), {}),
    ("mm_no_c", (3, 5, 8), (8, 7), None, {}),
]
GEMM_CASES = [
    ("gemm_plain", (5, 7), (7, 3), (3,), {}),
    ("gemm_transA", (7, 5), (7, 3), (5, 3), {"transA": 1}),
    ("gemm_transB_alpha_beta", (5, 7), (3, 7), (5, 1), {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    ("gemm_both_trans_scalar_c", (7, 5), (3, 7), (1,), {"transA": 1, "transB": 1, "beta": -0.75}),
    ("gemm_no_c", (6, 4), (4, 9), None, {"alpha": 1.5}),
    ("gemm_no_c_transB", (3, 8), (5, 8), None, {"transB": 1}),
]
OPSETS = [9, 11, 13, 17, 20]


def unfused_gemm(feeds: dict, mode: str, attrs: dict, act: str, params: dict, opset: int, out_shape,
                 elem: int) -> onnx.ModelProto:
    inits: list = []
    if mode == "matmul":
        nodes = [helper.make_node("MatMul", ["A", "B"], ["mm"])]
        y = "mm"
        if "C" in feeds:
            nodes.append(helper.make_node("Add", ["mm", "C"], ["mmc"]))
            y = "mmc"
    elif "C" in feeds:
        nodes, y = [helper.make_node("Gemm", ["A", "B", "C"], ["gemm"], **attrs)], "gemm"
    else:  # written without Gemm: (A' @ B') * alpha, so it does not share the body's zero-C trick
        nodes, a, b = [], "A", "B"
        if attrs.get("transA"):
            nodes.append(helper.make_node("Transpose", ["A"], ["At"], perm=[1, 0]))
            a = "At"
        if attrs.get("transB"):
            nodes.append(helper.make_node("Transpose", ["B"], ["Bt"], perm=[1, 0]))
            b = "Bt"
        nodes.append(helper.make_node("MatMul", [a, b], ["ab"]))
        inits.append(onnx.numpy_helper.from_array(np.asarray(attrs.get("alpha", 1.0), dtype=np.float32), "alpha"))
        nodes.append(helper.make_node("Mul", ["ab", "alpha"], ["gemm"]))
        y = "gemm"
    act_nodes, y = plain_activation(act, params, y, opset, inits)
    nodes += act_nodes + [helper.make_node("Identity", [y], ["Y"])]
    graph = helper.make_graph(
        nodes, "unfused", [helper.make_tensor_value_info(k, elem, v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info("Y", elem, list(out_shape))], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def check_gemm(case, mode, act, params, opset, dtype=np.float32, rtol=1e-5, compare_unfused=True) -> None:
    case_id, a_shape, b_shape, c_shape, gemm_attrs = case
    rng = np.random.default_rng(zlib.crc32(f"{case_id}/{act}/{opset}/{np.dtype(dtype).name}".encode()))
    feeds = {"A": rng.standard_normal(a_shape).astype(dtype), "B": rng.standard_normal(b_shape).astype(dtype)}
    if c_shape is not None:
        feeds["C"] = rng.standard_normal(c_shape).astype(dtype)
    attrs = dict(gemm_attrs, mode=mode, activation=act, **params)
    ordered = [(n, feeds.get(n)) for n in ("A", "B", "C")]
    ref = GEMM.reference([a for _, a in ordered], attrs)[0]
    model = one_node_model("GemmAct", ordered, attrs, opset, ref.shape)
    onnx.checker.check_model(model, full_check=True)
    fused = run(model, feeds)[0]
    assert_close(fused, ref, rtol, f"{case_id} {act} opset {opset}: function body vs NumPy reference")
    if compare_unfused:
        plain = run(unfused_gemm(feeds, mode, gemm_attrs, act, params, opset, ref.shape, onnx_dtype(ref)), feeds)[0]
        assert_close(fused, plain, rtol, f"{case_id} {act} opset {opset}: function body vs unfused ONNX")


def _cases():
    for i, (act, params) in enumerate(ACT_SPECS):
        for j, opset in enumerate(OPSETS):
            for mode, table in (("matmul", MATMUL_CASES), ("gemm", GEMM_CASES)):
                case = table[(i + 2 * j) % len(table)]
                pid = f"{mode}-{act}{'-' + '-'.join(sorted(params)) if params else ''}-o{opset}-{case[0]}"
                yield pytest.param(case, mode, act, params, opset, id=pid)


@pytest.mark.parametrize("case,mode,act,params,opset", list(_cases()))
def test_activation_modes_opsets(case, mode, act, params, opset):
    """Every activation variant x both modes x opsets 9..20, cycling shapes (with and without C)."""
    check_gemm(case, mode, act, params, opset)


@pytest.mark.parametrize("opset", [9, 11, 13, 17])
@pytest.mark.parametrize("case", MATMUL_CASES + GEMM_CASES, ids=[c[0] for c in MATMUL_CASES + GEMM_CASES])
def test_every_shape(case, opset):
    mode = "gemm" if case[0].startswith("gemm") else "matmul"
    check_gemm(case, mode, "Relu", {}, opset)


# onnxruntime's CPU provider has no float64 kernels for Clip-6, Selu or Erf, so float64 Clip is
# run from opset 12 on (where its bounds need no Selu) and erf-Gelu not at all; the bodies are
# still valid ONNX there (checked in test_float64_bodies_are_valid_everywhere).
FLOAT64_RUNNABLE = [("Clip", {"clip_min": -0.25, "clip_max": 0.5}, o) for o in (13, 17)] + [
    (act, {}, o) for act in ("GeluTanh", "SiLU", "Relu") for o in (9, 11, 13, 17)]


@pytest.mark.parametrize("act,params,opset", FLOAT64_RUNNABLE)
@pytest.mark.parametrize("case", [MATMUL_CASES[1], GEMM_CASES[4]], ids=["matmul", "gemm_no_c"])
def test_float64_bodies(case, act, params, opset):
    """float64 models: typed constants (dtype in the overload key) below opset 15, CastLike from 15."""
    mode = "gemm" if case[0].startswith("gemm") else "matmul"
    check_gemm(case, mode, act, params, opset, dtype=np.float64, rtol=1e-12, compare_unfused=False)


@pytest.mark.parametrize("opset", [9, 11, 13, 17])
@pytest.mark.parametrize("act", ["Clip", "Gelu", "GeluTanh"])
def test_float64_bodies_are_valid_everywhere(act, opset):
    params = {"clip_min": -0.25, "clip_max": 0.5} if act == "Clip" else {}
    a, b = np.ones((3, 4)), np.ones((4, 2))
    model = one_node_model("GemmAct", [("A", a), ("B", b), ("C", None)], dict(mode="gemm", activation=act, **params),
                           opset, (3, 2))
    onnx.checker.check_model(model, full_check=True)
    (node,) = model.graph.node
    assert node.overload.endswith("_f64") == (opset < 15)
    assert [f.overload for f in model.functions] == [node.overload]


def test_float64_overload_keys():
    present = [True, True, False]
    assert GEMM.overload({"activation": "Gelu"}, present, dtype=TensorProto.DOUBLE) == "matmul_gelu_f64"
    assert GEMM.overload({"activation": "Relu"}, present, dtype=TensorProto.DOUBLE) == "matmul_relu"
    assert GEMM.overload({"mode": "gemm", "activation": "Relu"}, present, dtype=TensorProto.DOUBLE) == "gemm_relu_f64"
    assert GEMM.overload({"mode": "gemm", "activation": "Relu"}, [True, True, True],
                         dtype=TensorProto.DOUBLE) == "gemm_relu_c"


def test_reference_rejects_bad_shapes():
    a, b = np.ones((3, 4), np.float32), np.ones((5, 2), np.float32)
    with pytest.raises(Exception, match="MatMul"):
        GEMM.reference([a, b], {})
    with pytest.raises(Exception, match="inner dims"):
        GEMM.reference([a, b], {"mode": "gemm"})
    with pytest.raises(Exception, match="broadcast"):
        GEMM.reference([a, np.ones((4, 2), np.float32), np.ones((3, 3), np.float32)], {"mode": "gemm"})
