"""The cuBLASLt provider on the GPU: every algorithm its heuristic offers, for odd GEMM sizes, each
epilogue (DEFAULT, BIAS, RELU, RELU_BIAS, GELU, GELU_BIAS), fp16 / bf16 / fp32, transposes, strided
batches (both batched, B shared, A shared), 1x1 NHWC CBR and image stems through im2col, against the
float64 reference with NaN-poisoned outputs. And cuBLASLt matmuls captured into a CUDA graph on our
stream and replayed."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

from _provider_check import check_all, host_inputs, reference, replay_equals_eager, run_lowering  # noqa: E402

from graphopt.lowering import Signature, as_lowering  # noqa: E402
from graphopt.providers import cublaslt as prov  # noqa: E402

if prov.unavailable():
    pytest.skip(prov.unavailable(), allow_module_level=True)

EPILOGUES = [("none", False), ("none", True), ("Relu", False), ("Relu", True), ("GeluTanh", False), ("GeluTanh", True)]
SIZES = [(1, 768, 3072), (7, 129, 768), (129, 3072, 7), (768, 1, 129), (129, 7, 1), (3072, 768, 129), (768, 3072, 768)]


def gemm(a, b, c, dtype, **attrs):
    attrs.setdefault("mode", "matmul")
    return Signature.make("GemmAct", [a, b, c], [dtype, dtype, dtype if c is not None else ""], attrs, layout="rowmajor")


def _check(sig):
    cands = prov.candidates(sig.op, sig)
    assert cands[0].applies(sig, (9, 0)) is None, cands[0].applies(sig, (9, 0))
    ok, wrong, unbuilt = check_all(cands, sig)
    print(f"{sig.key()}: {len(cands) - 1} algorithms, {ok} candidates correct, {len(unbuilt)} did not build")
    assert not wrong, wrong
    assert ok >= 1, f"no candidate ran: {unbuilt[:3]}"
    return ok


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("act,bias", EPILOGUES, ids=[f"{a}{'_bias' if b else ''}" for a, b in EPILOGUES])
def test_every_epilogue_and_dtype(dtype, act, bias):
    sig = gemm((37, 200), (200, 72), (72,) if bias else None, dtype, activation=act)
    assert _check(sig) >= 2  # the heuristic's choice and at least one keyed algorithm


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("mnk", SIZES, ids=["x".join(map(str, s)) for s in SIZES])
def test_odd_sizes(mnk, dtype):
    M, N, K = mnk
    act = "GeluTanh" if M % 2 else "Relu"
    _check(gemm((M, K), (K, N), (N,), dtype, activation=act))


CASES = {
    "both_batched": ((3, 5, 7, 129), (3, 5, 129, 33), (33,), {}),
    "b_shared_folds": ((4, 129, 96), (96, 200), (200,), {"activation": "GeluTanh"}),
    "a_shared": ((33, 64), (4, 64, 129), None, {"activation": "Relu"}),
    "vector_b": ((5, 17, 32), (32,), None, {}),
    "vector_a": ((32,), (3, 32, 24), (24,), {}),
    "gemm_transA_transB": ((129, 37), (72, 129), (72,), {"mode": "gemm", "transA": 1, "transB": 1, "activation": "Relu"}),
    "gemm_transB_alpha_no_bias": ((50, 72), (88, 72), None, {"mode": "gemm", "transB": 1, "alpha": 0.5}),
    "gemm_row_bias_1xN": ((64, 96), (96, 40), (1, 40), {"mode": "gemm", "activation": "GeluTanh"}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("case", list(CASES))
def test_batches_transposes_and_vectors(case, dtype):
    a, b, c, attrs = CASES[case]
    _check(gemm(a, b, c, dtype, **attrs))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("x,w,bias,act", [
    ((2, 64, 14, 14), (256, 64, 1, 1), True, "Relu"),
    ((1, 24, 7, 9), (40, 24, 1, 1), True, "none"),
    ((3, 129, 5, 5), (7, 129, 1, 1), False, "Relu"),
    ((2, 32, 31), (48, 32, 1), True, "GeluTanh"),
])
def test_one_by_one_cbr_nhwc(x, w, bias, act, dtype):
    out = (x[0], w[0]) + tuple(x[2:])
    sig = Signature.make("CBR", [x, w, (w[0],) if bias else None, None], [dtype, dtype, dtype if bias else "", ""],
                         {"activation": act})
    assert out == tuple(reference(sig, host_inputs(sig)[0]).shape)
    _check(sig)


@pytest.mark.gpu
def test_a_matmul_captures_in_a_cuda_graph_and_replays():
    sig = gemm((256, 768), (768, 3072), (3072,), "float16", activation="GeluTanh")
    low = as_lowering(prov.CublasLtGemm("cublaslt").build(sig, "sm_90"))
    f64, up = host_inputs(sig, seed=3)
    ref = reference(sig, f64)
    assert run_lowering(low, sig, up, ref) is None  # eager first: descriptors and handle exist before capture
    out = replay_equals_eager(low, up, ref.shape)
    got = cupy.asnumpy(out).astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2


@pytest.mark.gpu
def test_one_by_one_cbr_node_with_three_inputs():
    """A CBR node without the residual slot: the output is still allocated NHWC (the declared layout)."""
    sig = Signature.make("CBR", [(2, 64, 7, 9), (96, 64, 1, 1), (96,)], ["float16"] * 3, {"activation": "Relu"})
    _check(sig)


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["none", "Relu", "GeluTanh"])
def test_two_nodes_of_one_signature_in_one_captured_graph(act):
    """The compiled runtime captures every node: two nodes with one signature and their own biases
    must each get their own bias in the replay (a tuned ResNet-50 with shared-signature 1x1 convs on
    cuBLASLt was 4.6e-2 from torch while every node passed its eager check)."""
    from _provider_check import captured_pair_errors

    sig = gemm((64, 256), (256, 128), (128,), "float16", activation=act)
    assert captured_pair_errors(prov.candidates(sig.op, sig), sig) == []
    cbr = Signature.make("CBR", [(4, 256, 7, 7), (64, 256, 1, 1), (64,)], ["float16"] * 3,
                         {"kernel_shape": [1, 1], "activation": "Relu"}, layout="NCHW")
    assert captured_pair_errors(prov.candidates(cbr.op, cbr), cbr) == []


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("bias", [False, True])
def test_b_transposed_variant_for_rows_of_odd_length(dtype, bias):
    """cublaslt_bt (B declared colmajor) where B's rows are not 16-byte multiples, as GPT-2's LM head
    (N = 50257): offered, correct against float64 with poisoned outputs, every algorithm."""
    sig = gemm((2, 65, 256), (256, 1001), (1001,) if bias else None, dtype, activation="Relu" if bias else "none")
    bt = [c for c in prov.candidates(sig.op, sig) if c.name == prov.NAME_BT]
    assert bt and bt[0].layouts(sig) == ("", "colmajor")
    ok, wrong, unbuilt = check_all(bt, sig)
    print(f"{sig.key()}: {len(bt)} cublaslt_bt candidates, {ok} correct, {len(unbuilt)} did not build")
    assert not wrong, wrong
    assert ok >= 1, f"no cublaslt_bt candidate ran: {unbuilt[:3]}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("act,bias", [("Gelu", True), ("SiLU", False), ("Sigmoid", True)])
def test_act_variant_for_activations_without_an_epilogue(dtype, act, bias):
    """cublaslt_act: BIAS / DEFAULT epilogue, then the 16-byte activation kernel in place; every
    algorithm against float64 with poisoned outputs (BERT's erf-GELU MLP shape included)."""
    for a, b in (((2, 65, 256), (256, 1024)), ((4, 128, 768), (768, 3072))):
        sig = gemm(a, b, (b[1],) if bias else None, dtype, activation=act)
        cands = [c for c in prov.candidates(sig.op, sig) if c.name == prov.NAME_ACT]
        assert cands, prov.CublasLtGemm(prov.NAME_ACT).applies(sig)
        ok, wrong, unbuilt = check_all(cands, sig)
        assert not wrong, wrong
        assert ok >= 1, f"no cublaslt_act candidate ran: {unbuilt[:3]}"


@pytest.mark.gpu
def test_act_variant_on_a_relu6_pointwise_conv():
    """MobileNetV2's 1x1 convs end in Clip(0, 6): cuBLASLt's matmul, then the clip kernel (NHWC)."""
    sig = Signature.make("CBR", [(2, 32, 14, 14), (96, 32, 1, 1), (96,), None], ["float16"] * 3 + [""],
                         {"activation": "Clip", "clip_min": 0.0, "clip_max": 6.0})
    cands = [c for c in prov.candidates(sig.op, sig) if c.name == prov.NAME_ACT]
    assert cands
    ok, wrong, unbuilt = check_all(cands, sig)
    assert not wrong and ok >= 1, (wrong, unbuilt[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [prov.NAME_PAD, prov.NAME_ROWPAD])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("case", ["shared_b", "shared_b_bias_relu", "transposed_b"])
def test_padded_output_variant_for_rows_of_odd_length(variant, dtype, case):
    """cublaslt_pad: Y computed with rows padded to 16 bytes in the workspace by two calls (the
    aligned rows, then the rest), then packed by one cudaMemcpy2DAsync (GPT-2's LM head, N = 50257);
    cublaslt_rowpad: the same calls straight into Y in its declared ``rowpad`` layout. Every
    algorithm against float64, output poisoned."""
    import cupy

    from graphopt.lowering import layout

    sig = {"shared_b": gemm((2, 65, 256), (256, 1001), None, dtype),
           "shared_b_bias_relu": gemm((2, 65, 256), (256, 1001), (1001,), dtype, activation="Relu"),
           "transposed_b": gemm((129, 256), (1001, 256), (1001,), dtype, mode="gemm", transB=1)}[case]
    cands = [c for c in prov.candidates(sig.op, sig) if c.name == variant]
    assert cands, prov.CublasLtGemm(variant).applies(sig)
    if variant == prov.NAME_ROWPAD:
        low = as_lowering(cands[0].build(sig, "sm_90"))
        y = low.empty_outputs(len(sig.input_shapes), [(129, 1001) if case == "transposed_b" else (2, 65, 1001)],
                              dtype, cupy)[0]
        assert layout.is_layout(y, "rowpad") and not y.flags.c_contiguous
    ok, wrong, unbuilt = check_all(cands, sig)
    print(f"{sig.key()}: {len(cands)} {variant} candidates, {ok} correct, {len(unbuilt)} did not build")
    assert not wrong, wrong
    assert ok >= 1, f"no {variant} candidate ran: {unbuilt[:3]}"


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [prov.NAME_PAD, prov.NAME_ROWPAD])
def test_padded_output_variant_captures_its_row_packing(variant):
    """Both calls (and pad's pitched copy) are captured: the replay equals the eager run."""
    sig = gemm((3, 128, 768), (768, 50257 // 7), None, "float16")  # N = 7179: odd rows, as the LM head's
    low = as_lowering(prov.CublasLtGemm(variant).build(sig, "sm_90"))
    f64, up = host_inputs(sig, seed=4)
    ref = reference(sig, f64)
    assert run_lowering(low, sig, up, ref) is None
    replay_equals_eager(low, up, ref.shape, poison_workspace=True)


IM2COL = {  # image stems, odd sizes: (X, W, attributes)
    "resnet_7x7_s2": ((2, 3, 37, 41), (64, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3], "activation": "Relu"}),
    "mobilenet_3x3_s2_relu6": ((3, 3, 29, 31), (32, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1],
                                                               "activation": "Clip", "clip_min": 0.0, "clip_max": 6.0}),
    "rgba_dilated_asym": ((2, 4, 23, 19), (24, 4, 3, 5), {"dilations": [2, 1], "pads": [1, 0, 2, 3]}),
    "one_d": ((3, 3, 101), (16, 3, 5), {"strides": [3], "pads": [2, 1], "activation": "GeluTanh"}),
    "no_bias_relu": ((2, 3, 33, 35), (16, 3, 5, 5), {"strides": [2, 2], "pads": [2, 2, 2, 2], "activation": "Relu",
                                                     "_no_bias": True}),
    "resnet_stem_224": ((2, 3, 224, 224), (64, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3], "activation": "Relu"}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("case", list(IM2COL))
def test_im2col_variant_for_image_stems(case, dtype):
    """cublaslt_im2col: im2col_rows packs X (NCHW) into K-padded GEMM rows and W likewise in the
    workspace, then cuBLASLt writes Y in NHWC with the epilogue (an activation without one runs
    after it): every algorithm against float64, outputs poisoned."""
    sig = _stem(case, dtype)
    cands = [c for c in prov.candidates(sig.op, sig) if c.name == prov.NAME_IM2COL]
    assert cands, prov.CublasLtGemm(prov.NAME_IM2COL).applies(sig)
    ok, wrong, unbuilt = check_all(cands, sig)
    print(f"{sig.key()}: {len(cands)} cublaslt_im2col candidates, {ok} correct, {len(unbuilt)} did not build")
    assert not wrong, wrong
    assert ok >= 1, f"no cublaslt_im2col candidate ran: {unbuilt[:3]}"


def _stem(case, dtype):
    x, w, attrs = IM2COL[case]
    attrs = dict(attrs)
    bias = not attrs.pop("_no_bias", False)
    return Signature.make("CBR", [x, w, (w[0],) if bias else None, None], [dtype, dtype, dtype if bias else "", ""],
                          attrs)


@pytest.mark.gpu
def test_im2col_variant_captures_its_packing():
    """The packing kernel and the matmul are captured; the replay equals the eager run with the
    workspace poisoned before it; two nodes of one signature in one captured graph keep their own
    biases and weights."""
    from _provider_check import captured_pair_errors

    sig = _stem("resnet_7x7_s2", "float16")
    assert captured_pair_errors([c for c in prov.candidates(sig.op, sig) if c.name == prov.NAME_IM2COL], sig) == []
    low = as_lowering(prov.CublasLtGemm(prov.NAME_IM2COL).build(sig, "sm_90"))
    f64, up = host_inputs(sig, seed=5)
    ref = reference(sig, f64)
    assert run_lowering(low, sig, up, ref) is None
    replay_equals_eager(low, up, ref.shape, poison_workspace=True)
