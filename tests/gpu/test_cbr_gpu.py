"""Every CBR candidate and config against the float64 reference on the GPU (marker ``gpu``)."""

from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

from graphopt.lowering.contract import Signature
from graphopt.kernels.cbr import cbr_candidates

import reference as R
from _harness import ACTS, run_and_check

# name: (x shape, w shape, attrs, bias?, residual shape or None or "full")
CASES = {
    "odd_3x3_pad1_res": ((2, 13, 11, 9), (19, 13, 3, 3), {"pads": [1, 1, 1, 1]}, True, "full"),
    "stride2_asym_pads": ((2, 8, 15, 13), (24, 8, 3, 3), {"pads": [0, 1, 2, 1], "strides": [2, 2]}, True, None),
    "dilation_nobias_res": ((1, 16, 12, 14), (16, 16, 3, 3), {"dilations": [2, 3], "pads": [2, 3, 2, 3]}, False, "full"),
    "groups3_res_bcast": ((2, 12, 9, 10), (18, 4, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}, True, (1, 18, 1, 1)),
    "depthwise_s2": ((2, 24, 13, 11), (24, 1, 3, 3), {"group": 24, "strides": [2, 2], "pads": [1, 1, 1, 1]}, True, None),
    "depthwise_mult2": ((1, 8, 9, 9), (16, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}, True, "full"),
    # depthwise_nhwc: odd channels (one per thread), 5x5, dilation with unequal strides, 1-D
    "depthwise_5x5_odd": ((2, 13, 17, 15), (13, 1, 5, 5), {"group": 13, "pads": [2, 2, 2, 2]}, False, None),
    "depthwise_dil_s21": ((1, 40, 14, 13), (40, 1, 3, 3), {"group": 40, "strides": [2, 1], "dilations": [2, 2],
                                                           "pads": [2, 1, 2, 1]}, True, None),
    "depthwise_1d": ((2, 16, 29), (16, 1, 5), {"group": 16, "pads": [2, 2]}, True, None),
    "depthwise_asym_s2": ((2, 16, 9, 8), (16, 1, 3, 3), {"group": 16, "pads": [0, 2, 2, 1], "strides": [2, 2]}, False, None),
    # depthwise_nhwc: channel tiles (the last partial), the 5x5 instance with stride 2, a 7x7 window (no unrolled instance)
    "depthwise_tiles_5x5_s2": ((2, 264, 9, 7), (264, 1, 5, 5), {"group": 264, "pads": [2, 2, 2, 2], "strides": [2, 2]}, True, None),
    "depthwise_7x7": ((1, 48, 11, 10), (48, 1, 7, 7), {"group": 48, "pads": [3, 3, 3, 3]}, True, None),
    "depthwise_rows_3x3": ((2, 40, 13, 11), (40, 1, 3, 3), {"group": 40, "strides": [1, 2], "pads": [1, 1, 1, 1]}, True, None),
    # depthwise_nhwc's tiled form: several 8x8 and 16x16 output tiles, the last ones partial, two channel tiles
    "depthwise_tiled_3x3": ((2, 72, 37, 35), (72, 1, 3, 3), {"group": 72, "pads": [1, 1, 1, 1]}, True, None),
    # stem: RGB 3x3 stride 2 with 32 outputs (every mv), one input channel with dilation, 1-D, a 7x7 stem (stem7x7_s2 below)
    "stem_rgb_3x3_s2": ((2, 3, 17, 15), (32, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, True, None),
    "stem_gray_dil": ((1, 1, 12, 13), (16, 1, 3, 3), {"dilations": [2, 1], "pads": [0, 2, 1, 0]}, False, None),
    "stem_1d": ((2, 4, 31), (24, 4, 5), {"strides": [2], "pads": [2, 2]}, True, None),
    "pointwise_res": ((3, 40, 7, 9), (72, 40, 1, 1), {}, True, "full"),
    "pointwise_s2": ((2, 32, 9, 9), (48, 32, 1, 1), {"strides": [2, 2]}, False, None),
    "stem7x7_s2": ((1, 3, 23, 21), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, True, None),
    "same_lower_2x3": ((1, 8, 10, 9), (8, 8, 2, 3), {"auto_pad": "SAME_LOWER"}, True, None),
    "same_upper_s2": ((1, 8, 11, 10), (12, 8, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, False, None),
    "conv1d": ((2, 12, 37), (20, 12, 5), {"pads": [2, 1], "dilations": [2]}, True, "full"),
    "deep_k_splitk": ((1, 64, 7, 7), (96, 64, 3, 3), {"pads": [1, 1, 1, 1]}, True, "full"),
    "m130_tiles": ((2, 32, 20, 19), (130, 32, 3, 3), {"pads": [1, 1, 1, 1]}, True, None),
    "res_bcast_h": ((1, 8, 6, 7), (8, 8, 3, 3), {"pads": [1, 1, 1, 1]}, True, (1, 8, 1, 7)),
    "nhwc_s2_asym_dil": ((2, 64, 13, 11), (40, 64, 3, 3), {"strides": [2, 2], "pads": [1, 0, 2, 1], "dilations": [1, 2]}, True, "full"),
    "nhwc_groups2": ((1, 128, 9, 9), (96, 64, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, True, (96, 1, 1)),
    "pointwise_hw_odd": ((2, 64, 7, 7), (72, 64, 1, 1), {}, True, "full"),
    # cp.async pipeline (HW and C multiples of 8): fewer K tiles than stages, M and N tails.
    "pointwise_pipe_short_k": ((3, 40, 8, 5), (72, 40, 1, 1), {}, True, "full"),
    "pointwise_pipe_tails": ((2, 96, 12, 12), (136, 96, 1, 1), {}, True, (136, 1, 1)),
    "nhwc_pipe_long_k": ((2, 96, 10, 9), (72, 96, 3, 3), {"pads": [1, 1, 1, 1]}, True, "full"),
}
DTYPES = ("float16", "float32")


def _out_shape(case):
    xs, ws, attrs, _, _ = case
    sig = Signature.make("CBR", [xs, ws, None, None], ["float32"] * 4, attrs)
    from graphopt.kernels.geometry import conv_geom

    return conv_geom(sig).out_shape


@lru_cache(maxsize=None)
def _data(name: str, dtype: str, act_idx: int = 1):
    xs, ws, attrs, has_b, res = CASES[name]
    rng = np.random.default_rng(zlib.crc32(f"{name}|{dtype}".encode()))
    fan_in = int(np.prod(ws[1:]))
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) / np.sqrt(fan_in)).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype) if has_b else None
    out_shape = _out_shape(CASES[name])
    r = None
    if res == "full":
        r = rng.standard_normal(out_shape).astype(dtype)
    elif res is not None:
        r = rng.standard_normal(res).astype(dtype)
    a = dict(attrs, **ACTS[act_idx])
    ref = R.reference("CBR", [x, w, b, r], a)
    return [x, w, b, r], a, ref


def _cases():
    for name, case in CASES.items():
        xs, ws, attrs, has_b, res = case
        for dtype in DTYPES:
            shapes = [xs, ws, (ws[0],) if has_b else None, None if res is None else (_out_shape(case) if res == "full" else res)]
            sig = Signature.make("CBR", shapes, [dtype] * 4, dict(attrs, activation="Relu"))
            for cand in cbr_candidates():
                if cand.applies(sig, (9, 0)) is None:
                    yield pytest.param(name, dtype, cand, shapes, id=f"{name}-{dtype}-{cand.key()}")


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype,cand,shapes", list(_cases()))
def test_cbr_candidate(name, dtype, cand, shapes):
    inputs, attrs, ref = _data(name, dtype)
    run_and_check(cand, "CBR", shapes, dtype, attrs, inputs, ref)


ACT_PICKS = {
    "deep_k_splitk": {"direct:opt=1", "direct:opt=4", "direct_k3:opt=4", "implicit_gemm:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1",
                      "implicit_gemm:bm=64,bn=32,bk=32,wm=2,wn=1,splitk=2", "implicit_gemm_nhwc:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1",
                      "implicit_gemm_nhwc:bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1,sepi=1",
                      "implicit_gemm:bm=128,bn=64,bk=32,wm=2,wn=2,splitk=1,sepi=1", "cublas", "cublas_ws"},
    "pointwise_res": {"pointwise_gemm:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1", "pointwise_gemm:bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1,sepi=1"},
    "nhwc_pipe_long_k": {"implicit_gemm_nhwc:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1,st=4",
                         "implicit_gemm_nhwc:bm=128,bn=128,bk=32,wm=2,wn=2,splitk=1,sepi=1,st=3",
                         "implicit_gemm_nhwc:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=2,st=3"},
}


def _act_cases():
    for ai in range(len(ACTS)):
        for dtype in DTYPES:
            for name, picks in ACT_PICKS.items():
                for cand in cbr_candidates():
                    if "st=" in cand.key() and dtype != "float16":  # the cp.async configs are fp16 only
                        continue
                    if cand.key() in picks:
                        yield pytest.param(ai, dtype, name, cand, id=f"act{ai}-{ACTS[ai]['activation']}-{name}-{dtype}-{cand.key()}")


@pytest.mark.gpu
@pytest.mark.parametrize("ai,dtype,name,cand", list(_act_cases()))
def test_cbr_activation(ai, dtype, name, cand):
    xs, ws, _, _, _ = CASES[name]
    inputs, attrs, ref = _data(name, dtype, ai)
    shapes = [xs, ws, (ws[0],), _out_shape(CASES[name])]
    run_and_check(cand, "CBR", shapes, dtype, attrs, inputs, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ai", range(len(ACTS)), ids=lambda i: ACTS[i]["activation"])
def test_depthwise_nhwc_every_activation(ai, dtype):
    """``depthwise_nhwc`` fuses no residual, so ``test_cbr_activation``'s residual cases skip it: every
    activation here on a depthwise layer with dilation and unequal strides."""
    from graphopt.kernels.cbr_depthwise import DepthwiseNhwcConv

    name = "depthwise_dil_s21"
    xs, ws, _, _, _ = CASES[name]
    inputs, attrs, ref = _data(name, dtype, ai)
    run_and_check(DepthwiseNhwcConv("depthwise_nhwc", ()), "CBR", [xs, ws, (ws[0],), None], dtype, attrs, inputs, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("y", ("nhwc", "nchw"))
@pytest.mark.parametrize("px", (1, 4))
@pytest.mark.parametrize("ai", range(len(ACTS)), ids=lambda i: ACTS[i]["activation"])
def test_stem_every_activation(ai, px, y, dtype):
    """The ``stem`` family fuses no residual either: every activation on the RGB 3x3 stride-2 case
    (OW 8: two slots of 4 pixels), both layouts of Y, one pixel and four a thread."""
    from graphopt.kernels.cbr_stem import StemConv

    name = "stem_rgb_3x3_s2"
    xs, ws, _, _, _ = CASES[name]
    inputs, attrs, ref = _data(name, dtype, ai)
    run_and_check(StemConv("stem", (("mv", 16),) + ((("px", px),) if px > 1 else ()) + (("y", y),)), "CBR", [xs, ws, (ws[0],), None], dtype, attrs, inputs, ref)
