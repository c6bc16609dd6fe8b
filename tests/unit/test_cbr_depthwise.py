"""CBR's ``depthwise_nhwc`` on the CPU: where it applies, its key and declared layouts, and its launch.
The launch is checked by running a NumPy model of the kernel bound to the arguments *by the parameter
names in depthwise_nhwc.cu itself* (so an argument passed out of order fails here), against the float64
convolution on odd sizes, both vector widths, strides, dilations, pads, 1-D, every activation code.
The kernel's own values are tested on the GPU (tests/gpu/test_cbr_gpu.py)."""

from __future__ import annotations

import re
import types

import numpy as np
import pytest

from graphopt.kernels import cbr_depthwise
from graphopt.kernels.cbr import cbr_candidates
from graphopt.kernels.geometry import ACT_CODES
from graphopt.kernels.registry import candidate_from_key
from graphopt.kernels.source import KERNEL_DIR
from graphopt.lowering.contract import Lowering, Signature
from graphopt.lowering.layout import to_layout


def _sig(xs, ws, attrs, dtype="float16", bias=True, res=None):
    return Signature.make("CBR", [xs, ws, (ws[0],) if bias else None, res], [dtype] * 4, attrs)


def test_it_applies_to_depthwise_layers_only_and_says_why_not():
    dw = _sig((2, 24, 13, 11), (24, 1, 3, 3), {"group": 24, "activation": "Relu"})
    assert cbr_depthwise.depthwise_reason(dw) is None
    assert "depthwise" in cbr_depthwise.depthwise_reason(_sig((2, 8, 9, 9), (16, 1, 3, 3), {"group": 8}))  # multiplier 2
    assert "depthwise" in cbr_depthwise.depthwise_reason(_sig((2, 8, 9, 9), (8, 8, 3, 3), {}))
    assert "residual" in cbr_depthwise.depthwise_reason(_sig((2, 8, 9, 9), (8, 1, 3, 3), {"group": 8}, res=(2, 8, 9, 9)))
    cand = next(c for c in cbr_candidates() if c.name == "depthwise_nhwc")
    assert candidate_from_key("CBR", cand.key()) == cand
    assert cand.layouts(dw) == ("NHWC", "NCHW", "NHWC", "NHWC", "NHWC")
    low = Lowering(launch=lambda i, o, w: None, layouts=cand.layouts(dw))
    assert low.output_layout(3, 0) == "NHWC"  # a node with a bias and no residual: Y is NHWC


def _params() -> list[str]:
    """The kernel's parameter names, in order, from the source."""
    text = (KERNEL_DIR / cbr_depthwise.SOURCE).read_text()
    body = re.search(r"depthwise_nhwc\((.*?)\)\s*\{", text, re.S).group(1)
    return [p.strip().split()[-1].lstrip("*") for p in body.split(",")]


def _act(v, code, alpha, beta, lo, hi):
    """The activation the kernel's ``act`` code names, with the parameters it was passed."""
    from graphopt.ops.activations import ACTIVATIONS

    name = {c: n for n, c in ACT_CODES.items()}[int(code)]
    attrs = {"act_alpha": float(alpha), "act_beta": float(beta), "clip_min": float(lo), "clip_max": float(hi)}
    return ACTIVATIONS[name].numpy(v, attrs)


def _memory(a, count: int):
    """``count`` elements of ``a``'s dtype from its first element's address: what a kernel indexes."""
    import ctypes

    arr = np.asarray(a)
    raw = (ctypes.c_char * (count * arr.itemsize)).from_address(a.data.ptr)
    return np.frombuffer(raw, dtype=arr.dtype)


def _model(args: dict, vec: int) -> None:
    """What one launch computes, per the kernel's indexing (channel groups of ``vec``)."""
    n_, c_, h_, w_, oh_, ow_, kh, kw = (int(args[k]) for k in ("N", "C", "H", "W", "OH", "OW", "KH", "KW"))
    sh, sw, ph, pw, dh, dw = (int(args[k]) for k in ("sh", "sw", "ph", "pw", "dh", "dw"))
    assert c_ % vec == 0
    x = _memory(args["X"], n_ * h_ * w_ * c_).reshape(n_, h_, w_, c_).astype(np.float64)  # NHWC memory
    wt = _memory(args["Wt"], c_ * kh * kw).astype(np.float64).reshape(c_, kh, kw)
    acc = np.zeros((n_, oh_, ow_, c_))
    for r in range(kh):
        for s in range(kw):
            for oh in range(oh_):
                ih = oh * sh - ph + r * dh
                if not 0 <= ih < h_:
                    continue
                for ow in range(ow_):
                    iw = ow * sw - pw + s * dw
                    if 0 <= iw < w_:
                        acc[:, oh, ow, :] += x[:, ih, iw, :] * wt[:, r, s]
    bias = args["Bias"]
    b = 0.0 if isinstance(bias, np.integer) else _memory(bias, c_).astype(np.float64)
    out = _act(acc + b, args["act"], args["act_alpha"], args["act_beta"], args["lo"], args["hi"])
    y = _memory(args["Y"], n_ * oh_ * ow_ * c_)
    y[:] = out.reshape(-1).astype(y.dtype)


@pytest.fixture()
def recorder(monkeypatch):
    launches = []

    def get_kernel(source, expr):
        vec = int(expr.rstrip(">").split(",")[-1])

        def run(grid, block, args):
            names = _params()
            assert len(args) == len(names), (names, len(args))
            bound = dict(zip(names, args))
            launches.append((expr, grid, block, bound))
            _model(bound, vec)

        return run

    monkeypatch.setattr(cbr_depthwise, "get_kernel", get_kernel)
    return launches


class _Dev(np.ndarray):
    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


def _dev(a):
    out = np.empty_like(a).view(_Dev) if a.flags.c_contiguous else a.view(_Dev)
    out[...] = a
    return out


CASES = [  # x, w, attrs, dtype
    ((2, 24, 13, 11), (24, 1, 3, 3), {"group": 24, "strides": [2, 2], "pads": [1, 1, 1, 1]}, "float16"),
    ((2, 13, 17, 15), (13, 1, 5, 5), {"group": 13, "pads": [2, 2, 2, 2]}, "float32"),
    ((1, 40, 14, 13), (40, 1, 3, 3), {"group": 40, "strides": [2, 1], "dilations": [2, 2], "pads": [2, 1, 2, 1]}, "float32"),
    ((2, 16, 29), (16, 1, 5), {"group": 16, "pads": [2, 2]}, "float16"),
]


@pytest.mark.parametrize("act", sorted(ACT_CODES))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_the_launch_computes_the_convolution(recorder, case, act):
    import sys

    sys.path.insert(0, str(KERNEL_DIR.parents[1] / "tests" / "gpu"))
    import reference as R  # the float64 convolution the GPU tests use (plain NumPy)

    xs, ws, attrs, dtype = case
    attrs = dict(attrs, activation=act)
    if act == "Clip":
        attrs.update(clip_min=-0.5, clip_max=0.7)
    sig = _sig(xs, ws, attrs, dtype)
    cand = cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", ())
    low = cand.build(sig, "sm_90")
    rng = np.random.default_rng(len(xs) + xs[1])
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) / 3).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    ref = R.reference("CBR", [x, w, b, None], attrs)
    xn = to_layout(_dev(x), "NHWC", np).view(_Dev)
    y = to_layout(np.full(ref.shape, np.nan, dtype), "NHWC", np).view(_Dev)
    low.launch([xn, _dev(w), _dev(b), None], [y], None)
    expr, grid, block, bound = recorder[-1]
    vec = int(expr.rstrip(">").split(",")[-1])
    wide = 8 if dtype == "float16" else 4
    assert vec == (wide if xs[1] % wide == 0 else 1)
    assert block == (256,) and grid[0] * 256 >= int(np.prod(ref.shape)) // vec
    tol = 2e-2 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(np.asarray(y).astype(np.float64), ref, rtol=tol, atol=tol)


def test_inputs_outside_its_declared_layouts_are_refused(recorder):
    from graphopt.errors import TuningError

    sig = _sig((2, 24, 13, 11), (24, 1, 3, 3), {"group": 24})
    low = cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", ()).build(sig, "sm_90")
    x = _dev(np.zeros((2, 24, 13, 11), np.float16))  # NCHW
    y = to_layout(np.zeros((2, 24, 11, 9), np.float16), "NHWC", np).view(_Dev)
    with pytest.raises(TuningError, match="NHWC"):
        low.launch([x, _dev(np.zeros((24, 1, 3, 3), np.float16)), None, None], [y], None)
    assert recorder == []


def test_wrong_weights_or_bias_are_refused_and_an_empty_batch_launches_nothing(recorder):
    from graphopt.errors import TuningError

    sig = _sig((2, 24, 13, 11), (24, 1, 3, 3), {"group": 24})
    low = cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", ()).build(sig, "sm_90")
    x = to_layout(np.zeros((2, 24, 13, 11), np.float16), "NHWC", np).view(_Dev)
    y = to_layout(np.zeros((2, 24, 11, 9), np.float16), "NHWC", np).view(_Dev)
    w = _dev(np.zeros((24, 1, 3, 3), np.float16))
    with pytest.raises(TuningError, match="W must be"):
        low.launch([x, _dev(np.zeros((24, 1, 5, 5), np.float16)), None], [y], None)
    with pytest.raises(TuningError, match="B must be"):
        low.launch([x, w, _dev(np.zeros(23, np.float16))], [y], None)
    assert recorder == []
    empty = cbr_depthwise.DepthwiseNhwcConv("depthwise_nhwc", ()).build(
        _sig((0, 24, 13, 11), (24, 1, 3, 3), {"group": 24}), "sm_90")
    xe = to_layout(np.zeros((0, 24, 13, 11), np.float16), "NHWC", np).view(_Dev)
    ye = to_layout(np.zeros((0, 24, 11, 9), np.float16), "NHWC", np).view(_Dev)
    empty.launch([xe, w, None], [ye], None)
    assert recorder == []
