"""The Attention lowering candidates on the CPU: the plan (shapes, strides, reasons), which configs
apply, their keys and kernel instances, the profiler checker's inputs, and the cuBLAS lowering's
integers executed by a NumPy strided-batched GEMM and mask gather against the op's reference.
The kernels compile in tests/unit/test_kernels_compile.py and run in tests/gpu/test_attention_gpu.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graphopt.kernels.attention import (FlashAttention, attention_candidates, attention_kernel_instances,
                                        flash_mma_smem_bytes, flash_smem_bytes)
from graphopt.kernels.attention_cublas import (GRID_ROWS_MAX, SOFTMAX_LANES, SOFTMAX_LANES_MAX_LOADS,
                                               CublasSoftmaxAttention, batch_offsets, score_gemm, score_gemm_ptrs,
                                               softmax_grid, softmax_reason, value_gemm, value_gemm_ptrs)
from graphopt.kernels.attention_plan import _arrays, attention_plan
from graphopt.errors import TuningError
from graphopt.lowering.contract import Signature
from graphopt.kernels.check import data_dtype, output_shape, random_inputs
from graphopt.kernels.registry import all_kernel_instances, candidate_from_key, candidates_for
from graphopt.ops import get_schema


def _sig(B=2, H=3, Sq=5, Skv=7, D=16, Dv=None, kt=0, mask=None, kind="none", dtype="float32", mdtype=None, **attrs):
    Dv = D if Dv is None else Dv
    lead = tuple(x for x in (B, H) if x is not None)
    k = lead + ((D, Skv) if kt else (Skv, D))
    shapes = [lead + (Sq, D), k, lead + (Skv, Dv)]
    dts = [dtype] * 3
    if kind != "none":
        shapes.append(mask)
        dts.append(mdtype or (dtype if kind == "additive" else "bool"))
    return Signature.make("Attention", shapes, dts, {"k_transposed": kt, "mask_kind": kind, **attrs})


def test_plan_of_a_gpt2_style_node():
    p = attention_plan(_sig(B=2, H=4, Sq=11, Skv=11, D=16, kt=1, mask=(2, 1, 1, 11), kind="additive", scale=0.25,
                            nan_to_zero=1))
    assert (p.B, p.H, p.Sq, p.Skv, p.D, p.Dv, p.kt, p.scale) == (2, 4, 11, 11, 16, 16, True, 0.25)
    assert p.mask_strides == (11, 0, 0, 1) and p.mask == 1 and p.nan_to_zero == 1
    assert p.out_shape == (2, 4, 11, 16)
    assert attention_plan(_sig(D=64)).scale == 1 / 8
    assert attention_plan(_sig(B=None, H=None, mask=(7,), kind="bool")).mask_strides == (0, 0, 0, 1)
    assert attention_plan(_sig(mask=(5, 7), kind="bool", mask_value=-1e30)).mask_strides == (0, 0, 7, 1)
    assert attention_plan(_sig(mask=(5, 7), kind="bool")).mask_value == -math.inf


@pytest.mark.parametrize("sig,reason", [
    (_sig(mask=(2, 3, 4, 7), kind="additive"), "does not broadcast"),
    (_sig(mask=(1, 2, 3, 5, 7), kind="additive"), "rank 5"),
    (_sig(mask=(5, 7), kind="additive", mdtype="bool"), "additive mask of dtype bool"),
    (_sig(mask=(5, 7), kind="bool", mdtype="float32"), "bool mask of dtype float32"),
    (_sig(dtype="float64"), "dtypes"),
    (Signature.make("Attention", [(2, 5, 16), (2, 7, 8), (2, 7, 16)], ["float32"] * 3, {}), "disagree on the head dim"),
    (Signature.make("Attention", [(2, 4, 5, 16), (2, 1, 7, 16), (2, 1, 7, 16)], ["float32"] * 3, {}), "leading"),
    (Signature.make("Attention", [(2, 5, 16), (2, 7, 16), (2, 6, 16)], ["float32"] * 3, {}), "has 6 keys"),
    (Signature.make("Attention", [None, (2, 7, 16), (2, 7, 16)], ["float32"] * 3, {}), "known Q, K and V"),
    (Signature.make("GemmAct", [(2, 8), (8, 3)], ["float32"] * 2, {}), "is not Attention"),
])
def test_signatures_no_candidate_runs(sig, reason):
    for cand in attention_candidates():
        assert reason in cand.applies(sig, (9, 0))


def _applicable(sig, cc=(9, 0)):
    return [c.key() for c in candidates_for(sig) if c.applies(sig, cc) is None]


def test_configs_that_apply():
    assert _applicable(_sig(Skv=7, D=16)) == [
        "cublas_softmax:warps=1", "cublas_softmax:lanes=8", "flash:dmax=32,bm=16,warps=4", "flash:dmax=32,bm=32,warps=4",
        "flash:dmax=32,bm=64,warps=4", "flash:dmax=32,bm=64,warps=8"]
    keys = _applicable(_sig(Skv=2048, D=128))
    assert keys[:8] == [f"cublas_softmax:warps={w}" for w in (1, 2, 4, 8)] + [
        f"cublas_softmax:warps={w},vec=4" for w in (1, 2, 4, 8)]
    assert keys[8:11] == [f"cublas_softmax:warps={w},vec=4,loads={k}" for w, k in ((2, 8), (4, 4), (8, 2))]  # 512 vectors
    assert all("dmax=128" in k for k in keys[11:]) and len(keys) == 15
    assert _applicable(_sig(D=256)) == ["cublas_softmax:warps=1", "cublas_softmax:lanes=8"]  # no flash config holds head dim 256
    reasons = {c.key(): c.applies(_sig(Skv=100, D=64), (9, 0)) for c in attention_candidates()}
    assert reasons["cublas_softmax:warps=8"] == "4 warps already cover a row of 100 keys"
    assert reasons["cublas_softmax:warps=1,vec=4"] is None  # 25 loads of 4 fp32 scores
    assert reasons["cublas_softmax:warps=2,vec=4"] == "1 warps already cover a row of 100 keys"
    assert reasons["cublas_softmax:warps=1,vec=8"] == "vec=8 is not a 16-byte load of float32"
    assert candidate_from_key("Attention", "cublas_softmax:warps=1,vec=8").applies(
        _sig(Skv=100, D=64, dtype="float16"), (9, 0)) == "100 keys are not a multiple of vec=8"
    assert reasons["cublas_softmax:lanes=32,vec=4"] is None  # 25 loads: 16 lanes do not cover them
    assert reasons["cublas_softmax:lanes=16,vec=4"] is None and reasons["cublas_softmax:lanes=8,vec=4"] is None
    assert candidate_from_key("Attention", "cublas_softmax:lanes=32,vec=8").applies(
        _sig(Skv=128, D=64, dtype="float16"), (9, 0)) == "16 lanes already cover a row of 128 keys"
    assert reasons["cublas_softmax:lanes=8"] == "a row of 100 keys is 12 loads a lane for lanes=8 (a CTA a row suits it)"
    assert reasons["flash:dmax=32,bm=16,warps=4"] == "head dim 64 > dmax=32"
    assert reasons["flash:dmax=128,bm=16,warps=4"] == "dmax=64 already holds head dim 64"
    big = FlashAttention("flash", (("dmax", 128), ("bm", 64), ("warps", 4)))
    assert flash_smem_bytes(128, 64) > 48 * 1024
    assert "shared memory" in big.applies(_sig(D=128), (7, 5)) and big.applies(_sig(D=128), (8, 0)) is None


def test_tensor_core_configs():
    fp16 = _sig(Skv=11, D=64, kt=1, dtype="float16")
    assert [k for k in _applicable(fp16) if k.startswith("flash_mma")] == [
        "flash_mma:hd=64,bn=64,stages=1", "flash_mma:hd=64,bn=64,stages=2", "flash_mma:hd=64,bn=128,stages=1",
        "flash_mma:hd=64,bn=128,stages=2"]
    reasons = {c.key(): c.applies(fp16, (9, 0)) for c in attention_candidates() if c.name == "flash_mma"}
    assert reasons["flash_mma:hd=128,bn=64,stages=2"] == "head dims D=64, Dv=64 are not both hd=128"
    cand = candidate_from_key("Attention", "flash_mma:hd=64,bn=64,stages=2")
    assert cand.applies(_sig(D=64), (9, 0)) == "dtype float32 (the tensor-core kernel is fp16)"
    assert "not both hd=64" in cand.applies(_sig(D=64, Dv=32, dtype="float16"), (9, 0))
    assert "needs 8.0" in cand.applies(fp16, (7, 5))
    assert cand.kernels(fp16) == [("attention.cu", "flash_mma<half_t,64,64,0,1,2>")]
    assert flash_mma_smem_bytes(128, 128, True) == 2 * (64 * 136 + 128 * 136 + 128 * 136)
    assert flash_mma_smem_bytes(128, 64, False, 2) == 2 * (64 * 136 + 2 * (64 * 136 + 64 * 136))
    big = candidate_from_key("Attention", "flash_mma:hd=128,bn=128,stages=2")
    assert big.applies(_sig(D=128, kt=1, dtype="float16"), (9, 0)) is None  # 156 KB on sm_90
    assert flash_mma_smem_bytes(128, 128, True, 2) == 2 * (64 * 136 + 2 * (128 * 136 + 128 * 136)) < 163 * 1024


def test_keys_round_trip_and_instances_are_registered():
    for cand in attention_candidates():
        assert candidate_from_key("Attention", cand.key()) == cand
    sig = _sig(D=64, dtype="float16", mask=(2, 1, 1, 7), kind="additive")
    assert candidate_from_key("Attention", "cublas_softmax:warps=4").kernels(sig) == [
        ("attention.cu", "attn_softmax<half_t,4,1,1,0>")]
    assert candidate_from_key("Attention", "cublas_softmax:warps=4,vec=8").kernels(sig) == [
        ("attention.cu", "attn_softmax<half_t,4,1,8,0>")]
    assert candidate_from_key("Attention", "flash:dmax=64,bm=32,warps=4").kernels(
        _sig(D=64, mask=(5, 7), kind="bool")) == [("attention.cu", "flash_attn<float,64,32,4,2>")]
    every = set(all_kernel_instances())
    assert set(attention_kernel_instances()) <= every
    for kind, mask in (("none", None), ("additive", (5, 7)), ("bool", (2, 1, 5, 7))):
        for dt in ("float16", "float32"):
            s = _sig(D=64, mask=mask, kind=kind, dtype=dt)
            for c in candidates_for(s):
                if c.applies(s, (9, 0)) is None:
                    assert set(c.kernels(s)) <= every


@pytest.mark.parametrize("lanes", SOFTMAX_LANES)
@pytest.mark.parametrize("rows,nv", [(1, 3), (7, 16), (33, 1), (1000, 9), (GRID_ROWS_MAX * 32 + 5, 2)])
def test_short_row_softmax_visits_every_score_once(lanes, rows, nv):
    """attn_softmax_rows' loops run on the CPU: every (row, load) is taken by exactly one thread, and the
    warps that skip a trip are exactly those whose groups are all past the last row (warp-uniform); a row
    longer than SOFTMAX_LANES_MAX_LOADS loads a lane goes to the CTA-a-row kernel."""
    assert softmax_reason({"lanes": lanes}, "float32", lanes * SOFTMAX_LANES_MAX_LOADS + 1) is not None
    grid, block = softmax_grid(rows, {"lanes": lanes})
    assert block == (256,) and 1 <= grid[0] <= GRID_ROWS_MAX
    per_cta = 256 // lanes
    seen = np.zeros((rows, nv), np.int64)
    t = np.arange(256)
    lane, group, warp_row0 = t % lanes, t // lanes, (t & ~31) // lanes
    for bx in range(grid[0]):
        for base in range(bx * per_cta, rows, grid[0] * per_cta):
            active = base + warp_row0 < rows  # the kernel's `continue` for a warp past the end
            for w in range(8):
                assert active[w * 32:(w + 1) * 32].all() or not active[w * 32:(w + 1) * 32].any()
            row = base + group
            live = active & (row < rows)
            for jv0 in range(lanes):
                sel = live & (lane == jv0)
                for jv in range(jv0, nv, lanes):
                    np.add.at(seen, (row[sel], jv), 1)
    assert (seen == 1).all()


def test_checker_inputs_for_a_bool_mask():
    sig = _sig(B=2, H=1, Sq=3, Skv=4, mask=(2, 1, 3, 4), kind="bool", causal=1, dtype="float16")
    assert data_dtype(sig) == "float16" and output_shape(sig) == (2, 1, 3, 16)
    q, k, v, m = random_inputs(sig, np.random.default_rng(1))
    assert q.dtype == k.dtype == v.dtype == np.float16 and m.dtype == bool and m.shape == (2, 1, 3, 4)
    assert m[..., 0].all() and not m.all()
    ref = get_schema("Attention").reference([q, k, v, m], dict(sig.attrs))[0]
    assert np.isfinite(ref).all()  # key 0 is always attended: no NaN row for the checker's norm


def _emulate(sig, inputs):
    """The cuBLAS lowering's integers run on the CPU: strided-batched GEMMs over flat buffers, the
    mask gathered through the plan's strides, then the softmax as the kernel computes it."""
    p = attention_plan(sig)

    def gemm(a, b, M, N, K, trans_b=False, batch=1, stride_a=0, stride_b=0, stride_c=0, alpha=1.0):
        out = np.empty(batch * stride_c)
        for z in range(batch):
            A = a[z * stride_a: z * stride_a + M * K].reshape(M, K)
            Bm = b[z * stride_b: z * stride_b + K * N].reshape((N, K) if trans_b else (K, N))
            out[z * stride_c: z * stride_c + M * N] = (alpha * A @ (Bm.T if trans_b else Bm)).reshape(-1)
        return out

    q, k, v = (np.asarray(x, np.float64).reshape(-1) for x in inputs[:3])
    s = gemm(q, k, **score_gemm(p))
    y = gemm(_softmax_kernel(p, s, inputs[3] if len(inputs) > 3 else None), v, **value_gemm(p))
    return y.reshape(p.out_shape)


def _softmax_kernel(p, scores, mask):
    """The fused softmax kernel on flat [Z][Sq][Skv] scores: the mask gathered through the plan's
    strides, causal, then the row softmax (NaN for a row with nothing attended, every NaN 0 with
    nan_to_zero; the order of operations inside a row: the *_softmax_row tests below); flat again."""
    s = scores.reshape(p.B, p.H, p.Sq, p.Skv)
    b, h, i, j = np.meshgrid(*(np.arange(n) for n in (p.B, p.H, p.Sq, p.Skv)), indexing="ij")
    if p.mask:
        off = b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3]
        flat = np.asarray(mask).reshape(-1)[off]
        s = s + flat if p.mask == 1 else np.where(flat, s, s + p.mask_value)
    if p.causal:
        s = np.where(j > i, -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    empty = np.isneginf(m)
    e = np.where(np.isneginf(s), 0.0, np.exp(s - np.where(empty, 0, m)))
    with np.errstate(invalid="ignore"):
        prob = np.where(empty, np.nan, e / e.sum(axis=-1, keepdims=True))
    return (np.where(np.isnan(prob), 0.0, prob) if p.nan_to_zero else prob).reshape(-1)


CASES = [  # (B, H, Sq, Skv, D, Dv, kt, mask shape, kind, attrs)
    (2, 3, 5, 7, 16, 16, 0, None, "none", {}),
    (2, 3, 5, 7, 16, 8, 1, (2, 1, 1, 7), "additive", {"scale": 0.3}),
    (1, 2, 9, 9, 8, 8, 1, (1, 1, 9, 9), "additive", {"nan_to_zero": 1}),
    (2, 2, 6, 6, 8, 8, 0, (2, 1, 6, 6), "bool", {"causal": 1}),
    (2, 2, 6, 4, 8, 8, 0, (4,), "bool", {"mask_value": -1e4}),
    (None, 4, 3, 5, 8, 8, 1, (4, 3, 5), "bool", {"nan_to_zero": 1}),
    (None, None, 7, 7, 8, 8, 0, None, "none", {"causal": 1}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[8]}-kt{c[6]}-{'-'.join(c[9])}")
def test_cublas_lowering_integers_against_the_reference(case):
    B, H, Sq, Skv, D, Dv, kt, mshape, kind, attrs = case
    sig = _sig(B=B, H=H, Sq=Sq, Skv=Skv, D=D, Dv=Dv, kt=kt, mask=mshape, kind=kind, **attrs)
    rng = np.random.default_rng(7)
    ins = [rng.standard_normal(s) for s in sig.input_shapes[:3]]
    if kind == "additive":
        ins.append(rng.standard_normal(mshape))
    elif kind == "bool":
        ins.append(rng.random(mshape) < 0.6)
    ref = get_schema("Attention").reference(ins + [None] * (4 - len(ins)), dict(sig.attrs))[0]
    got = _emulate(sig, ins)
    assert got.shape == ref.shape
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(ref), rtol=1e-10, atol=1e-12)


def test_qkv_bshd_plan_and_which_families_read_it():
    """qkv_bshd=1: the plan has the logical dims and bshd=1; flash and flash_mma read the layout
    (strides in the kernel), cublas_softmax says why not; the heuristic picks a kernel, not the fallback."""
    from graphopt.kernels.heuristic import heuristic_lowering

    sig = Signature.make("Attention", [(2, 128, 12, 64)] * 3 + [(2, 1, 128, 128)], ["float16"] * 4,
                         {"mask_kind": "additive", "qkv_bshd": 1, "scale": 0.125})
    p = attention_plan(sig)
    assert (p.B, p.H, p.Sq, p.Skv, p.D, p.bshd, p.kt) == (2, 12, 128, 128, 64, 1, False)
    assert p.out_shape == (2, 12, 128, 64)
    keys = _applicable(sig)
    assert "flash_mma:hd=64,bn=64,stages=2" in keys and "flash:dmax=64,bm=64,warps=4" in keys
    assert "cublas_softmax:warps=4" in keys  # pointer-array batched GEMMs read [B, S, H, D]
    cand = CublasSoftmaxAttention("cublas_softmax", (("warps", 4),))
    assert ("attention.cu", "attn_batch_ptrs<half_t>") in cand.kernels(sig)
    assert cand.kernels(_sig(D=64, dtype="float16")) == [("attention.cu", "attn_softmax<half_t,4,0,1,0>")]
    name, _, _ = heuristic_lowering("Attention", sig, (9, 0), providers=False)
    assert name == "cublas_softmax"  # 128 keys: the heuristic's short-key choice reads [B, S, H, D] now
    fp32 = Signature.make("Attention", [(2, 9, 3, 16)] * 3, ["float32"] * 3, {"qkv_bshd": 1})
    assert any(k.startswith("flash:") for k in _applicable(fp32))  # fp32 keeps a GPU kernel
    assert "cublas_softmax:warps=1" in _applicable(fp32)


def test_qkv_packed_plan_flags_and_views():
    """qkv_packed=1: one [B, S, 3, H, D] input; the plan has the logical dims and layout bit 2; the kernels'
    K and V are views of it at H * D and 2 * H * D; cublas_softmax, flash and flash_mma apply."""
    sig = Signature.make("Attention", [(2, 128, 3, 12, 64), None, None], ["float16", "", ""],
                         {"qkv_bshd": 1, "qkv_packed": 1, "y_bshd": 1})
    p = attention_plan(sig)
    assert (p.B, p.H, p.Sq, p.Skv, p.D, p.Dv, p.layout_flags, p.out_shape) == (2, 12, 128, 128, 64, 64, 7, (2, 128, 12, 64))
    keys = _applicable(sig)
    assert "flash_mma:hd=64,bn=64,stages=2" in keys and "flash:dmax=64,bm=64,warps=4" in keys
    assert "cublas_softmax:warps=1,vec=8" in keys
    packed = np.zeros((2, 128, 3, 12, 64), np.float16)
    y = np.zeros((2, 128, 12, 64), np.float16)
    Q, K, V, M, Y = _arrays(p, [packed, None, None], [y], "test")
    base = packed.__array_interface__["data"][0]
    assert [a.__array_interface__["data"][0] - base for a in (Q, K, V)] == [0, 12 * 64 * 2, 2 * 12 * 64 * 2]
    with pytest.raises(TuningError, match="packed Q, K, V must be"):
        _arrays(p, [packed[:1], None, None], [y], "test")
    assert output_shape(sig) == (2, 128, 12, 64)
    shape = Signature.make("Attention", [(2, 128, 36, 64), None, None], ["float16", "", ""], {"qkv_bshd": 1, "qkv_packed": 1})
    with pytest.raises(TuningError, match=r"qkv_packed=1 needs Q as \[B, S, 3, H, D\]"):
        attention_plan(shape)


def test_y_bshd_plan_flags_and_refusals():
    sig = Signature.make("Attention", [(2, 128, 12, 64)] * 3, ["float16"] * 3, {"qkv_bshd": 1, "y_bshd": 1})
    p = attention_plan(sig)
    assert (p.bshd, p.ybshd, p.layout_flags, p.out_shape) == (1, 1, 3, (2, 128, 12, 64))
    only_y = attention_plan(Signature.make("Attention", [(2, 12, 128, 64)] * 3, ["float16"] * 3, {"y_bshd": 1}))
    assert (only_y.layout_flags, only_y.out_shape) == (2, (2, 128, 12, 64))
    keys = _applicable(sig)
    assert "flash_mma:hd=64,bn=64,stages=2" in keys and "cublas_softmax:warps=1" in keys
    rank3 = Signature.make("Attention", [(2, 128, 64)] * 3, ["float32"] * 3, {"y_bshd": 1})
    assert all("y_bshd=1 needs rank-4" in c.applies(rank3, (9, 0)) for c in attention_candidates())


def _emulate_ptrs(sig, inputs):
    """cublas_softmax over [B, S, H, D] operands on the CPU: cublasGemmBatchedEx's row-major reading of
    flat buffers at the pointers attn_batch_ptrs writes (batch_offsets) with the row strides passed as
    leading dimensions (score_gemm_ptrs / value_gemm_ptrs), the softmax between them."""
    p = attention_plan(sig)
    off = batch_offsets(p)
    if p.packed:
        flat = np.asarray(inputs[0], np.float64).reshape(-1)
        q, k, v = flat, flat[p.H * p.D:], flat[2 * p.H * p.D:]
    else:
        q, k, v = (np.asarray(x, np.float64).reshape(-1) for x in inputs[:3])

    def gemm(a, a_off, b, b_off, c, c_off, M, N, K, lda, ldb, ldc, batch, trans_b=False, alpha=1.0):
        for z in range(batch):
            A = np.lib.stride_tricks.as_strided(a[a_off[z]:], (M, K), (lda * 8, 8))
            Bm = np.lib.stride_tricks.as_strided(b[b_off[z]:], (N, K) if trans_b else (K, N), (ldb * 8, 8))
            C = np.lib.stride_tricks.as_strided(c[c_off[z]:], (M, N), (ldc * 8, 8), writeable=True)
            C[...] = alpha * A @ (Bm.T if trans_b else Bm)

    s_off = np.arange(p.Z) * p.Sq * p.Skv
    scores = np.full(p.Z * p.Sq * p.Skv, np.nan)
    gemm(q, off[0], k, off[1], scores, s_off, **score_gemm_ptrs(p))
    prob = _softmax_kernel(p, scores, inputs[3] if len(inputs) > 3 else None)
    y = np.full(int(np.prod(p.out_shape)), np.nan)  # poisoned: every element must be written
    gemm(prob, s_off, v, off[2], y, off[3], **value_gemm_ptrs(p))
    return y.reshape(p.out_shape)


@pytest.mark.parametrize("attrs,packed", [({"qkv_bshd": 1}, False), ({"qkv_bshd": 1, "y_bshd": 1}, False),
                                          ({"y_bshd": 1}, False), ({"qkv_bshd": 1, "qkv_packed": 1, "y_bshd": 1}, True),
                                          ({"qkv_bshd": 1, "causal": 1, "mask_kind": "additive"}, False)])
def test_pointer_array_gemms_against_the_reference(attrs, packed):
    """The integers of cublas_softmax's [B, S, H, D] path (offsets, leading dims, batch order) against the
    NumPy reference, odd sizes (B 2, S 5 / 7 keys, H 3, D 6)."""
    B, Sq, Skv, H, D = 2, 5, 7, 3, 6
    rng = np.random.default_rng(11)
    bshd = attrs.get("qkv_bshd", 0)
    if packed:
        Sq = Skv
        shapes = [(B, Sq, 3, H, D), None, None]
    elif bshd:
        shapes = [(B, Sq, H, D), (B, Skv, H, D), (B, Skv, H, D)]
    else:
        shapes = [(B, H, Sq, D), (B, H, Skv, D), (B, H, Skv, D)]
    mask = attrs.get("mask_kind")
    sig = Signature.make("Attention", shapes + ([(B, 1, Sq, Skv)] if mask else []),
                         ["float32", "" if packed else "float32", "" if packed else "float32"] + (["float32"] if mask else []),
                         attrs)
    ins = [rng.standard_normal(s) for s in shapes if s is not None] + ([None, None] if packed else [])
    if mask:
        ins.append(rng.standard_normal((B, 1, Sq, Skv)))
    cand = CublasSoftmaxAttention("cublas_softmax", (("warps", 1),))
    assert cand.applies(sig, (9, 0)) is None
    ref = get_schema("Attention").reference(ins + [None] * (4 - len(ins)), dict(sig.attrs))[0]
    got = _emulate_ptrs(sig, ins)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


def test_held_softmax_configs_take_rows_of_exactly_lanes_times_loads_vectors():
    fp16 = _sig(Skv=128, D=64, dtype="float16")  # 16 vectors of 8
    held = [k for k in _applicable(fp16) if "loads=" in k]
    assert held == ["cublas_softmax:lanes=8,vec=8,loads=2", "cublas_softmax:lanes=16,vec=8,loads=1"]
    fp32 = _sig(Skv=128, D=64)  # 32 vectors of 4
    assert [k for k in _applicable(fp32) if "loads=" in k] == [
        "cublas_softmax:lanes=8,vec=4,loads=4", "cublas_softmax:lanes=16,vec=4,loads=2",
        "cublas_softmax:lanes=32,vec=4,loads=1", "cublas_softmax:warps=1,vec=4,loads=1"]
    assert candidate_from_key("Attention", "cublas_softmax:warps=2,vec=4,loads=1").applies(fp32, (9, 0)) == \
        "a row of 128 keys is not warps=2 (x 32 threads) x loads=1 16-byte vectors"
    assert candidate_from_key("Attention", "cublas_softmax:warps=4,vec=8,loads=2").kernels(
        _sig(Skv=2048, D=64, dtype="float16")) == [("attention.cu", "attn_softmax<half_t,4,0,8,2>")]
    cand = candidate_from_key("Attention", "cublas_softmax:lanes=8,vec=8,loads=2")
    assert cand.applies(_sig(Skv=136, D=64, dtype="float16"), (9, 0)) == \
        "a row of 136 keys is not lanes=8 x loads=2 16-byte vectors"
    assert cand.applies(_sig(Skv=128, D=64), (9, 0)) == "vec=8 is not a 16-byte load of float32"
    assert cand.kernels(_sig(Skv=128, D=64, dtype="float16", mask=(2, 1, 1, 128), kind="additive")) == [
        ("attention.cu", "attn_softmax_rows<half_t,8,1,8,2>")]
    assert softmax_grid(1000, {"lanes": 8, "vec": 8, "loads": 2}) == ((32,), (256,))


def _nan_max(a, b):
    return np.nan if np.isnan(a) or np.isnan(b) else max(a, b)


def _held_softmax_row(row, width, loads, vec, nan_to_zero):
    """The held softmax forms on one row, step by step as the kernels run them (held_load, held_exp,
    held_store): thread l of ``width`` (a group's lanes, or a CTA's threads) holds scores
    (l + t * width) * vec + k; a NaN-propagating max per thread, then over the threads, one exp2 a
    score with no special-value tests, the sum over the threads, then the scaled store with fmax's
    NaN floor, every NaN made 0 with nan_to_zero."""
    idx = [[(lane + t * width) * vec + k for t in range(loads) for k in range(vec)] for lane in range(width)]
    m = -np.inf
    for ix in idx:
        mt = -np.inf
        for j in ix:
            mt = _nan_max(mt, row[j])
        m = _nan_max(m, mt)
    out = np.empty_like(row)
    f32 = np.float32
    log2e = f32(np.log2(np.e))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # inf - inf and 1 / 0, as in CUDA
        # in float32, as the kernel computes (a huge finite fill must stay exact: x - m first)
        # held_exp: 2^((x - m) * log2(e)) with no test of the special values (m taken as 0 for a row
        # with nothing attended); held_store: a NaN inverse for such a row, and
        # fmaxf(p, nan_to_zero ? 0 : NaN), which returns its non-NaN operand (np.fmax)
        mm = f32(0.0) if m == -np.inf else f32(m)
        e = {j: np.exp2((f32(row[j]) - mm) * log2e) for ix in idx for j in ix}
        s = f32(0.0)
        for ix in idx:
            for j in ix:
                s = f32(s + e[j])
        inv = f32(np.nan) if m == -np.inf else f32(1.0) / s
        floor = f32(0.0) if nan_to_zero else f32(np.nan)
        for ix in idx:
            for j in ix:
                out[j] = np.fmax(e[j] * inv, floor)
    return out


def _ms_push(m, s, x):  # attention.cu's ms_push
    with np.errstate(invalid="ignore"):
        if np.isnan(x):
            return np.nan, np.nan
        if x > m:
            return x, (0.0 if m == -np.inf else s * np.exp(m - x)) + np.exp(x - x)
        if m != -np.inf and x != -np.inf:
            return m, s + np.exp(x - m)
        return m, s


def _ms_combine(m, s, m2, s2):  # attention.cu's ms_combine
    with np.errstate(invalid="ignore"):
        if np.isnan(m) or np.isnan(m2):
            return np.nan, np.nan
        mx = max(m, m2)
        if mx == -np.inf:
            return m, s
        return mx, (0.0 if m == -np.inf else s * np.exp(m - mx)) + (0.0 if m2 == -np.inf else s2 * np.exp(m2 - mx))


def _strided_softmax_row(row, lanes, vec, nan_to_zero):
    """attn_softmax_rows' strided form on one row (softmax_row_strided; attn_softmax's loops are the same
    with a CTA's threads): lane l pushes the scores of vectors l, l + lanes, ... into its running
    (max, sum), the butterfly of shuffles combines the pairs, pass 2 writes softmax_prob."""
    nv = len(row) // vec
    pairs = []
    for lane in range(lanes):
        m, s = -np.inf, 0.0
        for jv in range(lane, nv, lanes):
            for k in range(vec):
                m, s = _ms_push(m, s, row[jv * vec + k])
        pairs.append((m, s))
    o = lanes // 2
    while o:
        pairs = [_ms_combine(*pairs[lane], *pairs[lane ^ o]) for lane in range(lanes)]
        o //= 2
    out = np.empty_like(row)
    for lane, (m, s) in enumerate(pairs):
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = 1.0 / np.float64(s)
            for jv in range(lane, nv, lanes):
                for k in range(vec):
                    x = row[jv * vec + k]
                    p = np.nan
                    if m != -np.inf and not np.isnan(inv):
                        p = 0.0 if x == -np.inf else np.exp(x - m) * inv
                    out[jv * vec + k] = 0.0 if nan_to_zero and np.isnan(p) else p
    return out


def _reference_row(row, nan_to_zero):
    """graphopt.ops.attention's reference on one row of scores: max, exp, sum, and nan_to_zero's
    elementwise IsNaN / Where."""
    with np.errstate(invalid="ignore"):
        e = np.exp(row - row.max())
        p = e / e.sum()
    return np.where(np.isnan(p), 0.0, p) if nan_to_zero else p


ROW_CASES = ["random", "masked", "empty", "nan", "nan_first", "posinf", "empty_but_nan", "fill_min", "fill_min_some"]
FLOAT32_MIN = float(np.finfo(np.float32).min)  # an HF / BERT mask's fill: masked, but finite


def _row(n, case):
    rng = np.random.default_rng(n + len(case))
    row = rng.standard_normal(n) * 4
    if case in ("masked", "nan", "posinf"):
        row[rng.random(n) < 0.4] = -np.inf
    if case in ("empty", "empty_but_nan"):
        row[:] = -np.inf
    if case in ("nan", "empty_but_nan"):
        row[n // 3] = np.nan
    if case == "nan_first":  # the first score lane 0 sees
        row[0] = np.nan
    if case == "posinf":
        row[n // 2] = np.inf
    if case == "fill_min":  # a fully masked row of a finite fill: every score equal, a uniform row
        row[:] = FLOAT32_MIN
    if case == "fill_min_some":
        row[rng.random(n) < 0.4] = FLOAT32_MIN
    return row


def _same(got, ref, rtol=1e-12):
    assert np.array_equal(np.isnan(got), np.isnan(ref)), (got, ref)
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(ref), rtol=rtol, atol=0)


@pytest.mark.parametrize("width,loads,vec", [(8, 2, 8), (16, 1, 8), (32, 8, 4), (8, 4, 4), (64, 2, 8), (256, 1, 4)])
@pytest.mark.parametrize("case", ROW_CASES)
@pytest.mark.parametrize("nz", [0, 1])
def test_held_softmax_row_against_the_reference(width, loads, vec, case, nz):
    """Every score is taken exactly once, and the held forms' order of operations gives the reference's
    row softmax: masked scores 0, a NaN or a +inf score makes the row NaN (also where every other score
    is masked), a row with nothing attended NaN, and nan_to_zero makes every NaN 0. ``width``: lanes, or
    32 x warps."""
    n = width * loads * vec
    seen = np.zeros(n, int)
    for lane in range(width):
        for t in range(loads):
            seen[(lane + t * width) * vec:(lane + t * width) * vec + vec] += 1
    assert (seen == 1).all()
    row = _row(n, case).astype(np.float32).astype(np.float64)  # the scores the kernel holds (fp32)
    _same(_held_softmax_row(row, width, loads, vec, nz), _reference_row(row, nz), rtol=1e-5)


@pytest.mark.parametrize("lanes,vec,n", [(8, 8, 128), (32, 4, 100), (16, 1, 37), (32, 8, 520)])
@pytest.mark.parametrize("case", ROW_CASES)
@pytest.mark.parametrize("nz", [0, 1])
def test_strided_softmax_row_against_the_reference(lanes, vec, n, case, nz):
    """The strided forms' online (max, sum) pass, the shuffle butterfly and pass 2 give the reference's
    row softmax for the same rows as the held forms: the NaN a lane sees first and a +inf row included
    (a first NaN used to be dropped, and a +inf row's masked scores came out 0)."""
    row = _row(n, case)
    _same(_strided_softmax_row(row, lanes, vec, nz), _reference_row(row, nz))


# ---------------------------------------------------------------- grouped-query attention (kv_groups)
def _grouped(kt=0, dtype="float16", h=8, groups=4, d=64, s=16):
    k = (2, h // groups, d, s) if kt else (2, h // groups, s, d)
    return Signature.make("Attention", [(2, h, s, d), k, (2, h // groups, s, d)], [dtype] * 3,
                          {"kv_groups": groups, "k_transposed": kt})


def test_grouped_query_runs_the_plain_plan_and_instances():
    """A grouped signature's plan, applicability and kernel instance are its ungrouped signature's: every
    family reads K and V with Q's heads after the repeat."""
    from graphopt.ops.attention import ungrouped

    for kt in (0, 1):
        sig = _grouped(kt)
        assert attention_plan(sig) == attention_plan(ungrouped(sig))
        for cand in attention_candidates():
            assert cand.applies(sig) == cand.applies(ungrouped(sig)), cand.key()
            if cand.applies(sig) is None:
                assert cand.kernels(sig) == cand.kernels(ungrouped(sig))
    assert candidate_from_key("Attention", "flash_mma:hd=64,bn=64,stages=2").applies(_grouped()) is None


@pytest.mark.parametrize("kt", [0, 1])
def test_repeat_kv_heads_hands_the_kernels_each_head_repeated(kt):
    """The grouped lowering repeats each K/V head kv_groups times into its workspace (K at 0, V 256-aligned
    after it; poisoned first) and runs the plain launch on them; the inputs are not touched."""
    from graphopt.kernels.attention_plan import repeat_kv_heads

    sig = _grouped(kt, groups=4, h=8, d=24, s=7)
    seen = {}

    def launch(inputs, outputs):
        seen["in"] = [None if a is None else a.copy() for a in inputs]
        outputs[0][...] = 1

    low = repeat_kv_heads(launch, sig)
    k_bytes = 2 * 8 * 7 * 24 * 2
    assert low.workspace_bytes == 2 * (-(-k_bytes // 256) * 256) and low.capturable
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 8, 7, 24)).astype(np.float16)
    k = rng.standard_normal((2, 2, 24, 7) if kt else (2, 2, 7, 24)).astype(np.float16)
    v = rng.standard_normal((2, 2, 7, 24)).astype(np.float16)
    before = [a.copy() for a in (q, k, v)]
    ws = np.full(low.workspace_bytes, 0xFF, np.uint8)  # NaN patterns everywhere
    y = np.full((2, 8, 7, 24), np.nan, np.float16)
    low.launch([q, k, v, None], [y], ws)
    got_q, got_k, got_v, got_m = seen["in"]
    assert np.array_equal(got_q, q) and got_m is None and got_k.dtype == np.float16
    assert np.array_equal(got_k, np.repeat(k, 4, axis=1)) and np.array_equal(got_v, np.repeat(v, 4, axis=1))
    assert all(np.array_equal(a, b) for a, b in zip((q, k, v), before)) and (y == 1).all()
    with pytest.raises(TuningError, match=r"K must be \[2, 2"):
        low.launch([q, np.repeat(k, 4, axis=1), v, None], [y], ws)


def test_repeat_kv_heads_gives_a_library_lowering_its_workspace_and_skips_its_barrier(monkeypatch):
    """A lowering with a workspace and a barrier (a cuDNN plan's): it gets the region after K and V, and runs
    without the barrier (the copies before it are ordinary launches); outputs, capture, layouts, versions kept."""
    from graphopt.kernels.attention_plan import repeat_kv_heads
    from graphopt.lowering import barrier
    from graphopt.lowering.contract import Lowering

    calls = []
    monkeypatch.setattr(barrier, "barrier", lambda: calls.append("barrier"))
    sig = _grouped(0, dtype="float32", groups=2, h=4, d=8, s=3)

    def launch(inputs, outputs, workspace):
        calls.append(("launch", inputs[1].shape, workspace.size))

    inner = Lowering(launch=launch, workspace_bytes=1000, barrier=True, capturable=False, layouts=("rowmajor",) * 5,
                     versions=(("cudnn", "1"),))
    low = repeat_kv_heads(inner, sig)
    kv = 2 * 4 * 3 * 8 * 4  # each repeated tensor's bytes (fp32), 768: already 256-aligned
    assert low.workspace_bytes == 2 * kv + 1000 and not low.barrier and not low.capturable
    assert low.layouts == inner.layouts and low.versions == inner.versions
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 4, 3, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 3, 8)).astype(np.float32) for _ in range(2))
    low.launch([q, k, v, None], [np.zeros_like(q)], np.zeros(low.workspace_bytes, np.uint8))
    assert calls == [("launch", (2, 4, 3, 8), 1000)]


def test_grouped_query_own_lowering_matches_the_reference_on_numpy():
    """End to end on the CPU: the repeat feeding the reference's plain computation equals the op's
    grouped reference (what the GPU check compares each lowering with)."""
    from graphopt.kernels.attention_plan import repeat_kv_heads

    schema = get_schema("Attention")
    sig = _grouped(0, dtype="float32", h=6, groups=3, d=8, s=5)
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 6, 5, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 5, 8)).astype(np.float32) for _ in range(2))

    def plain(inputs, outputs):
        outputs[0][...] = schema.reference(list(inputs), {})[0]

    low = repeat_kv_heads(plain, sig)
    y = np.full((2, 6, 5, 8), np.nan, np.float32)
    low.launch([q, k, v, None], [y], np.zeros(low.workspace_bytes, np.uint8))
    assert np.allclose(y, schema.reference([q, k, v, None], {"kv_groups": 3})[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows,groups", [(1, 2), (6, 4), (3, 8)])
def test_repeat_copies_write_every_block_once_per_group(rows, groups):
    """The strided copies of the device path, run by a byte-level cudaMemcpy2D emulator: [rows, row] becomes
    [rows, groups, row] (np.repeat on axis 0 of the blocks), every destination byte written once."""
    from graphopt.kernels.attention_plan import repeat_copies

    row = 40
    mem = np.zeros(4096, np.uint8)
    src, dst = 8, 1024
    mem[src:src + rows * row] = np.random.default_rng(rows).integers(1, 255, rows * row, dtype=np.uint8)
    written = np.zeros_like(mem)
    for d, dpitch, s, spitch, width, height in repeat_copies(dst, src, row, rows, groups):
        for r in range(height):
            mem[d + r * dpitch:d + r * dpitch + width] = mem[s + r * spitch:s + r * spitch + width]
            written[d + r * dpitch:d + r * dpitch + width] += 1
    blocks = mem[src:src + rows * row].reshape(rows, 1, row)
    assert np.array_equal(mem[dst:dst + rows * groups * row].reshape(rows, groups, row), np.repeat(blocks, groups, axis=1))
    assert (written[dst:dst + rows * groups * row] == 1).all() and written.sum() == rows * groups * row
