"""`graphopt optimize --explain` names the Cast that blocked a fusion, with its types (issue 18, item 2)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
from onnx import TensorProto

from tests.conftest import run_graphopt as graphopt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from _coverage_util import G  # noqa: E402


def test_explain_names_the_blocking_cast(tmp_path):
    g = G(opset=17)
    x = g.input("x", [2, 5, 24], TensorProto.FLOAT)
    # an fp16 round trip on one of the norm's reads: lossy, so no rule may drop it
    xr = g.op("Cast", [g.op("Cast", [x], name="tohalf", to=TensorProto.FLOAT16)], name="tofloat", to=TensorProto.FLOAT)
    var = g.op("ReduceMean", [g.op("Pow", [x, g.const(2.0)])], axes=[-1])
    h = g.op("Div", [xr, g.op("Sqrt", [g.op("Add", [var, g.const(1e-6)])])])
    g.output(g.op("Mul", [h, g.rand([24], "w")]))
    src = tmp_path / "m.onnx"
    onnx.save(g.model(), src)
    r = graphopt("optimize", src, "--gpu", "none", "--explain", "--verify")
    assert r.returncode == 0, r.stderr
    assert "from Cast 'tofloat' (float16 -> float)" in r.stdout
    assert "RMSNorm" not in onnx.load(tmp_path / "m.opt.onnx").SerializeToString().decode("latin-1")
