"""graphopt.CBR: function body under onnxruntime == NumPy reference == unfused standard ONNX graph.

Every case builds a one-node graphopt.CBR model, attaches its function, runs the full checker
(which infers shapes through the body and compares them with the reference's output shape),
runs it in onnxruntime and compares it with (a) the float64 NumPy reference and (b) the same
computation written as plain Conv/Add/activation nodes, on fresh random inputs.
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphopt.ops import ACTIVATIONS, get_schema
from graphopt.ops.testing import ACT_SPECS, assert_close, one_node_model, plain_activation, run

CBR = get_schema("CBR")

# (id, X shape, W shape, Conv attributes)
CONV_CASES = [
    ("1d", (2, 3, 11), (4, 3, 3), {}),
    ("1d_s2_d2_asym", (1, 4, 13), (6, 4, 3), {"strides": [2], "dilations": [2], "pads": [1, 2]}),
    ("1d_same_lower", (1, 2, 10), (3, 2, 4), {"auto_pad": "SAME_LOWER", "strides": [3]}),
    ("2d_pad1", (1, 3, 7, 9), (5, 3, 3, 3), {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}),
    ("2d_s2", (2, 3, 9, 8), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 0, 0, 1]}),
    ("2d_dil2", (1, 2, 10, 9), (3, 2, 3, 3), {"dilations": [2, 2]}),
    ("2d_asym_pads", (1, 3, 6, 7), (4, 3, 3, 2), {"pads": [0, 2, 1, 0]}),
    ("2d_same_upper_s2", (1, 3, 9, 10), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ("2d_same_lower_s2", (1, 3, 8, 7), (4, 3, 4, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ("2d_valid", (1, 3, 8, 9), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": [1, 2]}),
    ("2d_notset", (1, 3, 5, 5), (2, 3, 2, 2), {"auto_pad": "NOTSET", "pads": [1, 0, 1, 0]}),
    ("2d_groups2", (1, 4, 7, 7), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ("2d_depthwise_s2", (2, 5, 9, 9), (5, 1, 3, 3), {"group": 5, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("2d_depthwise_mult2", (1, 3, 7, 8), (6, 1, 3, 3), {"group": 3, "pads": [0, 1, 2, 1]}),
    ("2d_1x1", (1, 8, 5, 5), (4, 8, 1, 1), {"kernel_shape": [1, 1]}),
    ("3d", (1, 2, 5, 6, 4), (3, 2, 3, 2, 3), {"pads": [1, 0, 1, 1, 0, 0], "strides": [1, 2, 1]}),
]

OPSETS = [9, 11, 13, 14, 17, 20]
BIAS_RESIDUAL = [(False, False), (True, False), (False, True), (True, True)]


def unfused_cbr(feeds: dict, conv_attrs: dict, act: str, params: dict, opset: int, out_shape) -> onnx.ModelProto:
    inits: list = []
    conv_in = ["X", "W"] + (["B"] if "B" in feeds else [])
    nodes = [helper.make_node("Conv", conv_in, ["conv"], **conv_attrs)]
    y = "conv"
    if "R" in feeds:
        nodes.append(helper.make_node("Add", ["conv", "R"], ["sum"]))
        y = "sum"
    act_nodes, y = plain_activation(act, params, y, opset, inits)
    nodes += act_nodes + [helper.make_node("Identity", [y], ["Y"])]
    graph = helper.make_graph(
        nodes, "unfused", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(out_shape))], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def make_inputs(seed: int, x_shape, w_shape, has_b: bool, has_r, out_shape) -> dict:
    """Fresh random inputs; ``has_r`` is False, "full" (the output's shape) or "channel" ([1, M, 1...])."""
    rng = np.random.default_rng(seed)
    feeds = {"X": rng.standard_normal(x_shape).astype(np.float32),
             "W": rng.standard_normal(w_shape).astype(np.float32)}
    if has_b:
        feeds["B"] = rng.standard_normal(w_shape[0]).astype(np.float32)
    if has_r:
        r_shape = out_shape if has_r == "full" else (1, w_shape[0]) + (1,) * (len(x_shape) - 2)
        feeds["R"] = rng.standard_normal(r_shape).astype(np.float32)
    return feeds


def check_cbr(case_id: str, x_shape, w_shape, conv_attrs, act, params, has_b, has_r, opset) -> None:
    seed = zlib.crc32(f"{case_id}/{opset}".encode())
    attrs = dict(conv_attrs, activation=act, **params)
    # The output shape comes from the reference on a probe input, then fresh inputs are drawn.
    probe = CBR.reference([np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32)], attrs)[0]
    feeds = make_inputs(seed, x_shape, w_shape, has_b, has_r, probe.shape)
    ordered = [(n, feeds.get(n)) for n in ("X", "W", "B", "R")]
    model = one_node_model("CBR", ordered, attrs, opset, probe.shape)
    onnx.checker.check_model(model, full_check=True)
    fused = run(model, feeds)[0]
    ref = CBR.reference([a for _, a in ordered], attrs)[0]
    assert_close(fused, ref, 1e-5, f"{case_id} opset {opset}: function body vs NumPy reference")
    plain = run(unfused_cbr(feeds, conv_attrs, act, params, opset, probe.shape), feeds)[0]
    assert_close(fused, plain, 1e-5, f"{case_id} opset {opset}: function body vs unfused ONNX")


@pytest.mark.parametrize("opset", [9, 11, 13, 17])
@pytest.mark.parametrize("case_id,x_shape,w_shape,conv_attrs", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_geometry(case_id, x_shape, w_shape, conv_attrs, opset):
    """Every Conv geometry, with bias and a full-shape residual, at several opsets."""
    act, params = ACT_SPECS[zlib.crc32(case_id.encode()) % len(ACT_SPECS)]
    check_cbr(case_id, x_shape, w_shape, conv_attrs, act, params, True, "full", opset)


def _act_cases():
    for i, (act, params) in enumerate(ACT_SPECS):
        for j, opset in enumerate(OPSETS):
            has_b, has_r = BIAS_RESIDUAL[(i + j) % len(BIAS_RESIDUAL)]
            conv = CONV_CASES[(3 * i + j) % len(CONV_CASES)]
            r = ("channel" if (i + j) % 2 else "full") if has_r else False
            pid = f"{act}{'-' + '-'.join(sorted(params)) if params else ''}-o{opset}-{'b' if has_b else 'nob'}-{r or 'nor'}"
            yield pytest.param(conv, act, params, has_b, r, opset, id=pid)


@pytest.mark.parametrize("conv,act,params,has_b,has_r,opset", list(_act_cases()))
def test_activation(conv, act, params, has_b, has_r, opset):
    """Every activation (and parameter variant) at opsets 9..20, cycling bias/residual and geometry."""
    case_id, x_shape, w_shape, conv_attrs = conv
    check_cbr(f"{act}/{case_id}", x_shape, w_shape, conv_attrs, act, params, has_b, has_r, opset)


@pytest.mark.parametrize("has_b,has_r", BIAS_RESIDUAL)
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_every_activation_bias_residual_opset13(act, has_b, has_r):
    """The full cross product of activation x bias x residual at one opset, on an odd 2-D conv."""
    params = {"clip_min": -1.0, "clip_max": 2.5} if act == "Clip" else {}
    check_cbr(f"x/{act}", (1, 3, 7, 5), (5, 3, 3, 3), {"pads": [1, 0, 0, 1], "strides": [2, 1]},
              act, params, has_b, "channel" if has_r else False, 13)


def test_reference_matches_direct_loops():
    """The im2col reference equals a plain per-output loop on a small grouped, strided, dilated case."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 7, 6))
    w = rng.standard_normal((6, 2, 2, 3))
    attrs = {"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 0, 2]}
    got = CBR.reference([x, w], attrs)[0]
    xp = np.pad(x, [(0, 0), (0, 0), (1, 0), (0, 2)])
    oh, ow = (xp.shape[2] - 2) // 2 + 1, (xp.shape[3] - 5) // 1 + 1
    want = np.zeros((2, 6, oh, ow))
    for n in range(2):  # deliberately naive: an independent check of the vectorised code
        for m in range(6):
            g = m // 3
            for i in range(oh):
                for j in range(ow):
                    patch = xp[n, 2 * g:2 * g + 2, 2 * i:2 * i + 2, j:j + 5:2]
                    want[n, m, i, j] = np.sum(patch * w[m])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert got.dtype == np.float64


# onnxruntime refuses dilations with SAME_* auto_pad, so these are checked against onnx's own
# reference Conv (a standard op: no function bodies involved).
REFERENCE_ONLY_CASES = CONV_CASES + [
    ("2d_same_upper_dil", (1, 2, 7, 6), (3, 2, 3, 2), {"auto_pad": "SAME_UPPER", "dilations": [2, 3]}),
    ("2d_same_lower_dil_s2", (1, 2, 9, 8), (3, 2, 2, 3), {"auto_pad": "SAME_LOWER", "dilations": [3, 2], "strides": [2, 2]}),
]


@pytest.mark.parametrize("case_id,x_shape,w_shape,conv_attrs", REFERENCE_ONLY_CASES,
                         ids=[c[0] for c in REFERENCE_ONLY_CASES])
def test_reference_conv_matches_onnx_reference_evaluator(case_id, x_shape, w_shape, conv_attrs):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(zlib.crc32(case_id.encode()))
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    node = helper.make_node("Conv", ["X", "W"], ["Y"], **conv_attrs)
    want = ReferenceEvaluator(node).run(None, {"X": x, "W": w})[0]
    got = CBR.reference([x, w], conv_attrs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_reference_returns_input_dtype_and_rejects_bad_shapes():
    x = np.ones((1, 4, 5, 5), np.float32)
    assert CBR.reference([x, np.ones((2, 4, 3, 3), np.float32)], {})[0].dtype == np.float32
    with pytest.raises(Exception, match="group"):
        CBR.reference([x, np.ones((2, 3, 3, 3), np.float32)], {"group": 1})
    with pytest.raises(Exception, match="kernel_shape"):
        CBR.reference([x, np.ones((2, 4, 3, 3), np.float32)], {"kernel_shape": [2, 2]})
    with pytest.raises(Exception, match="B has shape"):
        CBR.reference([x, np.ones((2, 4, 3, 3), np.float32), np.ones(3, np.float32)], {})


@pytest.mark.parametrize("opset", [11, 13, 17, 20])
@pytest.mark.parametrize("act,params", [("Gelu", {}), ("GeluTanh", {}), ("Clip", {"clip_min": 0.0, "clip_max": 6.0})])
def test_float16(act, params, opset):
    """float16 models: typed constants (``_f16`` key) below opset 15, CastLike from 15."""
    rng = np.random.default_rng(zlib.crc32(f"f16/{act}/{opset}".encode()))
    x = rng.standard_normal((1, 3, 6, 5)).astype(np.float16)
    w = (rng.standard_normal((4, 3, 3, 3)) / 3).astype(np.float16)
    b = rng.standard_normal(4).astype(np.float16)
    attrs = dict(activation=act, pads=[1, 1, 1, 1], **params)
    ref = CBR.reference([x, w, b], attrs)[0]
    model = one_node_model("CBR", [("X", x), ("W", w), ("B", b)], attrs, opset, ref.shape)
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.node[0].overload.endswith("_f16") == (opset < 15)
    assert_close(run(model, {"X": x, "W": w, "B": b})[0], ref, 4e-3, f"float16 {act} opset {opset}")
