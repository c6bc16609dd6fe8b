"""bench/stem_breakdown.py on the CPU: every signature it hands the tuner is one the parts it means to
time take (cudnn_split for the bare convolution and the whole node, cublaslt_im2col's packing, a cuBLASLt
GEMM of the packed rows), so a device call does not find out by an empty row."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import stem_breakdown as sb  # noqa: E402
from graphopt.kernels import geometry as geo  # noqa: E402
from graphopt.lowering.contract import Signature  # noqa: E402
from graphopt.providers import cublaslt_problem, cudnn_split  # noqa: E402


@pytest.mark.parametrize("name", sorted(sb.STEMS))
def test_every_part_applies(name):
    xs, w, s, p, act, extra = sb.STEMS[name]
    sig = sb.cbr_sig((32,) + xs, w, s, p, act, extra, "float16")
    assert cudnn_split.split_reason(sig) is None
    assert cudnn_split.split_reason(sb.cbr_sig((32,) + xs, w, s, p, "none", {}, "float16", bias=False)) is None
    assert cublaslt_problem.im2col_reason(sig) is None
    g = geo.conv_geom(sig)
    assert g.out_shape == (32, w[0], 112, 112)
    kp = cublaslt_problem.im2col_depth(g.C * g.KH * g.KW, "float16")
    gemm = Signature.make("GemmAct", [(32 * 112 * 112, kp), (w[0], kp), (w[0],)], ["float16"] * 3,
                          dict({"mode": "gemm", "transB": 1, "activation": act}, **extra))
    assert geo.act_args(gemm).code == geo.act_args(sig).code
