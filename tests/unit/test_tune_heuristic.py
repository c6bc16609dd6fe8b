"""The documented lowering heuristic (CPU)."""

from __future__ import annotations

import pytest

from graphopt.kernels.base import Signature
from graphopt.tune.heuristic import conv_geometry, heuristic_lowering


def cbr(x, w, dtype="float16", **attrs):
    return Signature.make("CBR", [x, w, [w[0]] if w else None, None], [dtype, dtype, dtype, ""], attrs)


def params_dict(s: str) -> dict:
    return dict(kv.split("=") for kv in s.split(",")) if s else {}


@pytest.mark.parametrize("x, w, attrs, expected", [
    # depthwise (MobileNetV2 3x3 dw)
    ((1, 32, 112, 112), (32, 1, 3, 3), dict(group=32, pads=[1, 1, 1, 1]), "direct"),
    # grouped (ResNeXt style)
    ((1, 128, 56, 56), (128, 4, 3, 3), dict(group=32, pads=[1, 1, 1, 1]), "direct"),
    # tiny output channels
    ((1, 64, 56, 56), (8, 64, 3, 3), dict(pads=[1, 1, 1, 1]), "direct"),
    # tiny reduction (1x1 with 3 input channels)
    ((1, 3, 224, 224), (64, 3, 1, 1), {}, "direct"),
    # 1x1 stride 1 -> cuBLAS
    ((32, 256, 56, 56), (64, 256, 1, 1), dict(strides=[1, 1]), "gemm_cublas"),
    # 1x1 stride 2 is not a plain GEMM
    ((32, 256, 56, 56), (512, 256, 1, 1), dict(strides=[2, 2]), "implicit_gemm"),
    # ResNet stem 7x7 s2 (K = 3*49 = 147)
    ((32, 3, 224, 224), (64, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]), "implicit_gemm"),
    # 3x3
    ((32, 64, 56, 56), (64, 64, 3, 3), dict(pads=[1, 1, 1, 1]), "implicit_gemm"),
    # 1-D conv
    ((4, 64, 1000), (128, 64, 5), dict(pads=[2, 2]), "implicit_gemm"),
    ((4, 64, 1000), (128, 64, 1), {}, "gemm_cublas"),
])
def test_cbr_choices(x, w, attrs, expected):
    name, params, reason = heuristic_lowering("CBR", cbr(x, w, **attrs), (9, 0))
    assert name == expected, reason
    assert reason
    if name == "implicit_gemm":
        p = params_dict(params)
        assert set(p) == {"bm", "bn", "bk", "stages"}
    else:
        assert params == ""


def test_unknown_shapes_go_direct():
    sig = Signature.make("CBR", [None, (64, 64, 3, 3), None, None], ["float16"] * 2 + ["", ""], {})
    name, _, reason = heuristic_lowering("CBR", sig, (8, 0))
    assert name == "direct" and "unknown" in reason


def test_tile_grows_with_problem_size():
    small = params_dict(heuristic_lowering("CBR", cbr((1, 512, 7, 7), (512, 512, 3, 3), pads=[1] * 4), (9, 0))[1])
    large = params_dict(heuristic_lowering("CBR", cbr((32, 128, 28, 28), (128, 128, 3, 3), pads=[1] * 4), (9, 0))[1])
    narrow = params_dict(heuristic_lowering("CBR", cbr((32, 64, 56, 56), (64, 64, 3, 3), pads=[1] * 4), (9, 0))[1])
    assert (small["bm"], small["bn"]) == ("64", "64")  # M = 49 pixels at batch 1
    assert (large["bm"], large["bn"]) == ("128", "128")
    assert (narrow["bm"], narrow["bn"]) == ("128", "64")  # N = 64 output channels


def test_dtype_and_arch_change_params():
    s16 = cbr((32, 64, 56, 56), (64, 64, 3, 3), "float16", pads=[1] * 4)
    s32 = cbr((32, 64, 56, 56), (64, 64, 3, 3), "float32", pads=[1] * 4)
    assert params_dict(heuristic_lowering("CBR", s16, (9, 0))[1])["bk"] == "32"
    assert params_dict(heuristic_lowering("CBR", s32, (9, 0))[1])["bk"] == "16"
    assert params_dict(heuristic_lowering("CBR", s16, (7, 5))[1])["stages"] == "2"
    assert params_dict(heuristic_lowering("CBR", s16, None)[1])["stages"] == "3"
    # fp32 without tf32 (sm 7.5) and anything without tensor cores -> im2col + cuBLAS
    assert heuristic_lowering("CBR", s32, (7, 5))[0] == "gemm_cublas"
    assert heuristic_lowering("CBR", s16, (6, 1))[0] == "gemm_cublas"


def test_gemm_act_and_unknown_ops():
    sig = Signature.make("GemmAct", [(8, 768), (768, 3072), (3072,)], ["float16"] * 3, {"mode": "matmul"}, layout="rowmajor")
    assert heuristic_lowering("GemmAct", sig, (9, 0))[0] == "cublas_epilogue"
    name, params, reason = heuristic_lowering("Attention", Signature.make("Attention", [], [], {}), (9, 0))
    assert (name, params) == ("default", "") and "Attention" in reason


@pytest.mark.parametrize("h, k, s, d, p, auto_pad", [
    (17, 3, 2, 1, (1, 1), "NOTSET"), (17, 3, 1, 2, (2, 2), "NOTSET"), (16, 5, 2, 1, (0, 3), "NOTSET"),
    (17, 3, 2, 1, (0, 0), "SAME_UPPER"), (17, 4, 3, 1, (0, 0), "VALID"), (9, 1, 1, 1, (0, 0), "NOTSET"),
])
def test_conv_geometry_matches_onnxruntime_output_shape(h, k, s, d, p, auto_pad):
    """Output sizes agree with onnx shape inference (the reference for Conv's arithmetic)."""
    from onnx import TensorProto, helper, shape_inference

    attrs = dict(kernel_shape=[k, k], strides=[s, s], dilations=[d, d])
    if auto_pad == "NOTSET":
        attrs["pads"] = [p[0], p[0], p[1], p[1]]
    else:
        attrs["auto_pad"] = auto_pad
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, h, h + 3]),
                                          helper.make_tensor_value_info("w", TensorProto.FLOAT, [16, 8, k, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    inferred = shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    dims = [dd.dim_value for dd in inferred.graph.output[0].type.tensor_type.shape.dim]
    geo = conv_geometry(Signature.make("CBR", [(2, 8, h, h + 3), (16, 8, k, k)], ["float32"] * 2, attrs))
    assert [2, 16] + geo["out"] == dims
    assert geo["gemm_m"] == 2 * dims[2] * dims[3] and geo["gemm_k"] == 8 * k * k
