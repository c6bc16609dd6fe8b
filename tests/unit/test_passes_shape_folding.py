"""Static shape arithmetic folds away: Shape/Size of tensors whose shapes become static only after
an earlier fold (shape inference is run again between cleanup rounds), and Gather of the static
dims of a Shape whose other dims are symbolic; outputs equal the original's under onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).parent))
from _coverage_util import G, feeds, run  # noqa: E402

from graphopt.ir import from_model, to_model  # noqa: E402
from graphopt.passes import run_cleanup  # noqa: E402


def _shape_chain(g, x, heads):
    """Swin/BERT-style head split computed at run time: Reshape(x, [B, S, heads, D // heads])."""
    shp = g.op("Shape", [x])
    b = g.op("Gather", [shp, g.const(np.array([0]), "i0", np.int64)], axis=0)
    s = g.op("Gather", [shp, g.const(np.array([1]), "i1", np.int64)], axis=0)
    d = g.op("Gather", [shp, g.const(np.array([2]), "i2", np.int64)], axis=0)
    dh = g.op("Div", [d, g.const(np.array([heads]), "h", np.int64)])
    return g.op("Reshape", [x, g.op("Concat", [b, s, g.const(np.array([heads]), "h", np.int64), dh], axis=0)])


def _model(batch=2):
    g = G(opset=17)
    x = g.input("x", [batch, 6, 8])
    y = _shape_chain(g, g.op("Relu", [x]), 2)          # [2, 6, 2, 4], known only after folding
    y = g.op("Transpose", [y], perm=[0, 2, 1, 3])
    y = g.op("Reshape", [y, g.op("Concat", [g.op("Shape", [y], end=2), g.const(np.array([-1]), "m1", np.int64)],
                                  axis=0)])             # [2, 2, 24]: its Shape depends on the first fold
    n = g.op("Cast", [g.op("Size", [y])], to=TensorProto.FLOAT)
    g.output(g.op("Div", [y, n]))
    return g.model()


def _count(g, *ops):
    return sum(1 for n in g.nodes() if n.op_type in ops)


def test_every_shape_folds_when_inference_runs_again_between_rounds():
    m = _model()
    inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    once = from_model(inferred)
    run_cleanup(once)
    g = from_model(inferred)
    totals = run_cleanup(g, refine=True)
    assert _count(g, "Shape", "Size", "Gather", "Concat", "Div") == 1  # only the final Div by the size
    assert _count(once, "Size") == 1  # without a second inference the reshaped tensor's size stays unknown
    assert totals["fold_shape"] >= 3
    g.lint()
    out = to_model(g)
    onnx.checker.check_model(out, full_check=True)
    fd = feeds(m)
    np.testing.assert_allclose(run(out, fd)[0], run(m, fd)[0], rtol=1e-6)


def test_gather_of_static_dims_folds_with_a_symbolic_batch():
    g = G(opset=17)
    g.inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6, 8]))
    y = _shape_chain(g, "x", 2)
    g.output(y)
    m = helper.make_model(helper.make_graph(g.nodes, "t", g.inputs,
                                           [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], g.inits),
                          opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    ir = from_model(onnx.shape_inference.infer_shapes(m, data_prop=True))
    run_cleanup(ir, refine=True)
    # the batch dim stays a run-time Shape -> Gather; the sequence and hidden sizes fold
    assert _count(ir, "Shape") == 1 and _count(ir, "Gather") == 1 and _count(ir, "Div") == 0
    out = to_model(ir)
    x = np.random.default_rng(0).standard_normal((3, 6, 8)).astype(np.float32)
    np.testing.assert_array_equal(run(out, {"x": x})[0], run(m, {"x": x})[0])


def test_gather_of_a_symbolic_dim_stays():
    g = G(opset=17)
    g.inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6]))
    out = g.op("Gather", [g.op("Shape", ["x"]), g.const(np.array(0), "i", np.int64)], axis=0)
    m = helper.make_model(helper.make_graph(g.nodes, "t", g.inputs,
                                           [helper.make_tensor_value_info(out, TensorProto.INT64, [])], g.inits),
                          opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    ir = from_model(m)
    assert run_cleanup(ir, refine=True)["fold_shape"] == 0
    assert _count(ir, "Shape", "Gather") == 2
