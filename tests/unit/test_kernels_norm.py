"""The LayerNorm / RMSNorm lowering candidates on the CPU: which configs apply (and why not), their
stable keys and kernel instances, and the plan's shape checks. The kernels themselves compile in
tests/unit/test_kernels_compile.py and run against the reference in tests/gpu/test_norm_gpu.py."""

from __future__ import annotations

import pytest

from graphopt.errors import TuningError
from graphopt.lowering.contract import Signature
from graphopt.kernels.norm import NormRows, norm_candidates, norm_kernel_instances, norm_plan
from graphopt.kernels.registry import all_kernel_instances, candidate_from_key, candidates_for


def _sig(d=768, rows=(2, 7), dtype="float32", op="LayerNorm", skip=True, **attrs):
    x = tuple(rows) + (d,)
    shapes = [x, (d,)] + ([(d,), x, (d,)] if op == "LayerNorm" and skip else [])
    return Signature.make(op, shapes, [dtype] * len(shapes), attrs)


def _applicable(sig):
    return [c.key() for c in candidates_for(sig) if c.applies(sig, (9, 0)) is None]


def test_one_candidate_per_cta_size_and_vector_width():
    assert _applicable(_sig(768)) == [
        "rows:warps=1,items=8,vec=4", "rows:warps=2,items=4,vec=4", "rows:warps=4,items=2,vec=4",
        "rows:warps=8,items=1,vec=4", "rows:warps=16,items=1,vec=4", "rows:warps=32,items=1,vec=4",
        "rows:warps=1,items=8,vec=4,rpc=4", "rows:warps=1,items=8,vec=4,rpc=8",
        "rows:warps=4,items=8,vec=1", "rows:warps=8,items=4,vec=1", "rows:warps=16,items=2,vec=1",
        "rows:warps=32,items=1,vec=1"]
    fp16 = _applicable(_sig(768, dtype="float16"))
    assert fp16[0] == "rows:warps=1,items=4,vec=8" and all(("vec=8" in k) or ("vec=1" in k) for k in fp16)
    assert "rows:warps=1,items=4,vec=8,rpc=8" in fp16


def test_odd_row_length_only_scalar_loads_and_too_long_rows_none():
    keys = _applicable(_sig(37))
    assert keys and all(",vec=1" in k for k in keys)
    assert _applicable(_sig(32 * 32 * 8 * 4 + 4)) == []
    reasons = {c.key(): c.applies(_sig(37), (9, 0)) for c in candidates_for(_sig(37))}
    assert reasons["rows:warps=1,items=1,vec=4"] == "row length 37 is not a multiple of vec=4"
    assert "hold 32 < 37 elements" in reasons["rows:warps=1,items=1,vec=1"]
    assert "already holds the row" in reasons["rows:warps=1,items=4,vec=1"]
    assert "vec=8 is neither 1 nor a 16-byte load of float32" in reasons["rows:warps=1,items=1,vec=8"]


@pytest.mark.parametrize("sig,reason", [
    (Signature.make("LayerNorm", [(2, 8), (4,)], ["float32"] * 2, {}), "scale must hold the 8 values"),
    (Signature.make("LayerNorm", [(2, 3, 8), (8,), None, (2, 1, 8)], ["float32"] * 4, {}), "must have X's shape"),
    (Signature.make("LayerNorm", [(2, 3, 8), (8,), None, (3, 4)], ["float32"] * 4, {}), "or a suffix of it"),
    (Signature.make("LayerNorm", [None, (8,)], ["float32"] * 2, {}), "needs a known, non-empty X shape"),
    (Signature.make("RMSNorm", [(2, 8), (8,)], ["float64"] * 2, {}), "dtype float64"),
    (Signature.make("GemmAct", [(2, 8), (8, 3)], ["float32"] * 2, {}), "is not one of LayerNorm, RMSNorm"),
])
def test_signatures_that_no_config_runs(sig, reason):
    cand = NormRows("rows", (("warps", 1), ("items", 1), ("vec", 1)))
    assert reason in cand.applies(sig, (9, 0))


def test_plan_reads_epsilon_and_mode():
    p = norm_plan(_sig(64, op="RMSNorm", epsilon=1e-3))
    assert (p.rows, p.D, p.mode, p.eps) == (14, 64, 1, 1e-3)
    assert norm_plan(_sig(64)).eps == 1e-5 and norm_plan(_sig(64, op="RMSNorm")).eps == 1e-6
    with pytest.raises(TuningError):
        norm_plan(Signature.make("LayerNorm", [(0, 8), (8,)], ["float32"] * 2, {}))


@pytest.mark.parametrize("skip,rows", [((2, 7, 64), 14), ((1, 7, 64), 7), ((7, 64), 7), ((1, 1, 64), 1), ((64,), 1)])
def test_skip_may_broadcast_over_leading_dims(skip, rows):
    """Position embeddings [1, S, D] added to [B, S, D] (GPT-2, BERT): the kernel cycles over skip's rows."""
    sig = Signature.make("LayerNorm", [(2, 7, 64), (64,), (64,), skip], ["float32"] * 4, {})
    assert norm_plan(sig).skip_rows == rows
    assert _applicable(sig)
    assert norm_plan(_sig(64, skip=False)).skip_rows == 0


@pytest.mark.parametrize("skip,rows", [((2, 7, 64), 14), ((1, 7, 64), 7)])
def test_skip_rmsnorm_takes_its_skip_from_input_2(skip, rows):
    """SkipRMSNorm's inputs are [X, scale, skip]: the same kernel (MODE 1) adds the skip and writes the sum."""
    sig = Signature.make("RMSNorm", [(2, 7, 64), (64,), skip], ["float32"] * 3, {"sum_output": 1})
    assert norm_plan(sig).skip_rows == rows and norm_plan(sig).mode == 1
    assert _applicable(sig)
    bad = Signature.make("RMSNorm", [(2, 7, 64), (64,), (3, 64)], ["float32"] * 3, {})
    assert "RMSNorm skip (3, 64) must have X's shape" in NormRows("rows", (("warps", 1), ("items", 2), ("vec", 4))).applies(bad)


def test_keys_round_trip_and_instances_are_registered():
    for cand in norm_candidates():
        assert candidate_from_key("RMSNorm", cand.key()) == cand
    sig = _sig(768, dtype="float16")
    cand = candidate_from_key("LayerNorm", "rows:warps=2,items=4,vec=8")
    assert cand.kernels(sig) == [("norm.cu", "norm_rows<half_t,8,2,4,0,1>")]
    assert cand.kernels(_sig(768, dtype="float16", op="RMSNorm")) == [("norm.cu", "norm_rows<half_t,8,2,4,1,1>")]
    per_warp = candidate_from_key("LayerNorm", "rows:warps=1,items=4,vec=8,rpc=8")
    assert per_warp.kernels(sig) == [("norm.cu", "norm_rows<half_t,8,1,4,0,8>")]
    every = set(all_kernel_instances())
    assert set(norm_kernel_instances()) <= every
    for c in candidates_for(sig):
        if c.applies(sig, (9, 0)) is None:
            assert set(c.kernels(sig)) <= every


def test_several_rows_per_cta_only_with_a_warp_per_row():
    """``rpc`` (rows per CTA) exists for warps=1 alone: the kernel's reductions then need no barrier,
    so warps of one CTA may work on different rows; keys without rpc keep their old spelling."""
    sig = _sig(768, dtype="float16")
    two_warps = NormRows("rows", (("warps", 2), ("items", 2), ("vec", 8), ("rpc", 4)))
    assert "needs a warp per row" in two_warps.applies(sig, (9, 0))
    assert NormRows("rows", (("warps", 1), ("items", 4), ("vec", 8), ("rpc", 4))).applies(sig, (9, 0)) is None
    assert all(c.param("rpc") is None or c.param("warps") == 1 for c in norm_candidates())
    assert "rows:warps=4,items=1,vec=8" in {c.key() for c in norm_candidates()}
