"""Own configurations that never came within 5% of the fastest are not profiled any more, but stay valid
lowerings (graphopt.kernels.earned)."""

from __future__ import annotations

from graphopt.kernels.cbr import cbr_candidates
from graphopt.kernels.earned import EARNED, EARNED_FP16, EARNED_FP32, MEASURED, earns_place
from graphopt.kernels.heuristic import heuristic_lowering
from graphopt.kernels.registry import candidate_from_key, candidates_for, signature_of


def _sig(dtype="float16"):
    return signature_of("CBR", [(32, 64, 56, 56), (64, 64, 3, 3), (64,), None], [dtype] * 3 + [""],
                        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1], "activation": "Relu"})


def test_every_earned_key_is_a_real_configuration():
    keys = {c.key() for c in cbr_candidates()}
    assert EARNED_FP16 <= keys and EARNED_FP32 <= keys


def test_tuning_offers_only_configurations_that_earned_their_place():
    offered = candidates_for(_sig())
    keys = {c.key() for c in offered}
    measured = [c for c in offered if c.name in MEASURED]
    assert measured and {c.key() for c in measured} <= EARNED["float16"]
    assert "implicit_gemm:bm=128,bn=128,bk=32,wm=2,wn=4,splitk=2" not in keys  # split-K never won
    assert "direct:opt=4" not in keys
    # fp16 measured the pipelined configurations too, against cuDNN and cuBLASLt: none came within 5%
    assert not any(c.param("st") is not None for c in offered)
    assert not any(c.name in ("pointwise_gemm", "implicit_gemm_nhwc") for c in offered)
    # not covered by the measurement: kept
    assert {"direct_k3:opt=4", "direct_k3:opt=8", "cublas_ws"} <= keys
    assert len(offered) < len(cbr_candidates())


def test_the_verdict_is_per_dtype():
    """fp32 was measured among our own kernels only: more of its configurations stay."""
    fp32 = {c.key() for c in candidates_for(_sig("float32")) if c.name in MEASURED}
    assert fp32 == {c.key() for c in cbr_candidates() if c.key() in EARNED_FP32}
    assert any(k.startswith("pointwise_gemm:") for k in fp32)
    assert len(fp32) > len(EARNED_FP16)


def test_a_dtype_without_a_measurement_keeps_every_configuration():
    cand = candidate_from_key("CBR", "pointwise_gemm:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1,st=3")
    assert earns_place(cand, "bfloat16") and not earns_place(cand, "float16")


def test_a_retired_configuration_is_still_a_valid_lowering():
    key = "implicit_gemm:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1"  # the heuristic's mid-size tile
    cand = candidate_from_key("CBR", key)
    assert cand.key() == key and not earns_place(cand, "float16") and not earns_place(cand, "float32")
    name, params, _ = heuristic_lowering("CBR", _sig(), (9, 0))
    assert candidate_from_key("CBR", f"{name}:{params}" if params else name)


def test_the_stems_pixels_per_thread_forms_are_retired_for_every_dtype_but_still_build():
    """px > 1 lost to px = 1 on every stem row the H100 measured (RETIRED); the tuner offers px = 1 only."""
    from graphopt.kernels.earned import RETIRED
    stem = signature_of("CBR", [(32, 3, 224, 224), (32, 3, 3, 3), (32,), None], ["float16"] * 3 + [""],
                        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2], "activation": "Clip"})
    offered = {c.key() for c in candidates_for(stem) if c.name == "stem"}
    assert offered == {f"stem:mv={m},y={y}" for m in (8, 16, 32) for y in ("nhwc", "nchw")}
    assert RETIRED and RETIRED <= {c.key() for c in cbr_candidates()}
    for key in RETIRED:
        cand = candidate_from_key("CBR", key)
        assert not earns_place(cand, "float16") and not earns_place(cand, "float32") and cand.applies(stem) is None
