"""``graphopt optimize --shape-profile`` through the real command line (CPU: heuristic per bucket)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import run_graphopt, run_ort
from graphopt.tune import buckets as B


def _model(path: Path) -> Path:
    """x[N,16,32,32] -> Conv 3x3 (32) -> Relu -> Conv 1x1 (32) -> Relu; the heuristic's tile depends on N."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.1, n)
             for n, s in (("w1", (32, 16, 3, 3)), ("b1", (32,)), ("w2", (32, 32, 1, 1)), ("b2", (32,)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2"),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32, 32, 32])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_profile_tunes_every_bucket_and_records_them(tmp_path):
    src = _model(tmp_path / "m.onnx")
    before = src.read_bytes()
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    args = ("optimize", src, "--gpu", "h100", "--shape-profile", "x=N:8,1,32", "-o", out, "--report", report, "--verify")
    r = run_graphopt(*args)
    assert r.returncode == 0, r.stderr
    assert src.read_bytes() == before
    # the table lists every node x bucket, and the dims line says where the values came from
    assert "lowering per bucket" in r.stdout
    assert "tuned at: 'N'=1,8,32 (--shape-profile x)" in r.stdout
    assert "(2 nodes x 3 buckets)" in r.stdout
    rep = json.loads(report.read_text())
    assert rep["buckets"] == [{"N": 1}, {"N": 8}, {"N": 32}]
    assert [(row["node"], row["dims"]["N"]) for row in rep["lowerings"]] == \
        [(n, b) for n in (rep["lowerings"][0]["node"], rep["lowerings"][3]["node"]) for b in (1, 8, 32)]
    assert rep["tuning_dims"] == {"N": {"values": [1, 8, 32], "source": "--shape-profile x"}}
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    cbr = [n for n in m.graph.node if n.domain == "graphopt"]
    assert len(cbr) == 2
    attrs = {a.name: helper.get_attribute_value(a) for a in cbr[0].attribute}
    rec = json.loads(attrs["lowering_buckets"])
    assert [x["dims"]["N"] for x in rec] == [1, 8, 32]
    # 1024 output pixels at N=1: cuBLAS; 8192+ at N=8 and 32: the implicit GEMM's bn=128 tile
    assert [(x["lowering"], x["params"].split(",")[1:2]) for x in rec] == \
        [("cublas_ws", []), ("implicit_gemm", ["bn=128"]), ("implicit_gemm", ["bn=128"])]
    assert (attrs["lowering"].decode(), attrs["lowering_params"].decode()) == (rec[-1]["lowering"], rec[-1]["params"])
    assert B.choose({k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}, {"N": 2}) == \
        (rec[1]["lowering"], rec[1]["params"])
    # onnxruntime runs it through the function bodies (the attribute changes nothing there), at any batch
    orig = onnx.load(src)
    x = np.random.default_rng(7).standard_normal((3, 16, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(run_ort(m, {"x": x})[0], run_ort(orig, {"x": x})[0], rtol=1e-4, atol=1e-5)
    # deterministic: the same input and options give the same bytes
    out2 = tmp_path / "o2.onnx"
    r2 = run_graphopt(*[out2 if a == out else a for a in args])
    assert r2.returncode == 0 and out2.read_bytes() == out.read_bytes()


def test_without_a_profile_the_output_says_which_dims_were_defaulted_or_given(tmp_path):
    src = _model(tmp_path / "m.onnx")
    r = run_graphopt("optimize", src, "--gpu", "h100", "-o", tmp_path / "a.onnx")
    assert r.returncode == 0, r.stderr
    assert "tuned at: 'N'=1 (default (DEFAULT_DIM))" in r.stdout and "lowering per bucket" not in r.stdout
    r = run_graphopt("optimize", src, "--gpu", "h100", "--shape", "x=4x16x32x32", "-o", tmp_path / "b.onnx")
    assert r.returncode == 0, r.stderr
    assert "tuned at: 'N'=4 (--shape x)" in r.stdout
    m = onnx.load(tmp_path / "b.onnx")
    assert not any(a.name == "lowering_buckets" for n in m.graph.node for a in n.attribute)


@pytest.mark.parametrize("extra, fragment", [
    (["--shape-profile", "x=N:1,0"], "--shape-profile 'x=N:1,0': 0 is not positive"),
    (["--shape-profile", "x=N:a"], "'a' is not an integer"),
    (["--shape-profile", "x=N:"], "the value list is empty"),
    (["--shape-profile", "x=N:1,1"], "1 is given twice"),
    (["--shape-profile", "x=N:1", "--shape-profile", "x=N:2"], "already profiled"),
    (["--shape-profile", "img=N:1"], "the model has no graph input 'img' (its inputs: x)"),
    (["--shape-profile", "x=C:1,8"], "'C' is not a symbolic dim of input 'x'"),
    (["--shape-profile", "x=N:1,8", "--shape", "x=2x16x32x32"], "also fixed by --shape x"),
])
def test_bad_profiles_are_one_line_usage_errors_and_write_nothing(tmp_path, extra, fragment):
    src = _model(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    r = run_graphopt("optimize", src, "--gpu", "none", "-o", out, *extra)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphopt: error: --shape-profile") and fragment in lines[0], r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [src]
