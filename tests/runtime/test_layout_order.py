"""Elementwise standard ops keep a channels-last input's layout on the device
(graphopt.runtime.onnx_ops.layout_order): CuPy's ufuncs write C order whatever their inputs' strides,
so each op is checked here through a stand-in that does the same. Near misses: a C-order first input
decides C order; a first input with one channel (both layouts) lets the next decide; a host
constant does not decide; an operand of higher rank leaves the op as it is."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt.lowering.layout import ELEMENTWISE_OPS, channels_last_perm, is_layout, to_layout
from graphopt.runtime.onnx_ops.layout_order import deciding_perm, for_device, in_input_order
from graphopt.runtime.onnx_ops.registry import OPS, OpContext

SHAPE = (2, 5, 3, 4)


def _node(op, **attrs):
    return type("N", (), {"op_type": op, "name": op.lower(), "attr": lambda self, k, d=None: attrs.get(k, d)})()


def _c_order(fn):
    """``fn`` with every output copied to C order, as CuPy's elementwise kernels allocate them."""
    return lambda ctx, ins: [None if o is None else np.ascontiguousarray(o) for o in fn(ctx, ins)]


def _inputs(op, rng):
    x = rng.standard_normal(SHAPE).astype(np.float32)
    y = rng.standard_normal(SHAPE).astype(np.float32)
    host, attrs = {}, {}
    if op in ("Sum", "Max", "Min", "Mean"):
        ins = [x, y, rng.standard_normal((5, 1, 1)).astype(np.float32)]
    elif op == "Where":
        ins = [x > 0, y, rng.standard_normal((1, 5, 1, 1)).astype(np.float32)]
    elif op == "PRelu":
        ins = [x, rng.standard_normal((5, 1, 1)).astype(np.float32)]
    elif op == "Pow":
        ins = [np.abs(x) + 0.5, np.float32(1.5) * np.ones((), np.float32)]
    elif op == "Div":
        ins = [x, np.abs(y) + 1]
    elif op in ("Add", "Sub", "Mul"):
        ins = [x, rng.standard_normal((1, 5, 1, 1)).astype(np.float32)]
    elif op in ("Log", "Sqrt"):
        ins = [np.abs(x) + 0.1]
    elif op == "Clip":
        ins, host = [x, None, None], {1: np.float32(-0.3), 2: np.float32(0.4)}
    elif op == "Cast":
        ins, attrs = [x], {"to": 10}  # float16
    else:
        ins = [x]
    return ins, host, attrs


@pytest.mark.parametrize("op", sorted(ELEMENTWISE_OPS & set(OPS)))
def test_every_elementwise_op_keeps_a_channels_last_input_and_its_values(op, rng):
    ins, host, attrs = _inputs(op, rng)
    ctx = OpContext(np, _node(op, **attrs), 17, host)
    want = OPS[op](ctx, ins)
    last = [None if a is None or np.ndim(a) < 4 else to_layout(a, "NHWC", np) for a in ins]
    last = [b if b is not None else a for a, b in zip(ins, last)]
    got = in_input_order(_c_order(OPS[op]))(ctx, last)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    assert is_layout(got[0], "NHWC") and not got[0].flags.c_contiguous, op
    # without the wrapper the stand-in gives C order: what the device did before
    assert OPS[op](ctx, ins)[0].flags.c_contiguous


def test_the_first_activation_input_decides(rng):
    x = rng.standard_normal(SHAPE).astype(np.float32)
    nhwc, one_channel = to_layout(x, "NHWC", np), rng.standard_normal((2, 1, 3, 4)).astype(np.float32)
    assert deciding_perm(np, [nhwc, x]) == (0, 2, 3, 1)
    assert deciding_perm(np, [x, nhwc]) is None  # C order first: C order
    assert deciding_perm(np, [one_channel, nhwc]) == (0, 2, 3, 1)  # both layouts at once: the next decides
    assert deciding_perm(np, [None, x[0, 0], nhwc]) == (0, 2, 3, 1)  # omitted and rank-2 inputs skip
    fake_xp = object()  # a device module: host NumPy arrays are constants and never decide
    assert deciding_perm(fake_xp, [x, nhwc]) is None and deciding_perm(fake_xp, [x]) is None


def test_an_operand_of_higher_rank_leaves_the_op_as_it_is(rng):
    x = to_layout(rng.standard_normal((2, 5, 3)).astype(np.float32), "NHWC", np)
    big = rng.standard_normal((4, 2, 5, 3)).astype(np.float32)
    ctx = OpContext(np, _node("Add"), 17, {})
    (got,) = in_input_order(_c_order(OPS["Add"]))(ctx, [x, big])
    np.testing.assert_array_equal(got, x + big)
    assert got.flags.c_contiguous


def test_device_steps_wrap_only_elementwise_ops():
    assert for_device("Reshape", OPS["Reshape"]) is OPS["Reshape"]
    assert for_device("Mul", OPS["Mul"]) is not OPS["Mul"]


def test_batch_normalization_keeps_a_channels_last_input(rng):
    x = rng.standard_normal(SHAPE).astype(np.float32)
    params = [rng.standard_normal(5).astype(np.float32) for _ in range(3)] + [np.abs(rng.standard_normal(5)).astype(np.float32) + 0.1]
    ctx = OpContext(np, _node("BatchNormalization"), 15, {})
    (want,) = OPS["BatchNormalization"](ctx, [x, *params])
    (got,) = OPS["BatchNormalization"](ctx, [to_layout(x, "NHWC", np), *params])
    np.testing.assert_array_equal(got, want)
    assert channels_last_perm(got) == (0, 2, 3, 1)


@pytest.mark.parametrize("op", ["Add", "Mul", "Relu", "Exp"])
def test_a_direct_step_into_a_channels_last_buffer_computes_in_its_order(op, rng):
    from graphopt.lowering.layout import empty
    from graphopt.runtime.compiled import _direct_run

    x = to_layout(rng.standard_normal(SHAPE).astype(np.float32), "NHWC", np)
    c = rng.standard_normal((1, 5, 1, 1)).astype(np.float32)
    ins = [x, c] if op in ("Add", "Mul") else [x]
    want = OPS[op](OpContext(np, _node(op), 17, {}), ins)[0]
    out = empty(SHAPE, np.float32, "NHWC", np)
    step = type("S", (), {"op": op, "node": _node(op)})()
    (got,) = _direct_run(step, out, np)(ins)
    assert got is out
    np.testing.assert_allclose(out, want, rtol=1e-6)


def _se_block_model():
    """X -> Conv+Relu -> Y; Mul(Sigmoid(GlobalAveragePool(Y)), Y) -> Conv -> Z: EfficientNet's
    squeeze-excite shape, the Mul between two convolutions."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((5, 4, 3, 3)).astype(np.float32) * 0.3, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((3, 5, 1, 1)).astype(np.float32) * 0.3, "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["y"]),
             helper.make_node("GlobalAveragePool", ["y"], ["g"]),
             helper.make_node("Sigmoid", ["g"], ["s"]),
             helper.make_node("Mul", ["s", "y"], ["m"]),
             helper.make_node("Conv", ["m", "w2"], ["z"])]
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4, 6, 6])],
                          [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2, 3, 6, 6])], [w1, w2])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_an_se_mul_between_nhwc_lowerings_needs_no_conversion(fake_cuda, monkeypatch):
    """On the fake CuPy (whose ufuncs write C order, as CuPy's) with CBR lowerings that read and write
    NHWC (bench/conversions_cpu.py's, installed through monkeypatch): the Mul's output stays NHWC, so
    the only conversion is the graph input's, at the region's edge; the outputs match onnxruntime."""
    import graphopt
    from graphopt.runtime import Session, to_numpy
    from _runtime_helpers import ort_run, rel_err
    from _scripts import load_script

    bench = load_script("bench/conversions_cpu.py")
    model = _se_block_model()
    opt, _ = graphopt.optimize(model, gpu="none")
    assert [n.op_type for n in opt.graph.node].count("Mul") == 1
    bench.install_lowerings({n.name: "NHWC" for n in opt.graph.node if n.op_type == "CBR"}, patch=monkeypatch.setattr)
    converted = bench.record_conversions(patch=monkeypatch.setattr)
    sess = Session(opt, device="cuda", cuda_graphs=False)
    x = np.random.default_rng(0).standard_normal((2, 4, 6, 6)).astype(np.float32)
    want = ort_run(model, {"x": x})["z"]
    for _ in range(3):  # the trace, then the compiled loop
        converted.clear()
        got = to_numpy(sess.run({"x": x})["z"])
        assert rel_err(got, want) <= 1e-4
        assert converted == [{"shape": [2, 4, 6, 6], "to": "NHWC"}], converted  # the graph input only
