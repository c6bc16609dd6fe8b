"""The RoPE, GroupNorm and GatedMLP lowerings on the CPU: plans, applies, keys, kernel instances,
heuristic choices, and the schema-drawn check inputs (the GPU runs are tests/gpu/test_new_op_kernels.py)."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt.kernels import check
from graphopt.kernels.gated_mlp import glu_plan
from graphopt.kernels.group_norm import group_norm_plan
from graphopt.kernels.heuristic import heuristic_lowering
from graphopt.kernels.registry import all_kernel_instances, applicable, candidate_from_key, candidates_for, signature_of
from graphopt.kernels.rope import rope_plan
from graphopt.kernels.source import ACT_CODES, PRELUDE, KERNEL_DIR
from graphopt.ops import get_schema
from graphopt.ops.activations import ACTIVATIONS


def _sig(op, shapes, dtype="float16", **attrs):
    return signature_of(op, shapes, [dtype] * len(shapes), attrs)


def test_rope_plan_broadcast_strides():
    p = rope_plan(_sig("RoPE", [(2, 3, 5, 8), (1, 1, 5, 8), (2, 1, 5, 8)], interleaved=1))
    # leading dims, cos strides (broadcast: 0), sin strides, X's row strides, last-axis strides
    assert p.meta == (2, 3, 5, 0, 0, 8, 40, 0, 8, 120, 40, 8, 1, 1) and p.pairs == 2 * 3 * 5 * 4 and p.interleaved == 1
    assert rope_plan(_sig("RoPE", [(4, 7, 6), (7, 6), (7, 6)])).meta == (4, 7, 0, 6, 0, 6, 42, 6, 1, 1)
    assert rope_plan(_sig("RoPE", [(6,), (6,), (6,)])).meta == (1, 1)
    # x_bshd: X [B, S, H, D] = [2, 5, 3, 8] read for Y [2, 3, 5, 8]; Y's row (b, h, s) is X's b * 120 + h * 8 + s * 24
    t = rope_plan(_sig("RoPE", [(2, 5, 3, 8), (1, 1, 5, 8), (1, 1, 5, 8)], x_bshd=1))
    assert t.shape == (2, 3, 5, 8) and t.x_shape == (2, 5, 3, 8) and t.meta[9:12] == (120, 8, 24)


def _emulate_rope(p, x, cos, sin):
    """rope.cu's index arithmetic on the host (the scalar kernel; rope_vec reads the same rows):
    which X row, cos and sin elements each Y element reads, from the plan's meta alone."""
    nlead = len(p.shape) - 1
    meta = p.meta
    X, C, S = x.reshape(-1), cos.reshape(-1), sin.reshape(-1)
    Y = np.full(int(np.prod(p.shape)), np.nan)
    half, cl, sl = p.D // 2, meta[4 * nlead], meta[4 * nlead + 1]
    for row in range(int(np.prod(p.shape[:-1]))):
        r, co, so, xo = row, 0, 0, 0
        for k in range(nlead - 1, -1, -1):
            r, idx = divmod(r, meta[k])
            co, so, xo = co + idx * meta[nlead + k], so + idx * meta[2 * nlead + k], xo + idx * meta[3 * nlead + k]
        for i in range(half):
            lo, hi = (2 * i, 2 * i + 1) if p.interleaved else (i, i + half)
            Y[row * p.D + lo] = X[xo + lo] * C[co + lo * cl] - X[xo + hi] * S[so + lo * sl]
            Y[row * p.D + hi] = X[xo + hi] * C[co + hi * cl] + X[xo + lo] * S[so + hi * sl]
    return Y.reshape(p.shape)


@pytest.mark.parametrize("x_bshd", [0, 1])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("tables", [(1, 1, 5, 8), (2, 1, 5, 8), (5, 8)])
def test_rope_plan_reads_what_the_reference_rotates(tables, interleaved, x_bshd):
    """The plan's meta, read as the kernel reads it, gives the op's reference: X's rows found where they lie
    ([B, S, H, D] for x_bshd=1), cos and sin broadcast to Y."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 3, 8) if x_bshd else (2, 3, 5, 8))
    cos, sin = rng.standard_normal(tables), rng.standard_normal(tables)
    attrs = {"interleaved": interleaved, "x_bshd": x_bshd}
    p = rope_plan(_sig("RoPE", [x.shape, tables, tables], "float32", **attrs))
    (ref,) = get_schema("RoPE").reference([x, cos, sin], attrs)
    assert ref.shape == p.shape == (2, 3, 5, 8)
    np.testing.assert_allclose(_emulate_rope(p, x, cos, sin), ref, rtol=1e-12)


def test_rope_x_bshd_needs_rank_4():
    sig = _sig("RoPE", [(2, 5, 8), (5, 8), (5, 8)], x_bshd=1)
    assert all("x_bshd=1 needs a rank-4 X" in c.applies(sig, (9, 0)) for c in candidates_for(sig))


@pytest.mark.parametrize("shapes,why", [
    ([(2, 3, 5, 7), (1, 1, 5, 7), (1, 1, 5, 7)], "even"),
    ([(2, 3, 5, 8), (1, 2, 5, 8), (1, 1, 5, 8)], "broadcast"),
    ([(2, 3, 5, 8), (1, 1, 1, 5, 8), (1, 1, 5, 8)], "broadcast"),
    ([(2, 3, 5, 8), None, (1, 1, 5, 8)], "known"),
])
def test_rope_near_misses_are_reported(shapes, why):
    sig = _sig("RoPE", shapes)
    assert all(why in c.applies(sig, (9, 0)) for c in candidates_for(sig))
    assert heuristic_lowering("RoPE", sig, (9, 0))[0] == "default"


def test_rope_mixed_dtypes_and_bf16_are_refused():
    s = signature_of("RoPE", [(2, 8), (2, 8), (2, 8)], ["float16", "float32", "float32"], {})
    assert "mixes dtypes" in candidate_from_key("RoPE", "rope:vec=1").applies(s, (9, 0))
    assert "bfloat16" in candidate_from_key("RoPE", "rope:vec=1").applies(_sig("RoPE", [(2, 8)] * 3, "bfloat16"), (9, 0))


def test_rope_vector_loads_where_the_rows_allow():
    llama = _sig("RoPE", [(1, 32, 4096, 128), (1, 1, 4096, 128), (1, 1, 4096, 128)])
    assert [c.key() for c in applicable(llama, (9, 0))[0]] == ["rope:vec=8", "rope:vec=1"]
    assert heuristic_lowering("RoPE", llama, (9, 0))[:2] == ("rope", "vec=8")
    f32 = _sig("RoPE", [(1, 2, 3, 8), (3, 8), (3, 8)], "float32", interleaved=1)
    assert heuristic_lowering("RoPE", f32, None)[:2] == ("rope", "vec=4")
    odd = _sig("RoPE", [(1, 2, 3, 6), (3, 6), (3, 6)])  # half row 3: scalar only
    assert heuristic_lowering("RoPE", odd, (9, 0))[:2] == ("rope", "vec=1")
    bcast = _sig("RoPE", [(1, 2, 3, 16), (3, 1), (3, 1)])  # tables broadcast along the rotated axis
    assert "broadcast along the rotated axis" in candidate_from_key("RoPE", "rope:vec=8").applies(bcast, (9, 0))
    assert heuristic_lowering("RoPE", bcast, (9, 0))[:2] == ("rope", "vec=1")


def test_group_norm_plan_and_candidates():
    sig = _sig("GroupNorm", [(8, 512, 64, 64), (512, 1, 1), (512, 1, 1)], num_groups=32, activation="SiLU")
    p = group_norm_plan(sig)
    assert (p.groups, p.cpg, p.hw, p.blocks) == (32, 16, 4096, 256)
    ok, skipped = applicable(sig, (9, 0))
    assert {c.key() for c in ok} == {f"groups:warps={w},vec={v}" for w in (4, 8, 16, 32) for v in (8, 1)}
    assert heuristic_lowering("GroupNorm", sig, (9, 0))[:2] == ("groups", "warps=32,vec=8")  # 256 blocks
    many = _sig("GroupNorm", [(128, 512, 64, 64), (512,), (512,)], num_groups=32)
    assert heuristic_lowering("GroupNorm", many, (9, 0))[:2] == ("groups", "warps=8,vec=8")  # 2048 < blocks
    # odd spatial size: scalar loads only, small groups: 4 warps only
    odd = _sig("GroupNorm", [(2, 6, 5, 7), (6, 1, 1), (1, 6, 1, 1)], "float32", num_groups=3)
    assert [c.key() for c in applicable(odd, (9, 0))[0]] == ["groups:warps=4,vec=1"]
    assert heuristic_lowering("GroupNorm", odd, None)[:2] == ("groups", "warps=4,vec=1")


@pytest.mark.parametrize("shapes,attrs,why", [
    ([(2, 6, 5, 7), (6, 1, 1), (6, 1, 1)], {"num_groups": 4}, "do not split"),
    ([(2, 6, 5, 7), (3, 1, 1), (6, 1, 1)], {"num_groups": 3}, "scale"),
    ([(2, 6, 5, 7), (6, 1, 1), (6, 2, 1)], {"num_groups": 3}, "bias"),
    ([(6,), (6,), (6,)], {"num_groups": 3}, "[N, C, ...]"),
])
def test_group_norm_near_misses_are_reported(shapes, attrs, why):
    sig = _sig("GroupNorm", shapes, **attrs)
    assert all(why in c.applies(sig, (9, 0)) for c in candidates_for(sig))
    assert heuristic_lowering("GroupNorm", sig, (9, 0))[0] == "default"


def test_gated_mlp_plan_and_heuristic():
    sig = _sig("GatedMLP", [(1, 128, 4096), (4096, 11008), (4096, 11008)], activation="SiLU")
    p = glu_plan(sig)
    assert (p.M, p.N, p.K, p.out_shape) == (128, 11008, 4096, (1, 128, 11008))
    assert heuristic_lowering("GatedMLP", sig, (9, 0))[:2] == ("cublas_glu", "")
    with_bias = _sig("GatedMLP", [(5, 40), (40, 13), (40, 13), (13,), (1, 13)], "float32", activation="QuickGelu")
    assert candidate_from_key("GatedMLP", "cublas_glu").applies(with_bias, (9, 0)) is None
    low_ws = glu_plan(with_bias)
    assert (low_ws.M, low_ws.N) == (5, 13)


@pytest.mark.parametrize("shapes,why", [
    ([(5, 40), (40, 13), (40, 12)], "must be"),
    ([(5, 41), (40, 13), (40, 13)], "must be"),
    ([(5, 40), (40, 13), (40, 13), (12,)], "Bg must hold 13"),
    ([(5, 40), None, (40, 13)], "known"),
])
def test_gated_mlp_near_misses_are_reported(shapes, why):
    sig = _sig("GatedMLP", shapes, activation="SiLU")
    assert why in candidate_from_key("GatedMLP", "cublas_glu").applies(sig, (9, 0))
    assert heuristic_lowering("GatedMLP", sig, (9, 0))[0] == "default"


def test_every_candidate_key_round_trips_and_its_kernels_are_in_ci():
    every = set(all_kernel_instances())
    cases = [_sig("RoPE", [(2, 8), (2, 8), (2, 8)], dt, interleaved=f) for dt in ("float16", "float32") for f in (0, 1)]
    cases += [_sig("GroupNorm", [(2, 8, 4, 4), (8,), (8,)], dt, num_groups=2) for dt in ("float16", "float32")]
    cases += [_sig("GroupNorm", [(2, 8, 3), (8,), (8,)], dt, num_groups=2) for dt in ("float16", "float32")]
    cases += [_sig("GatedMLP", [(3, 16), (16, 24), (16, 24)], dt, activation="SiLU") for dt in ("float16", "float32")]
    for sig in cases:
        ok, _ = applicable(sig, (9, 0))
        assert ok
        for cand in ok:
            assert candidate_from_key(sig.op, cand.key()) == cand
            assert set(cand.kernels(sig)) <= every


def test_kernel_activation_codes_cover_every_activation():
    prelude = (KERNEL_DIR / PRELUDE).read_text()
    assert set(ACT_CODES) == set(ACTIVATIONS)
    for name, code in ACT_CODES.items():
        assert f" {code}\n" in prelude  # the #define of each code


# -- check inputs come from the schema (issue 17 item 1) ------------------------------------------

def test_default_check_inputs_are_standard_normal_of_the_data_dtype():
    sig = _sig("RoPE", [(3, 8), (8,), (8,)], "float32")
    a = check.random_inputs(sig, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    assert all(np.array_equal(x, rng.standard_normal(x.shape).astype(np.float32)) for x in a)


def test_weights_are_scaled_by_fan_in():
    rng = np.random.default_rng(0)
    cbr_w = get_schema("CBR").check_input(1, (64, 16, 3, 3), "float32", {}, rng)
    assert 0.2 < cbr_w.std() * np.sqrt(16 * 9) < 5 and cbr_w.std() < 0.2
    x, wg, wu = check.random_inputs(_sig("GatedMLP", [(4, 400), (400, 50), (400, 50)], "float32"), rng)
    assert x.std() > 0.8 and 0.03 < wg.std() < 0.07 and 0.03 < wu.std() < 0.07
    gemm_b = get_schema("GemmAct").check_input(1, (30, 900), "float32", {"mode": "gemm", "transB": 1}, rng)
    assert 0.02 < gemm_b.std() < 0.05  # fan-in is the last dim (900) with transB


def test_attention_mask_is_the_schemas_and_timer_buffers_ask_it():
    schema = get_schema("Attention")
    assert schema.host_check_inputs == (3,) and schema.data_dtype_input == 0
    m = schema.check_input(3, (2, 1, 3, 5), "float16", {"mask_kind": b"bool"}, np.random.default_rng(1))
    assert m.dtype == bool and m[..., 0].all()
    assert schema.check_input(0, (2, 3), "float16", {"mask_kind": "bool"}, np.random.default_rng(1)).dtype == np.float16
