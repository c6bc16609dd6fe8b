"""The runtime's pooling kernel (graphopt.kernels.pool) against the array-module pooling on the host
(float64), over NCHW and NHWC storage, odd sizes, pads, strides, dilations, ceil mode, count_include_pad,
1-D windows and the global forms (``global_pool``, its positions split across blocks), fp16 and fp32;
the output keeps the input's layout; it captures."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

from graphopt.kernels import pool  # noqa: E402
from graphopt.lowering.layout import is_layout, to_layout  # noqa: E402
from graphopt.runtime.onnx_ops.pooling import pool_kernel_args  # noqa: E402
from graphopt.runtime.onnx_ops.registry import OPS, OpContext  # noqa: E402

CASES = [  # op, input shape, attributes
    ("MaxPool", (32, 64, 112, 112), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", (3, 5, 13, 11), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 1, 1], ceil_mode=1)),
    ("MaxPool", (2, 7, 17, 9), dict(kernel_shape=[3, 3], dilations=[2, 1], pads=[2, 1, 2, 1])),
    ("MaxPool", (2, 3, 29), dict(kernel_shape=[4], strides=[3], pads=[1, 2])),
    ("AveragePool", (3, 5, 13, 11), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", (3, 5, 13, 11), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", (2, 6, 10, 10), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, count_include_pad=1)),
    ("AveragePool", (2, 4, 31), dict(kernel_shape=[5], pads=[2, 2])),
    ("GlobalAveragePool", (32, 2048, 7, 7), {}),
    ("GlobalAveragePool", (4, 16, 1, 1), {}),  # H = W = 1: NCHW and NHWC strides coincide
    ("GlobalAveragePool", (3, 5, 1, 13), {}),
    ("GlobalMaxPool", (3, 9, 7, 5), {}),
    # global_pool's split positions (bs1 squeeze-excite pools of EfficientNet-B0), odd sizes, a window
    # that covers its input
    ("GlobalAveragePool", (1, 32, 112, 112), {}),
    ("GlobalAveragePool", (1, 1152, 7, 7), {}),
    ("GlobalAveragePool", (2, 13, 37, 29), {}),
    ("GlobalMaxPool", (1, 40, 56, 56), {}),
    ("AveragePool", (2, 24, 9, 9), dict(kernel_shape=[9, 9])),
]


class _Node:  # what OpContext reads of a node: its attributes and outputs
    outputs = ["y"]

    def __init__(self, attrs):
        self.attrs = dict(attrs)

    def attr(self, name, default=None):
        return self.attrs.get(name, default)


def _node(op, attrs):
    return _Node(attrs)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}")
def test_pool_kernel_matches_the_reference(case, layout, dtype):
    op, shape, attrs = case
    rng = np.random.default_rng(len(shape) * 7 + shape[1])
    x = rng.standard_normal(shape).astype(dtype)
    if op in ("MaxPool", "GlobalMaxPool"):  # NaN propagates through max: first cell, and the last of the last channel
        x[(0,) * len(shape)] = np.nan
        x[(-1,) * len(shape)] = np.nan if op == "GlobalMaxPool" else x[(-1,) * len(shape)]
    node = _node(op, attrs)
    want = OPS[op](OpContext(np, node, 17, {}), [x.astype(np.float64)])[0]
    xd = to_layout(cp.asarray(x), layout, cp)
    ctx = OpContext(cp, node, 17, {}, pool=pool)
    got = OPS[op](ctx, [xd])[0]
    assert got.shape == want.shape and got.dtype == x.dtype
    if len(shape) == 4:
        assert is_layout(got, layout), (got.strides, layout)
    tol = 2e-2 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(cp.asnumpy(got).astype(np.float64), want, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("op, shape, attrs", [("MaxPool", (4, 8, 15, 15), dict(kernel_shape=[3, 3], strides=[2, 2])),
                                               ("GlobalAveragePool", (1, 32, 112, 112), {})])
def test_pool_kernel_captures_in_a_cuda_graph(op, shape, attrs):
    """Captured and replayed (the split global average zeroes its fp32 sums inside the graph: a replay
    must not add to the capture's)."""
    x = to_layout(cp.asarray(np.random.default_rng(0).standard_normal(shape).astype(np.float16)), "NHWC", cp)
    ctx = OpContext(cp, _node(op, attrs), 17, {}, pool=pool)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        OPS[op](ctx, [x])  # compiled outside the capture
        s.begin_capture()
        try:
            y = OPS[op](ctx, [x])[0]
        finally:
            g = s.end_capture()
        for _ in range(2):
            y.fill(cp.nan)
            g.launch(s)
        s.synchronize()
    want = OPS[op](OpContext(np, ctx.node, 17, {}), [cp.asnumpy(x).astype(np.float64)])[0]
    np.testing.assert_allclose(cp.asnumpy(y).astype(np.float64), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[8], CASES[12], CASES[14]], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}")
def test_pool_kernel_writes_a_given_output(case, layout):
    """``out=`` (a compiled plan's arena view): the same values as a fresh output, in the given buffer."""
    op, shape, attrs = case
    x = to_layout(cp.asarray(np.random.default_rng(1).standard_normal(shape).astype(np.float16)), layout, cp)
    ctx = OpContext(cp, _node(op, attrs), 17, {}, pool=pool)
    want = OPS[op](ctx, [x])[0]
    args = pool_kernel_args(ctx, x, op)
    out = cp.full_like(want, cp.nan)  # keeps want's strides (the input's layout)
    got = pool.pool2d(cp, x, *args, out=out)
    assert got.data.ptr == out.data.ptr and got.shape == want.shape
    assert bool(cp.array_equal(got, want, equal_nan=True))


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_a_split_global_average_in_a_session_replays_new_feeds(cuda_graphs):
    """GlobalAveragePool over 1 x 32 x 112 x 112 (its positions split across blocks, two kernels and a
    buffer of partial sums) inside the runtime: the whole-plan CUDA graph, or eager runs replaying the
    step's own graph, give each of two alternating feeds' means."""
    from onnx import TensorProto, helper

    from graphopt.runtime import Session, to_numpy

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["y"])],
                          "gap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 112, 112])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 1, 1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = Session(model, device="cuda", dtype="float16", cuda_graphs=cuda_graphs)
    rng = np.random.default_rng(5)
    feeds = [rng.standard_normal((1, 32, 112, 112)).astype(np.float32) for _ in range(2)]
    want = [np.maximum(f.astype(np.float16).astype(np.float64), 0).mean(axis=(2, 3), keepdims=True) for f in feeds]
    for i in range(6):
        got = to_numpy(sess.run({"x": feeds[i % 2]})["y"]).astype(np.float64)
        np.testing.assert_allclose(got, want[i % 2], rtol=2e-3, atol=2e-3, err_msg=f"run {i}")
    if cuda_graphs:
        assert sess.graph_status == "replaying a CUDA graph"
