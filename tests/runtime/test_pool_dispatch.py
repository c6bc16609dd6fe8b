"""The standard pooling ops hand their geometry to the backend's pooling kernel when there is one
(the kernel itself is tested on the GPU: tests/gpu/test_pool_gpu.py), and use the array-module path
when there is none or the input is outside what the kernel takes."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt.runtime.onnx_ops.registry import OPS, OpContext


class _Node:
    outputs = ["y"]

    def __init__(self, attrs):
        self.attrs = attrs

    def attr(self, name, default=None):
        return self.attrs.get(name, default)


class _FakePool:
    def __init__(self):
        self.calls = []

    @staticmethod
    def supports(x, kernel):
        return x.dtype == np.float32 and x.ndim in (3, 4)

    def pool2d(self, xp, x, kind, kernel, strides, dil, pads, outs):
        self.calls.append((kind, list(kernel), list(strides), list(dil), list(pads), list(outs)))
        return "kernel"


@pytest.mark.parametrize("op,attrs,want", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), ("max", [3, 3], [2, 2], [1, 1], [1, 1, 1, 1], [5, 4])),
    ("AveragePool", dict(kernel_shape=[2, 2]), ("avg", [2, 2], [1, 1], [1, 1], [0, 0, 0, 0], [8, 6])),
    ("AveragePool", dict(kernel_shape=[2, 2], count_include_pad=1, pads=[1, 0, 1, 0]),
     ("avg_pad", [2, 2], [1, 1], [1, 1], [1, 0, 1, 0], [10, 6])),
    ("GlobalAveragePool", {}, ("avg", [9, 7], [1, 1], [1, 1], [0, 0, 0, 0], [1, 1])),
    ("GlobalMaxPool", {}, ("max", [9, 7], [1, 1], [1, 1], [0, 0, 0, 0], [1, 1])),
])
def test_pooling_ops_dispatch_to_the_kernel(op, attrs, want):
    fake = _FakePool()
    x = np.zeros((2, 3, 9, 7), np.float32)
    out = OPS[op](OpContext(np, _Node(attrs), 17, {}, pool=fake), [x])
    assert out == ["kernel"] and fake.calls == [want]


def test_pooling_without_a_kernel_or_outside_it_uses_the_array_path():
    x = np.arange(2 * 3 * 4 * 4, dtype=np.float64).reshape(2, 3, 4, 4)  # float64: outside the kernel
    fake = _FakePool()
    node = _Node(dict(kernel_shape=[2, 2], strides=[2, 2]))
    got = OPS["MaxPool"](OpContext(np, node, 17, {}, pool=fake), [x])[0]
    assert fake.calls == [] and got.shape == (2, 3, 2, 2) and got[0, 0, 0, 0] == 5


class _OutPool(_FakePool):
    def pool2d(self, xp, x, kind, kernel, strides, dil, pads, outs, out=None):
        self.calls.append((kind, list(kernel), list(outs), out))
        return out


@pytest.mark.parametrize("op,attrs", [("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
                                      ("GlobalAveragePool", {})])
def test_a_compiled_plan_pools_straight_into_its_arena_view(op, attrs):
    """compiled._pool_direct: the geometry is decoded once at compile time and every run writes the
    step's arena view (``out=``), so the step can be replayed from its own CUDA graph."""
    from types import SimpleNamespace

    from graphopt.runtime import compiled

    fake = _OutPool()
    x = np.zeros((2, 3, 9, 7), np.float32)
    node = _Node(attrs)
    step = SimpleNamespace(op=op, node=node)
    backend = SimpleNamespace(xp=np, pool=fake)
    make = compiled._pool_direct(step, [x], None, backend)
    view = np.empty((2, 3, 5, 4) if op == "MaxPool" else (2, 3, 1, 1), np.float32)
    run = make(view)
    assert run([x])[0] is view and run([x])[0] is view
    assert len(fake.calls) == 2 and all(c[3] is view for c in fake.calls)
    assert compiled._pool_direct(step, [x.astype(np.float64)], None, backend) is None  # outside the kernel
    assert compiled._pool_direct(step, [x], None, SimpleNamespace(xp=np, pool=None)) is None


def test_concat_keeps_an_nhwc_region_nhwc():
    """A Concat of channels-last inputs stores its output channels-last (the layout choice counts on
    it); NCHW inputs give the usual NCHW output; the values are the same either way."""
    from graphopt.lowering.layout import is_layout, to_layout

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 6, 4, 5))
    want = np.concatenate([a, b], axis=1)
    ctx = OpContext(np, _Node({"axis": 1}), 17, {})
    got = OPS["Concat"](ctx, [to_layout(a, "NHWC", np), to_layout(b, "NHWC", np)])[0]
    assert is_layout(got, "NHWC") and not is_layout(got, "NCHW") and np.array_equal(got, want)
    got = OPS["Concat"](OpContext(np, _Node({"axis": -3}), 17, {}), [to_layout(a, "NHWC", np), b])[0]
    assert is_layout(got, "NHWC") and np.array_equal(got, want)
    plain = OPS["Concat"](ctx, [a, b])[0]
    assert plain.flags.c_contiguous and np.array_equal(plain, want)
