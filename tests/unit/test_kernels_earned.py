"""Own configurations that never came within 5% of the fastest are not profiled any more, but stay valid
lowerings (graphopt.kernels.earned)."""

from __future__ import annotations

from graphopt.kernels.cbr import cbr_candidates
from graphopt.kernels.earned import EARNED, MEASURED, earns_place
from graphopt.kernels.heuristic import heuristic_lowering
from graphopt.kernels.registry import candidate_from_key, candidates_for, signature_of


def _sig():
    return signature_of("CBR", [(32, 64, 56, 56), (64, 64, 3, 3), (64,), None], ["float16"] * 3 + [""],
                        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1], "activation": "Relu"})


def test_every_earned_key_is_a_real_configuration():
    keys = {c.key() for c in cbr_candidates()}
    assert EARNED <= keys


def test_tuning_offers_only_configurations_that_earned_their_place():
    offered = candidates_for(_sig())
    keys = {c.key() for c in offered}
    measured = [c for c in offered if c.name in MEASURED and c.param("st") is None]
    assert measured and {c.key() for c in measured} <= EARNED
    assert "implicit_gemm:bm=128,bn=128,bk=32,wm=2,wn=4,splitk=2" not in keys  # split-K never won
    assert "direct:opt=4" not in keys
    # not covered by the measurement: kept
    assert any(c.param("st") is not None for c in offered)  # the pipelined configs
    assert {"direct_k3:opt=4", "direct_k3:opt=8"} <= keys
    assert len(offered) < len(cbr_candidates())


def test_a_retired_configuration_is_still_a_valid_lowering():
    key = "implicit_gemm:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1"  # the heuristic's mid-size tile
    cand = candidate_from_key("CBR", key)
    assert cand.key() == key and not earns_place(cand)
    name, params, _ = heuristic_lowering("CBR", _sig(), (9, 0))
    assert candidate_from_key("CBR", f"{name}:{params}" if params else name)
