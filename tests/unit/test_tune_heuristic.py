"""The documented lowering heuristic (CPU)."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper, shape_inference

from graphopt.lowering.contract import Signature
from graphopt.tune.heuristic import conv_geometry, heuristic_lowering


def cbr(x, w, dtype="float16", **attrs):
    return Signature.make("CBR", [x, w, [w[0]] if w else None, None], [dtype, dtype, dtype, ""], attrs)


def params_dict(s: str) -> dict:
    return dict(kv.split("=") for kv in s.split(",")) if s else {}


P3 = dict(pads=[1, 1, 1, 1])

CASES = [
    # (x, w, attrs, expected lowering)
    ((1, 32, 112, 112), (32, 1, 3, 3), dict(group=32, **P3), "direct"),          # MobileNetV2 depthwise
    ((32, 144, 56, 56), (144, 1, 3, 3), dict(group=144, strides=[2, 2], **P3), "direct"),
    ((1, 128, 56, 56), (128, 4, 3, 3), dict(group=32, **P3), "direct"),          # ResNeXt: 4 out channels/group
    ((1, 256, 28, 28), (256, 32, 3, 3), dict(group=8, **P3), "implicit_gemm"),  # wide groups: tiles per group
    ((1, 64, 56, 56), (8, 64, 3, 3), P3, "direct"),                              # tiny output channels
    ((1, 3, 224, 224), (64, 3, 1, 1), {}, "direct"),                             # tiny reduction K=3
    ((32, 256, 56, 56), (64, 256, 1, 1), dict(strides=[1, 1]), "pointwise_gemm"),  # 1x1 stride 1
    ((32, 60, 56, 56), (64, 60, 1, 1), {}, "pointwise_gemm"),                  # 1x1, K=60: the tile handles tails
    ((1, 256, 14, 14), (1024, 256, 1, 1), {}, "cublas_ws"),                    # bs1 1x1: 196 pixels
    ((1, 256, 14, 14), (256, 256, 3, 3), P3, "cublas_ws"),                     # bs1 3x3: im2col + cuBLAS
    ((1, 64, 56, 56), (64, 64, 3, 3), P3, "implicit_gemm"),                    # 3136 pixels: tiles again
    ((32, 256, 56, 56), (512, 256, 1, 1), dict(strides=[2, 2]), "implicit_gemm"),  # 1x1 stride 2
    ((32, 3, 224, 224), (64, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]), "implicit_gemm"),  # stem
    ((32, 64, 56, 56), (64, 64, 3, 3), P3, "implicit_gemm"),
    ((1, 512, 7, 7), (512, 512, 3, 3), P3, "cublas_ws"),
    ((8, 512, 7, 7), (512, 512, 3, 3), P3, "cublas_ws"),                      # 392 pixels
    ((4, 64, 1000), (128, 64, 5), dict(pads=[2, 2]), "implicit_gemm"),          # 1-D
    ((4, 64, 1000), (128, 64, 1), {}, "pointwise_gemm"),
    ((2, 17, 33, 29), (24, 17, 3, 3), dict(dilations=[2, 2], pads=[2, 1, 2, 1]), "implicit_gemm"),  # odd sizes
]


@pytest.mark.parametrize("x, w, attrs, expected", CASES)
def test_cbr_choices(x, w, attrs, expected):
    """The own-kernel rules (``providers=False``: what the runtime takes where cuDNN is missing)."""
    name, params, reason = heuristic_lowering("CBR", cbr(x, w, **attrs), (9, 0), providers=False)
    assert name == expected, reason
    assert reason
    if name == "implicit_gemm":
        p = params_dict(params)
        assert list(p) == ["bm", "bn", "bk", "wm", "wn", "splitk"]
        assert p["bk"] == "32" and p["splitk"] == "1"
    elif name == "direct":
        assert params == "opt=1"
    elif name == "pointwise_gemm":
        assert params == "bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1,sepi=1"
    else:
        assert params == ""


@pytest.mark.parametrize("x, w, attrs, dtype, expected", [
    ((32, 64, 56, 56), (64, 64, 3, 3), P3, "float16", "cudnn"),            # dense fp16: cuDNN's fused graph
    ((1, 256, 14, 14), (1024, 256, 1, 1), {}, "float16", "cudnn"),         # bs1 too (2.3x torch, in a graph)
    ((32, 3, 224, 224), (64, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]), "bfloat16", "cudnn"),  # K=147
    ((32, 3, 224, 224), (32, 3, 3, 3), dict(strides=[2, 2], **P3), "float16", "implicit_gemm"),  # K=27: own
    ((32, 64, 56, 56), (64, 64, 3, 3), P3, "float32", "implicit_gemm"),    # fp32: own kernels
    ((1, 32, 112, 112), (32, 1, 3, 3), dict(group=32, **P3), "float16", "direct"),  # depthwise: own
    ((1, 256, 28, 28), (256, 32, 3, 3), dict(group=8, **P3), "float16", "implicit_gemm"),  # grouped: own
    ((2, 64, 9, 9), (64, 64, 3, 3), dict(activation="HardSwish", **P3), "float16", "cublas_ws"),  # composed in cuDNN: profiled only
])
def test_cudnn_rule(x, w, attrs, dtype, expected):
    name, params, reason = heuristic_lowering("CBR", cbr(x, w, dtype=dtype, **attrs), (9, 0))
    assert name == expected, reason
    if name == "cudnn":
        assert params == "" and "cuDNN" in reason
    assert heuristic_lowering("CBR", cbr(x, w, dtype=dtype, **attrs), (7, 5))[0] != "cudnn"


def test_norm_and_attention_rules_name_applicable_kernels():
    from graphopt.kernels.registry import candidate_from_key

    ln = Signature.make("LayerNorm", [(2, 128, 768), (768,), (768,), (2, 128, 768), None], ["float16"] * 4 + [""],
                        {"sum_output": 1})
    att = Signature.make("Attention", [(2, 12, 128, 64)] * 3 + [None], ["float16"] * 3 + [""], {"causal": 1})
    long = Signature.make("Attention", [(1, 8, 2048, 64)] * 3 + [None], ["float16"] * 3 + [""], {})
    for op, sig in (("LayerNorm", ln), ("RMSNorm", Signature.make("RMSNorm", [(3, 37), (37,)], ["float32"] * 2, {})),
                    ("Attention", att), ("Attention", long)):
        name, params, reason = heuristic_lowering(op, sig, (9, 0), providers=False)
        cand = candidate_from_key(op, f"{name}:{params}" if params else name)
        assert cand.applies(sig, (9, 0)) is None, (op, name, params)
    assert heuristic_lowering("Attention", att, (9, 0), providers=False)[0] == "cublas_softmax"
    assert heuristic_lowering("Attention", long, (9, 0), providers=False)[0] == "flash_mma"
    # with providers: cuDNN's SDPA where it applies, was measured (>= 128 keys, hd 64/128) and cc >= 8.0
    assert heuristic_lowering("Attention", att, (9, 0))[:2] == ("cudnn", "")
    assert heuristic_lowering("Attention", long, None)[:2] == ("cudnn", "")
    assert heuristic_lowering("Attention", att, (7, 5))[0] == "cublas_softmax"
    short = Signature.make("Attention", [(2, 12, 64, 64)] * 3 + [None], ["float16"] * 3 + [""], {})
    assert heuristic_lowering("Attention", short, (9, 0))[0] == "cublas_softmax"  # not measured below 128 keys
    f32 = Signature.make("Attention", [(2, 12, 128, 64)] * 3 + [None], ["float32"] * 3 + [""], {})
    assert heuristic_lowering("Attention", f32, (9, 0))[0] != "cudnn"
    # the short-row softmax, its lanes a row sized to fill the GPU (the H100's BERT-base fp32 choices)
    bert32 = Signature.make("Attention", [(32, 128, 3, 12, 64), None, None], ["float32", "", ""],
                            {"qkv_bshd": 1, "qkv_packed": 1})
    bert1 = Signature.make("Attention", [(1, 128, 3, 12, 64), None, None], ["float32", "", ""],
                           {"qkv_bshd": 1, "qkv_packed": 1})
    assert heuristic_lowering("Attention", bert32, (9, 0))[:2] == ("cublas_softmax", "lanes=8,vec=4")
    assert heuristic_lowering("Attention", bert1, (9, 0))[:2] == ("cublas_softmax", "lanes=32,vec=4")
    odd = Signature.make("Attention", [(2, 3, 5, 16), (2, 3, 7, 16), (2, 3, 7, 16)], ["float32"] * 3, {})
    assert heuristic_lowering("Attention", odd, (9, 0))[:2] == ("cublas_softmax", "lanes=8")  # 7 keys: no 16-byte loads
    bf16 = Signature.make("Attention", [(2, 12, 7, 40)] * 3 + [None], ["bfloat16"] * 3 + [""], {})
    assert heuristic_lowering("Attention", bf16, (9, 0))[0] == "cudnn"  # no own bf16 kernel
    # norms keep the own rows kernel (it beats torch); cuDNN's norm only competes when profiled
    assert heuristic_lowering("LayerNorm", ln, (9, 0))[0] == "rows"
    unknown = Signature.make("Attention", [None] * 4, [""] * 4, {})
    assert heuristic_lowering("Attention", unknown, (9, 0))[0] == "default"


def test_unknown_shapes_go_direct():
    sig = Signature.make("CBR", [None, (64, 64, 3, 3), None, None], ["float16"] * 2 + ["", ""], {})
    name, params, reason = heuristic_lowering("CBR", sig, (8, 0))
    assert (name, params) == ("direct", "opt=1") and "unknown" in reason


def test_tile_follows_channels_and_pixels():
    def tile(x, w):
        p = params_dict(heuristic_lowering("CBR", cbr(x, w, **P3), (9, 0), providers=False)[1])
        return int(p["bm"]), int(p["bn"]), int(p["wm"]), int(p["wn"])

    assert tile((32, 512, 7, 7), (512, 512, 3, 3)) == (128, 64, 2, 2)    # 1568 pixels
    assert tile((32, 128, 28, 28), (128, 128, 3, 3)) == (128, 128, 2, 4)
    assert tile((32, 64, 56, 56), (64, 64, 3, 3)) == (64, 128, 2, 2)     # 64 output channels
    assert tile((32, 64, 8, 8), (64, 64, 3, 3)) == (64, 64, 2, 2)


def test_compute_capability():
    s16 = cbr((32, 64, 56, 56), (64, 64, 3, 3), "float16", **P3)
    s32 = cbr((32, 64, 56, 56), (64, 64, 3, 3), "float32", **P3)
    assert heuristic_lowering("CBR", s16, None)[0] == "cudnn"  # unknown: treated as sm 8.0
    assert heuristic_lowering("CBR", s16, None, providers=False)[0] == "implicit_gemm"
    assert heuristic_lowering("CBR", s32, (8, 0))[0] == "implicit_gemm"  # tf32
    assert heuristic_lowering("CBR", s16, (7, 5))[0] == "cublas_ws"
    assert heuristic_lowering("CBR", s32, (7, 0))[0] == "cublas_ws"
    grouped = cbr((1, 256, 28, 28), (256, 32, 3, 3), group=8, **P3)
    assert heuristic_lowering("CBR", grouped, (7, 5))[:2] == ("direct", "opt=1")


def test_gemm_act_and_unknown_ops():
    sig = Signature.make("GemmAct", [(8, 768), (768, 3072), (3072,)], ["float16"] * 3, {"mode": "matmul"}, layout="rowmajor")
    assert heuristic_lowering("GemmAct", sig, (9, 0))[:2] == ("cublaslt", "")  # the bias in cuBLASLt's epilogue
    assert heuristic_lowering("GemmAct", sig, (9, 0), providers=False)[:2] == ("cublas_ws", "")
    assert heuristic_lowering("GemmAct", sig, (7, 5))[:2] == ("cublas_ws", "")
    plain = Signature.make("GemmAct", [(8, 768), (768, 3072), None], ["float16", "float16", ""], {"mode": "matmul"},
                           layout="rowmajor")
    assert heuristic_lowering("GemmAct", plain, (9, 0))[:2] == ("cublas_ws", "")  # no epilogue to fuse
    f32 = Signature.make("GemmAct", [(8, 768), (768, 3072), (3072,)], ["float32"] * 3, {"mode": "matmul"}, layout="rowmajor")
    assert heuristic_lowering("GemmAct", f32, (9, 0))[:2] == ("cublas_ws", "")
    gelu = Signature.make("GemmAct", [(8, 768), (768, 3072), (3072,)], ["float16"] * 3,
                          {"mode": "matmul", "activation": "Gelu"}, layout="rowmajor")
    assert heuristic_lowering("GemmAct", gelu, None)[:2] == ("cublas_ws", "")  # exact erf GELU: no cuBLASLt epilogue
    name, params, reason = heuristic_lowering("Unknown", Signature.make("Unknown", [], [], {}), (9, 0))
    assert (name, params) == ("default", "") and "Unknown" in reason


@pytest.mark.parametrize("h, k, s, d, p, auto_pad", [
    (17, 3, 2, 1, (1, 1), "NOTSET"), (17, 3, 1, 2, (2, 2), "NOTSET"), (16, 5, 2, 1, (0, 3), "NOTSET"),
    (17, 3, 2, 1, (0, 0), "SAME_UPPER"), (17, 4, 3, 1, (0, 0), "VALID"), (9, 1, 1, 1, (0, 0), "NOTSET"),
])
def test_conv_geometry_matches_onnx_shape_inference(h, k, s, d, p, auto_pad):
    """Output sizes agree with onnx shape inference (the reference for Conv's arithmetic)."""
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


def _kernels():
    try:
        from graphopt.kernels import cbr as kcbr

        return kcbr
    except Exception as exc:  # noqa: BLE001 - the kernels land separately
        pytest.skip(f"graphopt.kernels.cbr not importable: {exc}")


@pytest.mark.parametrize("x, w, attrs, expected", CASES)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_heuristic_choice_is_a_real_applicable_kernel_candidate(x, w, attrs, expected, dtype):
    """Contract with graphopt/kernels: the (lowering, params) written is a candidate key that applies."""
    kcbr = _kernels()
    sig = cbr(x, w, dtype, **attrs)
    for cc in [(8, 0), (9, 0), (7, 5)]:
        name, params, _ = heuristic_lowering("CBR", sig, cc, providers=False)
        key = f"{name}:{params}" if params else name
        cands = {c.key(): c for c in kcbr.cbr_candidates()}
        assert key in cands, f"{key} is not one of the kernels' candidates"
        assert cands[key].applies(sig, cc) is None, cands[key].applies(sig, cc)


@pytest.mark.parametrize("shapes, attrs", [
    ([(8, 768), (768, 3072), (3072,)], {"mode": "matmul", "activation": "Gelu"}),
    ([(2, 12, 128, 64), (2, 12, 64, 128), None], {"mode": "matmul", "activation": "none"}),
    ([(8, 768), (3072, 768), (3072,)], {"mode": "gemm", "transB": 1, "activation": "Relu"}),
    ([(4, 8, 768), (768, 3072), (3072,)], {"mode": "matmul", "activation": "GeluTanh"}),
])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_gemm_act_heuristic_choice_is_a_real_applicable_candidate(shapes, attrs, dtype):
    try:
        from graphopt.kernels.gemm_act import gemm_act_candidates
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"graphopt.kernels.gemm_act not importable: {exc}")
    dts = [dtype if s is not None else "" for s in shapes]
    sig = Signature.make("GemmAct", shapes, dts, attrs, layout="rowmajor")
    from graphopt.providers.cublaslt import shape_reason

    for providers in (True, False):
        name, params, _ = heuristic_lowering("GemmAct", sig, (9, 0), providers=providers)
        key = f"{name}:{params}" if params else name
        if name == "cublaslt":  # a vendor candidate: applies on a GPU with cuBLASLt; its own shape check here
            assert providers and shape_reason(sig) is None
            continue
        cands = {c.key(): c for c in gemm_act_candidates()}
        assert key in cands and cands[key].applies(sig, (9, 0)) is None, cands.get(key) and cands[key].applies(sig, (9, 0))


@pytest.mark.parametrize("x, w, attrs", [c[:3] for c in CASES])
def test_every_choice_is_a_real_candidate_that_applies(x, w, attrs):
    """The heuristic names a candidate the kernels have, and that candidate takes the signature."""
    from graphopt.kernels.registry import candidate_from_key

    from graphopt.providers.cudnn import conv_reason

    sig = cbr(x, w, **attrs)
    for providers in (False, True):
        name, params, _ = heuristic_lowering("CBR", sig, (9, 0), providers=providers)
        cand = candidate_from_key("CBR", f"{name}:{params}" if params else name)
        if name == "cudnn":  # a vendor candidate: applies on a GPU with cuDNN; its own shape check here
            assert conv_reason(sig) is None
        else:
            assert cand.applies(sig, (9, 0)) is None


def test_grouped_query_attention_heuristic():
    """kv_groups > 1 (K and V with H / g heads): cuDNN's SDPA reads the grouped heads where it applies;
    without providers, and in fp32, an own kernel after the head repeat (the choice applies)."""
    from graphopt.kernels.registry import candidate_from_key

    shapes = [(2, 32, 512, 128), (2, 8, 512, 128), (2, 8, 512, 128), None]
    for dtype, providers, want in (("float16", True, "cudnn"), ("float16", False, "flash_mma"),
                                   ("float32", True, None)):
        sig = Signature.make("Attention", shapes, [dtype] * 3 + [""], {"kv_groups": 4, "causal": 1})
        name, params, _ = heuristic_lowering("Attention", sig, (9, 0), providers=providers)
        assert want is None and name not in ("cudnn", "default") or name == want, (dtype, providers, name)
        if name != "cudnn":  # (cuDNN's applies() asks for the library, absent here)
            cand = candidate_from_key("Attention", f"{name}:{params}" if params else name)
            assert cand.applies(sig, (9, 0)) is None
