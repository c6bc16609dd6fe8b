"""Every Attention lowering config against graphopt's float64 reference on the GPU.

Marker ``gpu``; the module skips without a device. The sweep covers odd sequence lengths (1, 37,
257, Sq != Skv), head dims 16 (the committed test exports), 64 and 128 (and Dv != D), K given
plain or transposed, no mask, a BERT-style additive padding mask [B, 1, 1, Skv], a bool mask
[B, 1, Sq, Skv], causal (alone and with a mask), in fp16 and fp32. Fully masked rows must give
NaN, or 0 with nan_to_zero, as the reference does. The cuBLAS lowering is also run inside a CUDA
graph capture. ``GRAPHOPT_TEST_CANDIDATES=<text>`` keeps the candidates whose key contains it (a device
call that checks new configurations only, e.g. ``flash_mma:hd=64``; pytest's ``-k`` takes no ``=``).
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

from graphopt.kernels.attention import attention_candidates as _all_candidates  # noqa: E402
from graphopt.lowering.contract import Signature  # noqa: E402
from graphopt.kernels.source import device_arch, prebuild  # noqa: E402
from graphopt.ops import get_schema  # noqa: E402

ONLY = os.environ.get("GRAPHOPT_TEST_CANDIDATES", "")


def attention_candidates():
    """Every Attention candidate, or those whose key contains ``GRAPHOPT_TEST_CANDIDATES``."""
    return [c for c in _all_candidates() if ONLY in c.key()]


TOL = {"float16": 1e-2, "float32": 1e-5}  # max |err| / max |ref|
B, H = 2, 3
LENGTHS = ((1, 1), (37, 37), (257, 257), (19, 100))
HEADS = ((16, 16), (64, 64), (128, 128), (64, 32))
# (name, mask kind, mask shape builder, attrs)
MASKS = [
    ("none", "none", None, {}),
    ("pad", "additive", lambda sq, skv: (B, 1, 1, skv), {}),
    ("bool", "bool", lambda sq, skv: (B, 1, sq, skv), {}),
    ("causal", "none", None, {"causal": 1}),
    ("causal_pad_nz", "additive", lambda sq, skv: (B, 1, 1, skv), {"causal": 1, "nan_to_zero": 1}),
]


def _inputs(sq, skv, d, dv, kt, kind, mshape, dtype, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, sq, d)).astype(dtype)
    k = rng.standard_normal((B, H, d, skv) if kt else (B, H, skv, d)).astype(dtype)
    v = rng.standard_normal((B, H, skv, dv)).astype(dtype)
    ins = [q, k, v]
    if kind == "additive":  # padding: the last third of batch item 1's keys masked out
        m = np.zeros(mshape, dtype=dtype)
        m[1, ..., skv - skv // 3:] = -10000.0
        ins.append(m)
    elif kind == "bool":
        m = rng.random(mshape) < 0.7
        m[..., 0] = True
        ins.append(m)
    return ins


def _sig(ins, kt, kind, attrs):
    dts = [str(a.dtype) for a in ins]
    return Signature.make("Attention", [a.shape for a in ins], dts,
                          {"k_transposed": kt, "mask_kind": kind, **attrs})


def _cases():
    for li, (sq, skv) in enumerate(LENGTHS):
        for hi, (d, dv) in enumerate(HEADS):
            for mi, (name, kind, mshape, attrs) in enumerate(MASKS):
                for dtype in ("float16", "float32"):
                    kt = (li + hi + mi) % 2  # both K layouts over the sweep
                    ins = _inputs(sq, skv, d, dv, kt, kind, mshape and mshape(sq, skv), dtype, 0)
                    sig = _sig(ins, kt, kind, attrs)
                    for cand in attention_candidates():
                        if cand.applies(sig, (9, 0)) is None:
                            yield pytest.param(sq, skv, d, dv, kt, kind, mshape, attrs, dtype, cand,
                                               id=f"{sq}x{skv}-d{d}v{dv}-kt{kt}-{name}-{dtype}-{cand.key()}")


def _run(cand, sig, ins, shape=None):
    prebuild(cand.kernels(sig))
    launch = cand.build(sig, device_arch())
    dev = [None if a is None else cupy.asarray(a) for a in ins]
    shape = shape or ins[0].shape[:-1] + (ins[2].shape[-1],)
    outs = []
    for _ in range(2):
        y = cupy.full(shape, cupy.nan, dtype=ins[0].dtype)
        launch(dev, [y])
        cupy.cuda.get_current_stream().synchronize()
        outs.append(cupy.asnumpy(y).astype(np.float64))
    return outs


def _compare(key, got, again, ref, dtype):
    assert np.array_equal(np.isnan(got), np.isnan(ref)), f"{key}: NaN pattern differs from the reference"
    assert np.array_equal(np.nan_to_num(got), np.nan_to_num(again)), f"{key}: a second launch differs"
    g, r = np.nan_to_num(got), np.nan_to_num(ref)
    err = np.abs(g - r).max() / max(np.abs(r).max(), 1e-30)
    assert err <= TOL[dtype], f"{key} {dtype}: max error {err:.2e} > {TOL[dtype]}"


@pytest.mark.gpu
@pytest.mark.parametrize("sq,skv,d,dv,kt,kind,mshape,attrs,dtype,cand", list(_cases()))
def test_attention_candidate(sq, skv, d, dv, kt, kind, mshape, attrs, dtype, cand):
    ins = _inputs(sq, skv, d, dv, kt, kind, mshape and mshape(sq, skv), dtype, zlib.crc32(cand.key().encode()))
    sig = _sig(ins, kt, kind, attrs)
    ref = get_schema("Attention").reference([a.astype(np.float64) if a.dtype != bool else a for a in ins],
                                            dict(sig.attrs))[0].astype(np.float64)
    got, again = _run(cand, sig, ins)
    _compare(cand.key(), got, again, ref, dtype)


def _vector_softmax_cases():
    """The 16-byte softmax loads (``cublas_softmax:...,vec=``) need Skv a multiple of the vector: the
    sweep's lengths are odd or 100, so this adds 520 keys (65 vectors of 8: one to four warps; 130 of
    4 in fp32: one to eight) and 33 queries, every mask."""
    for name, kind, mshape, attrs in MASKS:
        for dtype in ("float16", "float32"):
            ins = _inputs(33, 520, 64, 64, 0, kind, mshape and mshape(33, 520), dtype, 0)
            sig = _sig(ins, 0, kind, attrs)
            for cand in attention_candidates():
                if cand.param("vec") and cand.applies(sig, (9, 0)) is None:
                    yield pytest.param(name, kind, mshape, attrs, dtype, cand, id=f"{name}-{dtype}-{cand.key()}")


@pytest.mark.gpu
@pytest.mark.parametrize("name,kind,mshape,attrs,dtype,cand", list(_vector_softmax_cases()))
def test_vector_softmax(name, kind, mshape, attrs, dtype, cand):
    ins = _inputs(33, 520, 64, 64, 0, kind, mshape and mshape(33, 520), dtype, zlib.crc32(cand.key().encode()))
    sig = _sig(ins, 0, kind, attrs)
    ref = get_schema("Attention").reference([a.astype(np.float64) if a.dtype != bool else a for a in ins],
                                            dict(sig.attrs))[0].astype(np.float64)
    got, again = _run(cand, sig, ins)
    _compare(cand.key(), got, again, ref, dtype)


HELD_KEYS = {"float16": (64, 128, 512, 2048, 4096), "float32": (32, 128, 1024)}  # (lanes or threads) x loads x 16-byte vectors


def _held_softmax_cases():
    """``cublas_softmax:lanes=,vec=,loads=`` and ``warps=,vec=,loads=`` (rows held in registers) take rows of
    exactly lanes (or 32 x warps) x loads vectors, which the sweep's lengths never are: rows of 8 to 512
    vectors, 33 queries, every mask (the padding mask empties no row; causal with it and nan_to_zero
    does not either), both dtypes."""
    for dtype, lengths in HELD_KEYS.items():
        for skv in lengths:
            for name, kind, mshape, attrs in MASKS:
                ins = _inputs(33, skv, 64, 64, 0, kind, mshape and mshape(33, skv), dtype, 0)
                sig = _sig(ins, 0, kind, attrs)
                for cand in attention_candidates():
                    if cand.param("loads") and cand.applies(sig, (9, 0)) is None:
                        yield pytest.param(skv, name, kind, mshape, attrs, dtype, cand,
                                           id=f"{skv}-{name}-{dtype}-{cand.key()}")


@pytest.mark.gpu
@pytest.mark.parametrize("skv,name,kind,mshape,attrs,dtype,cand", list(_held_softmax_cases()))
def test_held_softmax(skv, name, kind, mshape, attrs, dtype, cand):
    ins = _inputs(33, skv, 64, 64, 0, kind, mshape and mshape(33, skv), dtype, zlib.crc32(cand.key().encode()))
    sig = _sig(ins, 0, kind, attrs)
    ref = get_schema("Attention").reference([a.astype(np.float64) if a.dtype != bool else a for a in ins],
                                            dict(sig.attrs))[0].astype(np.float64)
    got, again = _run(cand, sig, ins)
    _compare(cand.key(), got, again, ref, dtype)


LAYOUTS_BSHD = {"qkv": (1, 0), "y": (0, 1), "qkv_y": (1, 1)}  # (qkv_bshd, y_bshd)


def _bshd_cases():
    """qkv_bshd=1 (Q, K, V as [B, S, H, D]) and y_bshd=1 (Y as [B, Sq, H, Dv]), alone and together:
    every own candidate that reads / writes them, odd and GPT-2 lengths, head dims 64 and 16 (32 for Dv
    in the SIMT kernel), the masks above, fp16 and fp32."""
    for sq, skv, d, dv in ((37, 37, 64, 64), (128, 128, 64, 64), (19, 100, 16, 16), (33, 65, 64, 32)):
        for name, kind, mshape, attrs in MASKS:
            for dtype in ("float16", "float32"):
                for lname, (qkv, yb) in LAYOUTS_BSHD.items():
                    ins = _inputs(sq, skv, d, dv, 0, kind, mshape and mshape(sq, skv), dtype, 0)
                    given = [np.ascontiguousarray(np.swapaxes(a, 1, 2)) for a in ins[:3]] if qkv else ins[:3]
                    sig = _sig(given + ins[3:], 0, kind, {**attrs, "qkv_bshd": qkv, "y_bshd": yb})
                    for cand in attention_candidates():
                        if cand.applies(sig, (9, 0)) is None:
                            yield pytest.param(sq, skv, d, dv, kind, mshape, attrs, dtype, lname, cand,
                                               id=f"{sq}x{skv}-d{d}v{dv}-{name}-{dtype}-{lname}-{cand.key()}")


def _grouped_cases():
    """Grouped-query attention (kv_groups = 3: K and V with one head for Q's three): every own candidate that
    applies, after the heads' repeat into its workspace; both K layouts, masks, odd lengths, fp16 and fp32."""
    for (sq, skv), (d, dv), (name, kind, mshape, attrs) in (((37, 37), (64, 64), MASKS[3]), ((19, 100), (16, 16), MASKS[1]),
                                                              ((257, 257), (128, 128), MASKS[4]), ((1, 1), (64, 32), MASKS[0])):
        for dtype in ("float16", "float32"):
            for kt in (0, 1):
                ins = _grouped_inputs(sq, skv, d, dv, kt, kind, mshape and mshape(sq, skv), dtype, 0)
                sig = _sig(ins, kt, kind, {**attrs, "kv_groups": H})
                for cand in attention_candidates():
                    if cand.applies(sig, (9, 0)) is None:
                        yield pytest.param(sq, skv, d, dv, kt, kind, mshape, attrs, dtype, cand,
                                           id=f"{sq}x{skv}-d{d}v{dv}-kt{kt}-{name}-{dtype}-{cand.key()}")


def _grouped_inputs(sq, skv, d, dv, kt, kind, mshape, dtype, seed):
    ins = _inputs(sq, skv, d, dv, kt, kind, mshape, dtype, seed)
    ins[1], ins[2] = np.ascontiguousarray(ins[1][:, :1]), np.ascontiguousarray(ins[2][:, :1])  # one K/V head
    return ins


@pytest.mark.gpu
@pytest.mark.parametrize("sq,skv,d,dv,kt,kind,mshape,attrs,dtype,cand", list(_grouped_cases()))
def test_attention_candidate_reads_grouped_kv(sq, skv, d, dv, kt, kind, mshape, attrs, dtype, cand):
    ins = _grouped_inputs(sq, skv, d, dv, kt, kind, mshape and mshape(sq, skv), dtype, zlib.crc32(cand.key().encode()))
    sig = _sig(ins, kt, kind, {**attrs, "kv_groups": H})
    ref = get_schema("Attention").reference([a.astype(np.float64) if a.dtype != bool else a for a in ins],
                                            dict(sig.attrs))[0].astype(np.float64)
    got, again = _run(cand, sig, ins, shape=(B, H, sq, dv))
    _compare(cand.key(), got, again, ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("sq,skv,d,dv,kind,mshape,attrs,dtype,lname,cand", list(_bshd_cases()))
def test_attention_candidate_reads_bshd(sq, skv, d, dv, kind, mshape, attrs, dtype, lname, cand):
    qkv, yb = LAYOUTS_BSHD[lname]
    ins = _inputs(sq, skv, d, dv, 0, kind, mshape and mshape(sq, skv), dtype, zlib.crc32(cand.key().encode()) + 1)
    ref = get_schema("Attention").reference([a.astype(np.float64) if a.dtype != bool else a for a in ins],
                                            {"mask_kind": kind, **attrs})[0].astype(np.float64)
    given = [np.ascontiguousarray(np.swapaxes(a, 1, 2)) for a in ins[:3]] if qkv else ins[:3]
    sig = _sig(given + ins[3:], 0, kind, {**attrs, "qkv_bshd": qkv, "y_bshd": yb})
    got, again = _run(cand, sig, given + ins[3:], shape=(B, sq, H, dv) if yb else (B, H, sq, dv))
    if yb:
        got, again = np.swapaxes(got, 1, 2), np.swapaxes(again, 1, 2)
    _compare(cand.key(), got, again, ref, dtype)


def _packed(ins, kind, attrs, yb):
    """([B, S, 3, H, D] Q/K/V, None, None, mask...) of ins ([B, H, S, D] Q, K, V and the mask), and its signature."""
    packed = np.ascontiguousarray(np.stack([np.swapaxes(a, 1, 2) for a in ins[:3]], axis=2))
    given = [packed, None, None] + ins[3:]
    sig = Signature.make("Attention", [None if a is None else a.shape for a in given],
                         ["" if a is None else str(a.dtype) for a in given],
                         {"mask_kind": kind, **attrs, "qkv_bshd": 1, "qkv_packed": 1, "y_bshd": yb})
    return given, sig


def _packed_cases():
    """qkv_packed=1 (Q, K, V the thirds of one [B, S, 3, H, D] tensor), with Y plain or [B, S, H, D]:
    every own candidate that reads it, odd and GPT-2 lengths, head dims 16 and 64, the masks above."""
    for s, d in ((37, 64), (128, 64), (19, 16)):
        for name, kind, mshape, attrs in MASKS:
            for dtype in ("float16", "float32"):
                for yb in (0, 1):
                    _, sig = _packed(_inputs(s, s, d, d, 0, kind, mshape and mshape(s, s), dtype, 0), kind, attrs, yb)
                    for cand in attention_candidates():
                        if cand.applies(sig, (9, 0)) is None:
                            yield pytest.param(s, d, kind, mshape, attrs, dtype, yb, cand,
                                               id=f"{s}-d{d}-{name}-{dtype}-y{yb}-{cand.key()}")


@pytest.mark.gpu
@pytest.mark.parametrize("s,d,kind,mshape,attrs,dtype,yb,cand", list(_packed_cases()))
def test_attention_candidate_reads_packed_qkv(s, d, kind, mshape, attrs, dtype, yb, cand):
    ins = _inputs(s, s, d, d, 0, kind, mshape and mshape(s, s), dtype, zlib.crc32(cand.key().encode()) + 7)
    ref = get_schema("Attention").reference([a.astype(np.float64) if a.dtype != bool else a for a in ins],
                                            {"mask_kind": kind, **attrs})[0].astype(np.float64)
    given, sig = _packed(ins, kind, attrs, yb)
    got, again = _run(cand, sig, given, shape=(B, s, H, d) if yb else (B, H, s, d))
    if yb:
        got, again = np.swapaxes(got, 1, 2), np.swapaxes(again, 1, 2)
    _compare(cand.key(), got, again, ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("skv", [40, 128])  # 128: the held-row softmax applies too
@pytest.mark.parametrize("nz", [0, 1])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_fully_masked_rows(nz, dtype, skv):
    """Batch item 1 masks every key: NaN rows (as ONNX Softmax), or zeros with nan_to_zero."""
    sq, d = 9, 64
    ins = _inputs(sq, skv, d, d, 0, "none", None, dtype, 5)
    m = np.ones((B, 1, 1, skv), dtype=bool)
    m[1] = False
    ins.append(m)
    sig = _sig(ins, 0, "bool", {"nan_to_zero": nz})
    ref = get_schema("Attention").reference([a.astype(np.float64) if a.dtype != bool else a for a in ins],
                                            dict(sig.attrs))[0].astype(np.float64)
    assert np.isnan(ref[1]).all() != bool(nz)
    for cand in attention_candidates():
        if cand.applies(sig, (9, 0)) is None:
            got, again = _run(cand, sig, ins)
            _compare(cand.key(), got, again, ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("skv", [40, 128])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_rows_masked_with_a_finite_fill_are_uniform(dtype, skv):
    """A bool mask with HF's finite fill (mask_value = finfo(dtype).min, as an HF export of that dtype
    writes it): batch item 1 masks every key. In fp32 each of its rows then holds one huge finite score
    repeated (the scores are absorbed) and its softmax is uniform, the mean of V (a review caught the held
    forms' 2^(x log2 e - m log2 e) turning such rows NaN: m log2 e overflows); in fp16 (-65504) the
    scores survive the fill and the row is the unmasked softmax."""
    sq, d = 9, 64
    ins = _inputs(sq, skv, d, d, 0, "none", None, dtype, 7)
    m = np.ones((B, 1, 1, skv), dtype=bool)
    m[1] = False
    m[0, 0, 0, ::3] = False
    ins.append(m)
    sig = _sig(ins, 0, "bool", {"mask_value": float(np.finfo(dtype).min)})
    ref = get_schema("Attention").reference([a.astype(np.float64) if a.dtype != bool else a for a in ins],
                                            dict(sig.attrs))[0].astype(np.float64)
    assert np.isfinite(ref).all()
    for cand in attention_candidates():
        if cand.applies(sig, (9, 0)) is None:
            got, again = _run(cand, sig, ins)
            _compare(cand.key(), got, again, ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("skv", [40, 128])
@pytest.mark.parametrize("nz", [0, 1])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_nan_and_inf_scores_give_the_references_rows(nz, dtype, skv):
    """A NaN query (every score of its row NaN) and a +inf additive mask entry (batch item 1: one +inf
    score a row) make those rows' probabilities NaN, 0 with nan_to_zero (the reference's elementwise
    IsNaN / Where): every candidate agrees, whichever the tuner picks."""
    sq, d = 9, 64
    ins = _inputs(sq, skv, d, d, 0, "additive", (B, 1, 1, skv), dtype, 11)
    ins[0][0, 0, 2, 5] = np.nan
    ins[3][...] = 0
    ins[3][1, 0, 0, 3] = np.inf
    sig = _sig(ins, 0, "additive", {"nan_to_zero": nz})
    ref = get_schema("Attention").reference([a.astype(np.float64) for a in ins], dict(sig.attrs))[0].astype(np.float64)
    assert np.isnan(ref[0, 0, 2]).all() != bool(nz) and np.isnan(ref[1]).all() != bool(nz)
    for cand in attention_candidates():
        if cand.applies(sig, (9, 0)) is None:
            got, again = _run(cand, sig, ins)
            _compare(cand.key(), got, again, ref, dtype)


def _capture_and_replay(launch, dev, y, stream):
    """One eager launch (handle, workspace and kernels exist before the capture), one captured, then
    the graph replayed into ``y`` poisoned with NaN; on ``stream``, synchronised."""
    launch(dev, [y])
    stream.synchronize()
    stream.begin_capture()
    try:
        launch(dev, [y])
    finally:
        graph = stream.end_capture()
    y.fill(cupy.nan)
    graph.launch(stream)
    stream.synchronize()


@pytest.mark.gpu
def test_cublas_softmax_captures_and_replays():
    ins = _inputs(33, 33, 64, 64, 1, "additive", (B, 1, 1, 33), "float16", 11)
    sig = _sig(ins, 1, "additive", {"scale": 0.125, "causal": 1})
    cand = next(c for c in _all_candidates() if c.name == "cublas_softmax" and c.applies(sig, (9, 0)) is None)
    prebuild(cand.kernels(sig))
    launch = cand.build(sig, device_arch())
    dev = [cupy.asarray(a) for a in ins]
    y = cupy.zeros((B, H, 33, 64), dtype="float16")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        _capture_and_replay(launch, dev, y, stream)
    ref = get_schema("Attention").reference([a.astype(np.float64) for a in ins], dict(sig.attrs))[0]
    _compare(cand.key(), cupy.asnumpy(y).astype(np.float64), cupy.asnumpy(y).astype(np.float64), ref, "float16")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_cublas_softmax_over_bshd_captures_and_follows_moved_inputs(dtype):
    """The [B, S, H, D] path writes its GEMMs' pointer arrays on the stream (attn_batch_ptrs): a captured
    replay is right, and an eager launch on inputs at other addresses reads those, not the old ones."""
    ins = _inputs(37, 37, 64, 64, 0, "additive", (B, 1, 1, 37), dtype, 13)
    given = [np.ascontiguousarray(np.swapaxes(a, 1, 2)) for a in ins[:3]] + ins[3:]
    sig = _sig(given, 0, "additive", {"qkv_bshd": 1, "y_bshd": 1, "causal": 1})
    cand = next(c for c in _all_candidates() if c.name == "cublas_softmax" and c.applies(sig, (9, 0)) is None)
    prebuild(cand.kernels(sig))
    launch = cand.build(sig, device_arch())
    dev = [cupy.asarray(a) for a in given]
    y = cupy.zeros((B, 37, H, 64), dtype=dtype)
    plain = dict(sig.attrs) | {"qkv_bshd": 0, "y_bshd": 0}  # the reference on the [B, H, S, D] inputs
    ref = np.swapaxes(get_schema("Attention").reference([a.astype(np.float64) for a in ins], plain)[0], 1, 2)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        _capture_and_replay(launch, dev, y, stream)
        got = cupy.asnumpy(y).astype(np.float64)
        moved = [cupy.asarray(a) for a in given]  # new allocations, same values
        for a in dev[:3]:
            a.fill(cupy.nan)  # the old inputs poisoned: a stale pointer shows as NaN
        y2 = cupy.full((B, 37, H, 64), cupy.nan, dtype=dtype)
        launch(moved, [y2])
        stream.synchronize()
    _compare(cand.key(), got, got, ref, dtype)
    _compare(cand.key(), cupy.asnumpy(y2).astype(np.float64), got, ref, dtype)
