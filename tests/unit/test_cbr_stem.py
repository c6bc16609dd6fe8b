"""CBR's ``stem`` family (``stem_conv.cu``) on the CPU: where it applies (and the near misses), its
keys and declared layouts, what its launch refuses, and the kernel simulated thread by thread on the
real launch arguments (the weight staging into shared memory, each thread's index arithmetic, the
grid-stride loop, every load and store checked for bounds and alignment, every output written once)
against the float64 CBR reference. The GPU runs the kernel itself (tests/gpu/test_cbr_gpu.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_cbr_depthwise_sim import ACT, F32, _Memory, _placed, install_simulator  # noqa: E402

from graphopt.errors import TuningError  # noqa: E402
from graphopt.kernels import cbr_stem  # noqa: E402
from graphopt.kernels.cbr import cbr_candidates  # noqa: E402
from graphopt.kernels.registry import candidate_from_key  # noqa: E402
from graphopt.lowering.contract import Signature  # noqa: E402
from graphopt.ops import get_schema  # noqa: E402


def _sig(xs, ws, attrs, dtype="float16", bias=True, res=None):
    return Signature.make("CBR", [xs, ws, (ws[0],) if bias else None, res], [dtype] * 4, attrs)


def test_it_applies_to_few_input_channels_only_and_says_why_not():
    stem = _sig((2, 3, 224, 224), (32, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "activation": "Clip"})
    assert cbr_stem.stem_reason(stem) is None and cbr_stem.stem_reason(stem, 32) is None
    assert "input channels" in cbr_stem.stem_reason(_sig((2, 5, 9, 9), (8, 5, 3, 3), {}))
    assert "grouped" in cbr_stem.stem_reason(_sig((2, 4, 9, 9), (8, 2, 3, 3), {"group": 2}))
    assert "residual" in cbr_stem.stem_reason(_sig((2, 3, 9, 9), (8, 3, 1, 1), {}, res=(2, 8, 9, 9)))
    assert "multiple of 16" in cbr_stem.stem_reason(_sig((2, 3, 9, 9), (24, 3, 3, 3), {}), 16)
    assert "shared memory" in cbr_stem.stem_reason(_sig((1, 4, 64, 64), (256, 4, 7, 7), {}))  # 50 KB of fp32 weights
    cands = [c for c in cbr_candidates() if c.name == "stem"]
    assert {c.key() for c in cands} == ({f"stem:mv={m},y={y}" for m in (8, 16, 32) for y in ("nhwc", "nchw")}
                                        | {f"stem:mv={m},px={p},y={y}" for m, p in ((8, 4), (16, 4), (32, 2)) for y in ("nhwc", "nchw")})
    for c in cands:
        assert candidate_from_key("CBR", c.key()) == c
        y = dict(c.params)["y"].upper()
        assert c.layouts(stem) == ("NCHW", "NCHW", y, y, y)
    assert [c.applies(_sig((2, 3, 9, 9), (24, 3, 3, 3), {})) is None for c in cands] == [True] * 4 + [False] * 8  # mv=8 only


def test_what_its_launch_refuses(monkeypatch):
    sig = _sig((2, 3, 9, 8), (16, 3, 3, 3), {"pads": [1, 1, 1, 1]})
    launches = []
    monkeypatch.setattr(cbr_stem, "get_kernel", lambda source, expr: lambda grid, block, args, shared_mem=0: launches.append(expr))
    low = cbr_stem.StemConv("stem", (("mv", 8), ("y", "nhwc"))).build(sig, "sm_90")
    mem = _Memory()
    x, w = _placed(mem, np.zeros((2, 3, 9, 8), np.float16), "NCHW"), _placed(mem, np.zeros((16, 3, 3, 3), np.float16), "NCHW")
    y_nchw = _placed(mem, np.zeros((2, 16, 9, 8), np.float16), "NCHW")
    with pytest.raises(TuningError, match="NHWC"):
        low.launch([x, w, None], [y_nchw], None)
    y = _placed(mem, np.zeros((2, 16, 9, 8), np.float16), "NHWC", 8)
    with pytest.raises(TuningError, match="16-byte"):
        low.launch([x, w, None], [y], None)
    y = _placed(mem, np.zeros((2, 16, 9, 8), np.float16), "NHWC")
    with pytest.raises(TuningError, match="W must be"):
        low.launch([x, _placed(mem, np.zeros((16, 3, 5, 5), np.float16), "NCHW"), None], [y], None)
    with pytest.raises(TuningError, match="X must be"):
        low.launch([_placed(mem, np.zeros((2, 3, 9, 8), np.float16), "NHWC"), w, None], [y], None)
    assert launches == []
    low.launch([x, w, None], [y], None)
    assert launches == ["stem_conv<half_t,8,3,1>"]  # a 3x3 window: its unrolled instance


def _simulate(mem, T, MV, KS, PX, grid, block, a, shared_mem, launches):
    """One launch of stem_conv<T, MV, KS, PX>, block by block and thread by thread."""
    it = np.dtype(T).itemsize
    X, Wt, Bias, Y = (0 if isinstance(v, np.integer) else v.data.ptr for v in (a["X"], a["Wt"], a["Bias"], a["Y"]))
    N, C, H, W, M, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, y_nhwc, act = (int(a[k]) for k in (
        "N", "C", "H", "W", "M", "OH", "OW", "KH", "KW", "sh", "sw", "ph", "pw", "dh", "dw", "y_nhwc", "act"))
    alpha, beta, lo, hi = (F32(a[k]) for k in ("act_alpha", "act_beta", "lo", "hi"))
    assert KS == (KH if KH == KW and KH in cbr_stem.UNROLLED else 0), "the wrong window instance"
    K = C * KH * KW
    assert shared_mem == 4 * (K * M + M), "the shared memory is not the staged weights' and bias' size"
    smem = np.full(K * M + M, np.nan, np.float32)  # what no thread staged reads NaN
    for i in range(M * K):  # the staging loop (every block stages the same)
        m, k = divmod(i, K)
        smem[k * M + m] = F32(mem.load(Wt + i * it, T, 1, it)[0])
    for m in range(M):
        smem[K * M + m] = F32(mem.load(Bias + m * it, T, 1, it)[0]) if Bias else F32(0)
    OWG = -(-OW // PX)  # pixel slots per output row
    slots = N * OH * OWG
    total = slots * (M // MV)
    written = np.zeros(N * OH * OW * (M // MV), int)  # per (pixel, channel group)
    stride = grid[0] * block[0]
    for start in range(min(stride, total)):
        for idx in range(start, total, stride):
            groups = M // MV  # Y NHWC: the channel group fastest (contiguous stores); NCHW: the pixel slot
            q, m0 = (idx // groups, (idx % groups) * MV) if y_nhwc else (idx % slots, (idx // slots) * MV)
            ow0, rest = (q % OWG) * PX, q // OWG
            oh, n = rest % OH, rest // OH
            acc = [[smem[K * M + m0 + j] for j in range(MV)] for _ in range(PX)]
            k = 0
            for c in range(C):
                for r in range(KH):
                    ih = oh * sh - ph + r * dh
                    for s in range(KW):
                        off = k * M + m0
                        assert off % 4 == 0 and off + MV <= K * M, "a misaligned or outside float4 shared load"
                        wk = smem[off:off + MV]
                        assert not np.isnan(wk).any(), "a weight the block did not stage"
                        for i in range(PX):
                            iw = (ow0 + i) * sw - pw + s * dw
                            if 0 <= ih < H and 0 <= iw < W:  # (the kernel reads a zero there: the same sums)
                                x = F32(mem.load(X + (((n * C + c) * H + ih) * W + iw) * it, T, 1, it)[0])
                                acc[i] = [F32(acc[i][j] + x * wk[j]) for j in range(MV)]
                        k += 1
            for i in range(PX):
                ow = ow0 + i
                if ow >= OW:
                    break
                p = (n * OH + oh) * OW + ow
                written[p * groups + m0 // MV] += 1
                out = np.array([ACT[act](F32(v), alpha, beta, lo, hi) for v in acc[i]], T)
                if y_nhwc:
                    mem.store(Y + (p * M + m0) * it, out, min(16, it * MV))
                else:
                    for j in range(MV):
                        mem.store(Y + (((n * M + m0 + j) * OH + oh) * OW + ow) * it, out[j:j + 1], it)
    assert (written == 1).all(), "an output not written exactly once"
    launches.append((MV, grid[0]))  # (KS checked above)


@pytest.fixture()
def simulated(monkeypatch):
    return install_simulator(monkeypatch, cbr_stem, "stem_conv", _simulate)


CASES = [  # x, w, attrs, dtype, options
    ((2, 3, 9, 8), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "activation": "Clip", "clip_min": 0.0, "clip_max": 0.5},
     "float16", {"mv": 8, "y": "nhwc"}),
    ((2, 3, 9, 8), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "activation": "SiLU"}, "float16", {"mv": 16, "y": "nchw"}),
    ((1, 3, 11, 10), (8, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2], "activation": "Relu"}, "float32", {"mv": 8, "y": "nhwc"}),
    ((1, 1, 7, 6), (32, 1, 3, 3), {"pads": [0, 2, 1, 0], "dilations": [2, 1]}, "float32", {"mv": 32, "y": "nchw", "bias": False}),
    ((2, 4, 13), (16, 4, 5), {"pads": [2, 1], "strides": [2]}, "float16", {"mv": 8, "y": "nhwc"}),  # 1-D
    ((3, 3, 5, 5), (16, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", {"mv": 8, "y": "nhwc", "max_blocks": 1}),  # grid-stride
    # px: OW = 5 and 6 leave a last slot short of px pixels; NHWC and NCHW; a 7x7 and a run-time window
    ((2, 3, 9, 10), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "activation": "Clip", "clip_min": 0.0, "clip_max": 0.5},
     "float16", {"mv": 16, "px": 4, "y": "nchw"}),
    ((2, 3, 9, 12), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "activation": "SiLU"}, "float16", {"mv": 8, "px": 4, "y": "nhwc"}),
    ((1, 3, 11, 10), (32, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}, "float32", {"mv": 32, "px": 2, "y": "nhwc"}),
    ((1, 2, 7, 9), (16, 2, 2, 3), {"pads": [0, 1, 1, 0], "dilations": [2, 1]}, "float32",
     {"mv": 16, "px": 4, "y": "nchw", "bias": False, "max_blocks": 1}),
]


@pytest.mark.parametrize("xs, ws, attrs, dtype, opts", CASES, ids=lambda v: None)
def test_the_kernel_simulated_thread_by_thread(simulated, monkeypatch, xs, ws, attrs, dtype, opts):
    mem, launches = simulated
    if "max_blocks" in opts:
        monkeypatch.setattr(cbr_stem, "MAX_BLOCKS", opts["max_blocks"])
    bias = opts.get("bias", True)
    sig = _sig(xs, ws, attrs, dtype, bias)
    cand = cbr_stem.StemConv("stem", (("mv", opts["mv"]),) + ((("px", opts["px"]),) if "px" in opts else ()) + (("y", opts["y"]),))
    assert cand.applies(sig) is None
    low = cand.build(sig, "sm_90")
    rng = np.random.default_rng(len(xs) * 7 + ws[0])
    x, w = rng.standard_normal(xs).astype(dtype), (rng.standard_normal(ws) / 3).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype) if bias else None
    ref = get_schema("CBR").reference([x.astype(np.float64), w.astype(np.float64),
                                       None if b is None else b.astype(np.float64), None], attrs)[0]
    ins = [_placed(mem, x, "NCHW"), _placed(mem, w, "NCHW"), None if b is None else _placed(mem, b, "NCHW")]
    y = _placed(mem, np.full(np.shape(ref), np.nan, dtype), opts["y"].upper())
    low.launch(ins, [y], None)
    (mv, blocks), = launches
    assert mv == opts["mv"] and blocks <= opts.get("max_blocks", cbr_stem.MAX_BLOCKS)
    tol = 2e-2 if dtype == "float16" else 1e-5
    got = np.asarray(y).astype(np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
