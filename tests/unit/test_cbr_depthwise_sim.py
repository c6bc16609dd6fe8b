"""``depthwise_nhwc.cu`` simulated block by block and thread by thread on the CPU, driven by the real
launch arguments: the weight tile's staging into shared memory, each thread's index arithmetic and
the grid-stride loop as the kernel writes them, with every vector load and store checked for its
alignment and its bounds (shared loads against the tile the block staged), every output vector
written exactly once, against the float64 CBR reference. Complements
``test_cbr_depthwise.py`` (a vectorised model bound by parameter name); the GPU runs the kernel itself
(tests/gpu/test_cbr_gpu.py). Small shapes: the simulation is a Python loop per thread."""

from __future__ import annotations

import ctypes
import math
import re
import types

import numpy as np
import pytest

from graphopt.kernels import cbr_depthwise
from graphopt.kernels.divisor import fast_div
from graphopt.kernels.source import KERNEL_DIR
from graphopt.lowering.contract import Signature
from graphopt.lowering.layout import is_layout
from graphopt.ops import get_schema

F32 = np.float32


class _Dev(np.ndarray):
    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


def kernel_params(source: str, kernel: str) -> list[str]:
    """The parameter names of ``kernel`` in ``source``, in order (a launch's arguments bind to them)."""
    body = re.search(kernel + r"\((.*?)\)\s*\{", (KERNEL_DIR / source).read_text(), re.S).group(1)
    return [p.strip().split()[-1].lstrip("*") for p in body.split(",")]


def install_simulator(monkeypatch, module, kernel: str, simulate):
    """``module.get_kernel`` replaced by one whose ``kernel<T, i0, i1, ...>`` launches run
    ``simulate(mem, T, i0, i1, ..., grid, block, args_by_name, shared_mem, launches)`` on the CPU.
    Returns (the memory checker, the launches list)."""
    mem, launches = _Memory(), []
    names = kernel_params(module.SOURCE, kernel)

    def get_kernel(source, expr):
        m = re.fullmatch(kernel + r"<(half_t|float)((?:,\d+)*)>", expr)
        T = np.float16 if m.group(1) == "half_t" else np.float32
        ints = [int(v) for v in m.group(2).split(",")[1:]]

        def run(grid, block, args, shared_mem=0):
            assert len(args) == len(names)
            simulate(mem, T, *ints, grid, block, dict(zip(names, args)), shared_mem, launches)

        return run

    monkeypatch.setattr(module, "get_kernel", get_kernel)
    return mem, launches


def _sigmoid(v):
    return F32(1) / (F32(1) + F32(math.exp(-float(v))))


ACT = {  # common.cuh's apply_act, per code, in fp32
    0: lambda x, a, b, lo, hi: x,
    1: lambda x, a, b, lo, hi: max(x, F32(0)),
    2: lambda x, a, b, lo, hi: min(max(x, lo), hi),
    3: lambda x, a, b, lo, hi: x if x >= 0 else F32(a * x),
    4: lambda x, a, b, lo, hi: _sigmoid(x),
    5: lambda x, a, b, lo, hi: F32(x * _sigmoid(x)),
    6: lambda x, a, b, lo, hi: F32(x * min(max(x * F32(1 / 6) + F32(0.5), F32(0)), F32(1))),
    7: lambda x, a, b, lo, hi: F32(x * min(max(F32(a * x + b), F32(0)), F32(1))),
    8: lambda x, a, b, lo, hi: F32(0.5 * x * (1 + math.erf(x * 0.70710678118654752))),
    9: lambda x, a, b, lo, hi: F32(0.5 * x * (1 + math.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))),
    10: lambda x, a, b, lo, hi: min(max(F32(a * x + b), F32(0)), F32(1)),
    11: lambda x, a, b, lo, hi: F32(x * _sigmoid(F32(1.702) * x)),
}


class _Memory:
    """The byte ranges handed to the kernel; loads and stores outside them, or misaligned, fail."""

    def __init__(self):
        self.ranges = []

    def add(self, a):
        p = a.__array_interface__["data"][0]
        self.ranges.append((p, p + a.itemsize + sum((d - 1) * s for d, s in zip(a.shape, a.strides))))

    def _check(self, ptr, nbytes, align):
        assert ptr % align == 0, f"misaligned {nbytes}-byte access at {ptr:#x} (needs {align})"
        assert any(lo <= ptr and ptr + nbytes <= hi for lo, hi in self.ranges), f"out of bounds at {ptr:#x}"

    def load(self, ptr, dtype, count, align):
        nbytes = np.dtype(dtype).itemsize * count
        self._check(ptr, nbytes, align)
        return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=dtype).copy()

    def store(self, ptr, vals, align):
        self._check(ptr, vals.nbytes, align)
        ctypes.memmove(ptr, vals.tobytes(), vals.nbytes)


def weight_slot(ch: int, tap: int, TCW: int, VEC: int) -> int:
    """depthwise_nhwc.cu's ``weight_slot``: where channel ``ch`` of a tile sits in the shared fp32 weights."""
    if VEC % 4 == 0:
        cvl, v = divmod(ch, VEC)
        return tap * TCW + ((v >> 2) * (TCW // VEC) + cvl) * 4 + (v & 3)
    return tap * TCW + ch


def tap_weights(smem, tap: int, tx: int, TCV: int, VEC: int):
    """depthwise_nhwc.cu's ``tap_weights``: thread ``tx``'s VEC weights of ``tap`` (16-byte loads where VEC
    is a multiple of 4), each load checked inside the tile and aligned, and staged."""
    row = tap * TCV * VEC
    if VEC % 4 == 0:
        starts = [row + (q * TCV + tx) * 4 for q in range(VEC // 4)]
        assert all(st % 4 == 0 for st in starts), "a misaligned 16-byte shared load"
        offs = [st + e for st in starts for e in range(4)]
    else:
        offs = [row + tx * VEC + v for v in range(VEC)]
    assert max(offs) < smem.size, "a shared load outside the tile"
    wv = smem[offs]
    assert not np.isnan(wv).any(), "a shared weight the block did not stage"
    return wv


def _quarter_warp_conflicts(TCV: int, VEC: int, float4_index) -> int:
    """Bank conflicts of one tap's 16-byte weight loads over a 256-thread block of the per-pixel form: a
    warp's 16-byte shared loads are served a quarter-warp (8 threads) at a time, and two threads of a
    quarter that read different addresses on a common bank conflict (the same address is a broadcast)."""
    PY = 256 // TCV
    conflicts = 0
    for q in range(VEC // 4):
        for quarter in range(0, 256, 8):
            addrs = {float4_index(q, t % TCV) for t in range(quarter, quarter + 8) if t // TCV < PY}
            banks = [b for a in addrs for b in range(4 * a % 32, 4 * a % 32 + 4)]
            conflicts += len(banks) != len(set(banks))
    return conflicts


@pytest.mark.parametrize("C", [16, 32, 40, 96, 144, 160, 192, 240, 384, 576, 960])
def test_weight_loads_conflict_only_where_a_quarter_warp_spans_two_pixels(C):
    """The per-pixel form's weight loads (``tap_weights``, at the launcher's channel tile for fp16) share no
    bank within a quarter-warp where a tile has at most 8 channel vectors or a multiple of 8 (neighbouring
    threads read neighbouring float4s); elsewhere only a quarter that spans two pixels can conflict. The
    first layout, each thread's 8 weights as two neighbouring float4s (32 bytes a thread), put a quarter's
    eight threads on 16 banks twice: conflicts wherever a tile has more than 4 channel vectors
    (bench/NOTES_kernels.md, sixteenth session)."""
    VEC = 8
    TCV, _ = cbr_depthwise.tile(types.SimpleNamespace(C=C, KH=3, KW=3), VEC)
    now = _quarter_warp_conflicts(TCV, VEC, lambda q, tx: q * TCV + tx)
    first_layout = _quarter_warp_conflicts(TCV, VEC, lambda q, tx: tx * VEC // 4 + q)
    if TCV <= 8 or TCV % 8 == 0:
        assert now == 0
    else:
        assert 0 < now < first_layout
    assert (first_layout > 0) == (TCV > 4)


def _simulate(mem, T, VEC, KH_, KW_, RY, grid, block, a, shared_mem, launches):
    """One launch of depthwise_nhwc<T, VEC, KH_, KW_, RY>, block by block and thread by thread."""
    it = np.dtype(T).itemsize
    X, Wt, Bias, Y = (0 if isinstance(v, np.integer) else v.data.ptr for v in (a["X"], a["Wt"], a["Bias"], a["Y"]))
    N, C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, TCV, act = (
        int(a[k]) for k in ("N", "C", "H", "W", "OH", "OW", "KH", "KW", "sh", "sw", "ph", "pw", "dh", "dw", "TCV", "act"))
    alpha, beta, lo, hi = (F32(a[k]) for k in ("act_alpha", "act_beta", "lo", "hi"))
    if KH_ > 0:
        assert (KH_, KW_) == (KH, KW), "an unrolled instance launched for another window"
    if RY > 1:
        assert KH_ > 0 and sh == 1 and dh == 1, "row groups launched without an unrolled window or at vertical stride > 1"
    KK, CV, TCW = KH * KW, C // VEC, TCV * VEC
    PY = block[0] // TCV
    assert shared_mem == KK * TCW * 4, "the shared memory is not the weight tile's size (fp32)"
    OHG = -(-OH // RY)
    groups = N * OHG * OW
    written = np.zeros((N * OH * OW, CV), int)
    for by in range(grid[1]):
        c0 = by * TCW
        tile_c = min(TCW, C - c0)
        smem = np.full(KK * TCW, np.nan, np.float32)  # fp32; what the block never wrote reads NaN
        assert tile_c * KK % VEC == 0 and c0 * KK % VEC == 0, "the tile is not a whole number of vectors"
        for j in range(tile_c * KK // VEC):  # the staging loop: vector loads from the tile's first weight
            w = mem.load(Wt + (c0 * KK + j * VEC) * it, T, VEC, it * VEC)
            for v in range(VEC):
                ch, tap = divmod(j * VEC + v, KK)
                smem[weight_slot(ch, tap, TCW, VEC)] = F32(w[v])
        for bx in range(grid[0]):
            for t in range(block[0]):
                tx, ty = t % TCV, t // TCV
                cv = by * TCV + tx
                if ty >= PY or cv >= CV:
                    continue
                c = cv * VEC
                bias = [F32(mem.load(Bias + (c + v) * it, T, 1, it)[0]) if Bias else F32(0) for v in range(VEC)]

                def weights(r, s):
                    return tap_weights(smem, r * KW + s, tx, TCV, VEC)

                for grp in range(bx * PY + ty, groups, grid[0] * PY):
                    # the kernel's index split: OW's and OHG's fast divisors from the launch
                    assert isinstance(a["ow_mul"], np.uint32) and isinstance(a["ohg_mul"], np.uint32)
                    assert isinstance(a["ow_shr"], np.int32) and isinstance(a["ohg_shr"], np.int32)
                    rest = fast_div(grp, int(a["ow_mul"]), int(a["ow_shr"]))
                    ow = grp - rest * OW
                    n = fast_div(rest, int(a["ohg_mul"]), int(a["ohg_shr"]))
                    oh0 = (rest - n * OHG) * RY
                    assert (ow, oh0, n) == (grp % OW, (grp // OW) % OHG * RY, grp // OW // OHG)
                    acc = [[F32(0)] * VEC for _ in range(RY)]
                    # (input row, tap row, output row) in the kernel's order: RY == 1 walks the taps, RY > 1
                    # the input rows of the column (each loaded once), each feeding the outputs it reaches
                    steps = ([(oh0 * sh - ph + r * dh, r, 0) for r in range(KH)] if RY == 1 else
                             [(oh0 - ph + t, t - i, i) for t in range(RY + KH - 1) for i in range(RY) if 0 <= t - i < KH])
                    # an unrolled window wholly inside the image: the kernel walks it from its corner, a row
                    # step (dh * W * C) and a tap step (dw * C) at a time, with no bounds check
                    ih0, iw0 = oh0 * sh - ph, ow * sw - pw
                    inside = (RY == 1 and KH_ > 0 and ih0 >= 0 and ih0 + (KH - 1) * dh < H
                              and iw0 >= 0 and iw0 + (KW - 1) * dw < W)
                    corner = X + ((n * H * W + ih0 * W + iw0) * C + c) * it
                    for ih, r, i in steps:
                        if not 0 <= ih < H:
                            continue
                        for s in range(KW):
                            iw = ow * sw - pw + s * dw
                            if not 0 <= iw < W:
                                continue
                            at = X + ((n * H * W + ih * W + iw) * C + c) * it
                            if inside:
                                at, checked = corner + (r * (dh * W * C) + s * (dw * C)) * it, at
                                assert at == checked, "the inside walk left the tap's pixel"
                            xv = mem.load(at, T, VEC, it * VEC)
                            wv = weights(r, s)
                            for v in range(VEC):
                                acc[i][v] = F32(acc[i][v] + F32(xv[v]) * F32(wv[v]))
                    for i in range(RY):
                        oh = oh0 + i
                        if oh >= OH:
                            break
                        written[(n * OH + oh) * OW + ow, cv] += 1
                        out = np.array([ACT[act](F32(acc[i][v] + bias[v]), alpha, beta, lo, hi) for v in range(VEC)], T)
                        mem.store(Y + (((n * OH + oh) * OW + ow) * C + c) * it, out, it * VEC)
    assert (written == 1).all(), "an output vector not written exactly once"
    launches.append((VEC, grid[0], (KH_, KW_), TCV))


@pytest.fixture()
def simulated(monkeypatch):
    return install_simulator(monkeypatch, cbr_depthwise, "depthwise_nhwc", _simulate)


def _placed(mem, a, layout, byte_offset=0):
    """``a`` stored in ``layout`` at ``byte_offset`` into a larger buffer (an arena view)."""
    perm = (0,) + tuple(range(2, a.ndim)) + (1,) if layout == "NHWC" and a.ndim >= 3 else tuple(range(a.ndim))
    phys = np.ascontiguousarray(a.transpose(perm))
    raw = np.zeros(phys.nbytes + byte_offset + 64, np.uint8)
    view = raw[byte_offset:byte_offset + phys.nbytes].view(a.dtype).reshape(phys.shape)
    view[...] = phys
    out = view.transpose(np.argsort(perm)).view(_Dev)
    out.keep = raw
    assert is_layout(out, layout)
    mem.add(out)
    return out


def _run_case(mem, params, xs, ws, attrs, dtype, opts, seed: int):
    """``depthwise_nhwc`` with ``params`` built for a ReLU depthwise layer and launched once on fresh random
    operands placed as a model's would be (``opts``: ``bias``, byte offsets ``xoff`` / ``woff`` / ``yoff``),
    its output poisoned first: (the output, the float64 reference)."""
    attrs = dict(attrs, group=xs[1], activation="Relu")
    bias = opts.get("bias", True)
    sig = Signature.make("CBR", [xs, ws, (ws[0],) if bias else None], [dtype] * 3, attrs)
    cand = cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", params)
    assert cand.applies(sig) is None
    low = cand.build(sig, "sm_90")
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(xs).astype(dtype), (rng.standard_normal(ws) / 3).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype) if bias else None
    ref = get_schema("CBR").reference([x.astype(np.float64), w.astype(np.float64),
                                       None if b is None else b.astype(np.float64), None], attrs)[0]
    X, Wd = _placed(mem, x, "NHWC", opts.get("xoff", 0)), _placed(mem, w, "NCHW", opts.get("woff", 0))
    B = None if b is None else _placed(mem, b, "NCHW")
    y = _placed(mem, np.full(np.shape(ref), np.nan, dtype), "NHWC", opts.get("yoff", 0))
    low.launch([X, Wd, B], [y], None)
    return y, ref


CASES = [  # x, w, attrs, dtype, options
    ((2, 16, 9, 8), (16, 1, 3, 3), {"pads": [0, 2, 2, 1], "strides": [2, 2]}, "float16", {}),
    ((1, 12, 7, 10), (12, 1, 3, 5), {"pads": [2, 0, 1, 3], "strides": [1, 2], "dilations": [2, 1]}, "float32", {}),
    ((1, 8, 10, 9), (8, 1, 4, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}, "float32", {}),
    ((2, 16, 13), (16, 1, 4), {"auto_pad": "SAME_LOWER", "strides": [2]}, "float16", {}),
    ((2, 16, 6, 5), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", {"bias": False}),
    ((1, 12, 5, 6), (12, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", {}),  # C % 8 != 0: one channel a thread
    ((2, 1, 5, 6), (1, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float32", {}),
    ((1, 8, 3, 3), (8, 1, 5, 5), {"pads": [2, 2, 2, 2]}, "float32", {}),  # window larger than the input
    ((1, 16, 5, 5), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", {"xoff": 2}),  # misaligned X: narrow
    ((1, 8, 5, 5), (8, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float32", {"yoff": 4}),  # misaligned Y: narrow
    ((1, 16, 5, 5), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", {"xoff": 16, "yoff": 48, "wide": True}),
    ((1, 16, 5, 5), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", {"woff": 2}),  # misaligned W: narrow
    ((2, 16, 9, 8), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", {"max_blocks": 3}),  # grid-stride loop
    ((1, 264, 3, 2), (264, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", {}),  # two channel tiles, the last of one vector
    ((1, 256, 2, 3), (256, 1, 3, 3), {"pads": [1, 0, 1, 1]}, "float16", {"shared_limit": 2048}),  # tiles cut to fit
    ((1, 24, 4, 5), (24, 1, 2, 3), {"pads": [1, 1, 0, 1]}, "float32", {}),  # a window with no unrolled instance
    # unrolled windows whose interior outputs take the unchecked walk: dilation 2 with stride 1, a 5x5 window
    ((1, 16, 11, 10), (16, 1, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}, "float16", {}),
    ((1, 16, 9, 9), (16, 1, 5, 5), {"pads": [2, 1, 2, 3], "strides": [1, 2]}, "float16", {}),
    # row groups: OH not a multiple of 4, horizontal stride and dilation, 5x5, the last tile partial
    ((2, 16, 9, 7), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", {"rows": 4}),
    ((1, 264, 6, 5), (264, 1, 5, 5), {"pads": [2, 1, 2, 3], "strides": [1, 2], "dilations": [1, 2]}, "float16", {"rows": 4}),
    ((1, 12, 7, 6), (12, 1, 3, 3), {"pads": [0, 1, 2, 1]}, "float32", {"rows": 4, "max_blocks": 1}),
]


@pytest.mark.parametrize("xs, ws, attrs, dtype, opts", CASES, ids=lambda v: None)
def test_the_kernel_simulated_thread_by_thread(simulated, monkeypatch, xs, ws, attrs, dtype, opts):
    mem, launches = simulated
    if "max_blocks" in opts:
        monkeypatch.setattr(cbr_depthwise, "MAX_BLOCKS", opts["max_blocks"])
    if "shared_limit" in opts:
        monkeypatch.setattr(cbr_depthwise, "SHARED_LIMIT", opts["shared_limit"])
    params = (("rows", opts["rows"]),) if "rows" in opts else ()
    y, ref = _run_case(mem, params, xs, ws, attrs, dtype, opts, seed=len(xs) * 31 + xs[1])
    (vec, blocks, win, tcv), = launches
    wide = {"float16": 8, "float32": 4}[dtype]
    aligned = xs[1] % wide == 0 and all(opts.get(k, 0) % 16 == 0 for k in ("xoff", "yoff", "woff"))
    assert vec == (wide if aligned else 1)
    assert blocks <= opts.get("max_blocks", cbr_depthwise.MAX_BLOCKS)
    assert win == (ws[2:] if tuple(ws[2:]) in cbr_depthwise.UNROLLED else (0, 0))
    assert tcv * vec * 4 * math.prod(ws[2:]) <= cbr_depthwise.SHARED_LIMIT  # the tile is fp32
    assert tcv == min(xs[1] // vec, cbr_depthwise.TILE_VECS) or "shared_limit" in opts
    tol = 2e-2 if dtype == "float16" else 1e-5
    got = np.asarray(y).astype(np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("act, extra", [("none", {}), ("Clip", {"clip_min": 0.0, "clip_max": 0.6}),
                                        ("LeakyRelu", {"act_alpha": 0.3}), ("HardSigmoid", {"act_alpha": 0.3, "act_beta": 0.4}),
                                        ("HardSigmoidMul", {"act_alpha": 0.25, "act_beta": 0.6}), ("SiLU", {}),
                                        ("Gelu", {}), ("GeluTanh", {}), ("Sigmoid", {}), ("HardSwish", {}),
                                        ("QuickGelu", {})])
def test_every_activation_simulated(simulated, act, extra):
    mem, _ = simulated
    attrs = dict({"group": 8, "pads": [1, 0, 0, 1], "activation": act}, **extra)
    sig = Signature.make("CBR", [(1, 8, 5, 4), (8, 1, 3, 3), (8,)], ["float32"] * 3, attrs)
    low = cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", ()).build(sig, "sm_90")
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, 8, 5, 4), (8, 1, 3, 3), (8,)))
    ref = get_schema("CBR").reference([x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), None], attrs)[0]
    y = _placed(mem, np.full(np.shape(ref), np.nan, np.float32), "NHWC")
    low.launch([_placed(mem, x, "NHWC"), _placed(mem, w, "NCHW"), _placed(mem, b, "NCHW")], [y], None)
    np.testing.assert_allclose(np.asarray(y).astype(np.float64), ref, rtol=1e-5, atol=1e-5)


def _simulate_tiled(mem, T, VEC, KH_, KW_, grid, block, a, shared_mem, launches):
    """One launch of depthwise_nhwc_tiled<T, VEC, KH_, KW_>, block by block and thread by thread: the weight
    staging, the input window's staging (every shared vector written by the load loop, zeros outside the
    image), each thread's outputs of the tile read from the staged window."""
    it = np.dtype(T).itemsize
    X, Wt, Bias, Y = (0 if isinstance(v, np.integer) else v.data.ptr for v in (a["X"], a["Wt"], a["Bias"], a["Y"]))
    N, C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, TCV, TH, TW, act = (
        int(a[k]) for k in ("N", "C", "H", "W", "OH", "OW", "KH", "KW", "sh", "sw", "ph", "pw", "dh", "dw", "TCV", "TH", "TW", "act"))
    alpha, beta, lo, hi = (F32(a[k]) for k in ("act_alpha", "act_beta", "lo", "hi"))
    if KH_ > 0:
        assert (KH_, KW_) == (KH, KW), "an unrolled instance launched for another window"
    KK, CV, TCW = KH * KW, C // VEC, TCV * VEC
    IHT, IWT = (TH - 1) * sh + (KH - 1) * dh + 1, (TW - 1) * sw + (KW - 1) * dw + 1
    assert shared_mem == KK * TCW * 4 + IHT * IWT * TCV * VEC * it, "shared memory: the fp32 weights, then the window"
    assert shared_mem <= cbr_depthwise.SHARED_LIMIT
    tiles_w, tiles_h = -(-OW // TW), -(-OH // TH)
    assert grid == (N * tiles_h * tiles_w, -(-CV // TCV)), "one block per output tile and channel tile"
    P = block[0] // TCV
    written = np.zeros((N * OH * OW, CV), int)
    for by in range(grid[1]):
        c0 = by * TCW
        tcv_here = min(TCW, C - c0) // VEC
        wsm = np.full(KK * TCW, np.nan, np.float32)
        for j in range(tcv_here * VEC * KK // VEC):  # stage_weights: vector loads from the tile's first weight
            w = mem.load(Wt + (c0 * KK + j * VEC) * it, T, VEC, it * VEC)
            for v in range(VEC):
                ch, tap = divmod(j * VEC + v, KK)
                wsm[weight_slot(ch, tap, TCW, VEC)] = F32(w[v])
        for bx in range(grid[0]):
            tw_i, th_n = bx % tiles_w, bx // tiles_w
            th_i, n = th_n % tiles_h, th_n // tiles_h
            oh0, ow0 = th_i * TH, tw_i * TW
            ih0, iw0 = oh0 * sh - ph, ow0 * sw - pw
            sx = np.full((IHT * IWT * TCV, VEC), np.nan, np.float32)
            for k in range(IHT * IWT * TCV):  # the block's load loop (threads k, k + 256, ... cover every k)
                cvl, pix = k % TCV, k // TCV
                iy, ix = divmod(pix, IWT)
                ih, iw = ih0 + iy, iw0 + ix
                if cvl < tcv_here and 0 <= ih < H and 0 <= iw < W:
                    sx[k] = mem.load(X + ((n * H * W + ih * W + iw) * C + c0 + cvl * VEC) * it, T, VEC, it * VEC)
                else:
                    sx[k] = 0.0
            for t in range(block[0]):
                tx, ty = t % TCV, t // TCV
                if ty >= P or tx >= tcv_here:
                    continue
                c = c0 + tx * VEC
                cv = c // VEC
                bias = [F32(mem.load(Bias + (c + v) * it, T, 1, it)[0]) if Bias else F32(0) for v in range(VEC)]
                for j in range(ty, TH * TW, P):
                    oy, ox = divmod(j, TW)
                    oh, ow = oh0 + oy, ow0 + ox
                    if oh >= OH or ow >= OW:
                        continue
                    acc = [F32(0)] * VEC
                    for r in range(KH):
                        for s in range(KW):
                            idx = ((oy * sh + r * dh) * IWT + ox * sw + s * dw) * TCV + tx
                            assert 0 <= idx < sx.shape[0], "a shared load outside the staged window"
                            wv = tap_weights(wsm, r * KW + s, tx, TCV, VEC)
                            for v in range(VEC):
                                acc[v] = F32(acc[v] + F32(sx[idx, v]) * F32(wv[v]))
                    written[(n * OH + oh) * OW + ow, cv] += 1
                    out = np.array([ACT[act](F32(acc[v] + bias[v]), alpha, beta, lo, hi) for v in range(VEC)], T)
                    mem.store(Y + (((n * OH + oh) * OW + ow) * C + c) * it, out, it * VEC)
    assert (written == 1).all(), "an output vector not written exactly once"
    launches.append((VEC, grid, (KH_, KW_), TCV, (TH, TW)))


TILED_CASES = [  # x, w, attrs, dtype, tile, options
    ((2, 16, 9, 8), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", "8x8", {}),  # partial tiles
    ((1, 16, 19, 17), (16, 1, 3, 3), {"pads": [0, 2, 2, 1], "strides": [2, 2]}, "float16", "8x8", {}),
    ((1, 12, 7, 10), (12, 1, 3, 5), {"pads": [2, 0, 1, 3], "strides": [1, 2], "dilations": [2, 1]}, "float32", "8x8", {}),
    ((2, 16, 13), (16, 1, 4), {"auto_pad": "SAME_LOWER", "strides": [2]}, "float16", "8x8", {}),  # 1-D
    ((1, 12, 5, 6), (12, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", "8x8", {}),  # C % 8 != 0: one channel a thread
    ((1, 8, 3, 3), (8, 1, 5, 5), {"pads": [2, 2, 2, 2]}, "float32", "8x8", {}),  # window larger than the input
    ((1, 16, 5, 5), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", "8x8", {"xoff": 2}),  # misaligned X: narrow
    ((1, 80, 4, 3), (80, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", "8x8", {}),  # 10 vectors: two channel tiles of 5
    ((1, 88, 3, 4), (88, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", "8x8", {}),  # 11 vectors: tiles of 6 and 5
    ((1, 24, 4, 5), (24, 1, 2, 3), {"pads": [1, 1, 0, 1]}, "float32", "8x8", {}),  # a window with no unrolled instance
    ((1, 16, 20, 18), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", "16x16", {"bias": False}),
    ((1, 64, 33, 33), (64, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "float16", "16x16", {"shared_limit": 40000}),  # 2 vectors fit
    ((2, 16, 7, 7), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "float16", "16x16", {"one_tile": True}),  # the tile cut to 7x7
]


@pytest.fixture()
def simulated_tiled(monkeypatch):
    return install_simulator(monkeypatch, cbr_depthwise, "depthwise_nhwc_tiled", _simulate_tiled)


@pytest.mark.parametrize("xs, ws, attrs, dtype, tile, opts", TILED_CASES, ids=lambda v: None)
def test_the_tiled_kernel_simulated_thread_by_thread(simulated_tiled, monkeypatch, xs, ws, attrs, dtype, tile, opts):
    mem, launches = simulated_tiled
    if "shared_limit" in opts:
        monkeypatch.setattr(cbr_depthwise, "SHARED_LIMIT", opts["shared_limit"])
    y, ref = _run_case(mem, (("tile", tile),), xs, ws, attrs, dtype, opts, seed=len(xs) * 17 + xs[1])
    (vec, grid, win, tcv, thw), = launches
    wide = {"float16": 8, "float32": 4}[dtype]
    assert vec == (wide if xs[1] % wide == 0 and opts.get("xoff", 0) % 16 == 0 else 1)
    assert win == (ws[2:] if tuple(ws[2:]) in cbr_depthwise.UNROLLED else (0, 0))
    if opts.get("one_tile"):
        assert grid[0] == xs[0] and thw == (7, 7)  # one block an image: the 16x16 tile cut to the 7x7 output
    most = 2 if "shared_limit" in opts else min(xs[1] // vec, cbr_depthwise.TILED_VECS)
    cv = xs[1] // vec
    assert tcv == -(-cv // -(-cv // most)) and -(-cv // tcv) == -(-cv // most)  # as many tiles, evenly filled
    tol = 2e-2 if dtype == "float16" else 1e-5
    got = np.asarray(y).astype(np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_a_tile_whose_window_cannot_fit_is_a_reason(monkeypatch):
    monkeypatch.setattr(cbr_depthwise, "SHARED_LIMIT", 1024)
    sig = Signature.make("CBR", [(1, 16, 40, 40), (16, 1, 3, 3), (16,)], ["float16"] * 3,
                         {"group": 16, "pads": [1, 1, 1, 1], "strides": [2, 2]})
    reason = cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", (("tile", "16x16"),)).applies(sig)
    assert reason and "shared memory" in reason
    assert cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", (("tile", "16x16"),)).applies(
        Signature.make("CBR", [(1, 16, 40, 40), (32, 16, 3, 3), (32,)], ["float16"] * 3, {"pads": [1, 1, 1, 1]}))
    monkeypatch.undo()
    # the grid's rows: counted with the channel tiles the launch really makes (the narrow form's, 4 channels
    # here where a 37x37 window leaves room for no more), not with the 8 vectors at most (a review's finding)
    c = 262141
    big = Signature.make("CBR", [(1, c, 40, 40), (c, 1, 37, 37), (c,)], ["float16"] * 3, {"group": c, "pads": [18] * 4})
    assert "channel tiles" in cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", (("tile", "16x16"),)).applies(big)
