"""``Candidate.layouts(sig)`` (what the tuner counts conversions with, on any machine) equals the
``layouts`` of the ``Lowering`` that ``build(sig)`` returns on the GPU, for one candidate of every
family that applies to MobileNetV2- and ResNet-like CBR signatures and a GEMM."""

from __future__ import annotations

import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

from graphopt.kernels.registry import applicable, signature_of  # noqa: E402
from graphopt.lowering.contract import as_lowering  # noqa: E402
from graphopt.tune.gpus import detect_devices  # noqa: E402

SIGS = [
    signature_of("CBR", [(2, 32, 28, 28), (32, 1, 3, 3), (32,), None], ["float16"] * 3 + [""],
                 {"group": 32, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "activation": "Relu"}),
    signature_of("CBR", [(2, 32, 28, 28), (64, 32, 1, 1), (64,), None], ["float16"] * 3 + [""],
                 {"kernel_shape": [1, 1], "activation": "none"}),
    signature_of("CBR", [(2, 64, 14, 14), (64, 64, 3, 3), (64,), (2, 64, 14, 14)], ["float16"] * 4,
                 {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "activation": "Relu"}),
    signature_of("GemmAct", [(64, 256), (256, 128), (128,)], ["float16"] * 3, {"mode": "matmul", "activation": "Relu"}),
]


@pytest.mark.parametrize("sig", SIGS, ids=lambda s: s.key()[:60])
def test_declared_layouts_match_the_built_lowering(sig):
    dev = detect_devices()[0]
    ok, _ = applicable(sig, dev.compute_capability)
    seen: set[str] = set()
    checked = []
    for cand in ok:
        if cand.name in seen:
            continue
        seen.add(cand.name)
        try:
            low = as_lowering(cand.build(sig, dev.arch))
        except Exception:  # noqa: BLE001 - a plan that does not build is the tuner's business, not this test's
            continue
        assert tuple(cand.layouts(sig)) == tuple(low.layouts), cand.key()
        checked.append(cand.key())
    assert checked, "no candidate built"


@pytest.mark.parametrize("shape", [(3, 5), (2, 7, 50257), (1, 9)])
def test_rowpad_to_c_order_and_back_by_pitched_copy_on_the_gpu(shape):
    """``to_layout`` between ``rowpad`` and C order on CuPy (one cudaMemcpy2DAsync each way) keeps
    every value and writes nothing past a row; outputs poisoned first."""
    from graphopt.lowering import layout

    rng = cupy.random.default_rng(0)
    padded = layout.empty(shape, cupy.float16, "rowpad", cupy)
    padded.base[...] = cupy.nan
    padded[...] = rng.standard_normal(shape, dtype=cupy.float32).astype(cupy.float16)
    dense = layout.to_layout(padded, "rowmajor", cupy)
    assert dense.flags.c_contiguous
    cupy.testing.assert_array_equal(dense, padded)
    back = layout.empty(shape, cupy.float16, "rowpad", cupy)
    back.base[...] = 7
    layout.copy_rows(back, dense, cupy)
    cupy.testing.assert_array_equal(back, padded)
    assert bool(cupy.all(back.base[..., shape[-1]:] == 7))


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (32, 96, 56, 56), (1, 1280, 7, 7), (3, 33, 1, 65)])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_the_runtime_converts_nchw_and_nhwc_by_the_tiled_transpose(shape, dtype):
    """``graphopt.kernels.transpose.to_layout`` (the runtime's conversions) each way equals the input,
    in the asked layout; outputs poisoned first through the pool (a fresh block may hold anything)."""
    from graphopt.kernels import transpose
    from graphopt.lowering import layout

    x = cupy.random.default_rng(1).standard_normal(shape, dtype=cupy.float32).astype(dtype)
    cupy.full(x.size * 2, cupy.nan, dtype=dtype)  # poison what the pool hands out next
    y = transpose.to_layout(x, "NHWC", cupy)
    assert layout.is_layout(y, "NHWC")
    cupy.testing.assert_array_equal(y, x)
    back = transpose.to_layout(y, "NCHW", cupy)
    assert back.flags.c_contiguous
    cupy.testing.assert_array_equal(back, x)


def test_the_tiled_transpose_reads_an_offset_nhwc_view():
    """An NHWC view that does not start at its buffer's start (``x[1:]`` of an NHWC batch, as an arena
    view or a sliced feed is): the transpose reads from the view's first element."""
    from graphopt.kernels import transpose
    from graphopt.lowering import layout

    full = layout.to_layout(cupy.random.default_rng(2).standard_normal((3, 16, 7, 5), dtype=cupy.float32)
                            .astype(cupy.float16), "NHWC", cupy)
    view = full[1:]
    assert layout.is_layout(view, "NHWC") and view.data.ptr != full.data.ptr
    got = transpose.to_layout(view, "NCHW", cupy)
    assert got.flags.c_contiguous
    cupy.testing.assert_array_equal(got, view)


@pytest.mark.parametrize("op", ["Mul", "Add", "Sigmoid", "Clip", "Where"])
def test_elementwise_ops_keep_a_channels_last_input_on_cupy(op):
    """CuPy's ufuncs write C order; the runtime's elementwise steps (runtime/onnx_ops/layout_order)
    hand them channels-last views, so the result stays channels-last and equals the C-order one."""
    import numpy as np

    from graphopt.lowering.layout import channels_last_perm, to_layout
    from graphopt.runtime.onnx_ops.layout_order import for_device
    from graphopt.runtime.onnx_ops.registry import OPS, OpContext

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 40, 7, 9)).astype(np.float16)
    s = rng.standard_normal((3, 40, 1, 1)).astype(np.float16)
    node = type("N", (), {"op_type": op, "name": op, "attr": lambda self, k, d=None: d})()
    host = {1: np.float16(-0.5), 2: np.float16(0.5)} if op == "Clip" else {}
    ins = {"Mul": [s, x], "Add": [x, s], "Sigmoid": [x], "Clip": [x, None, None], "Where": [x > 0, x, s]}[op]
    dev = [None if a is None else cupy.asarray(a) for a in ins]
    last = [None if a is None else (to_layout(a, "NHWC", cupy) if a.shape == x.shape else a) for a in dev]
    ctx = OpContext(cupy, node, 17, host)
    (want,) = OPS[op](ctx, dev)
    (got,) = for_device(op, OPS[op])(ctx, last)
    assert channels_last_perm(got) == (0, 2, 3, 1), (op, got.strides)
    np.testing.assert_array_equal(cupy.asnumpy(got), cupy.asnumpy(want))


@pytest.mark.parametrize("op", ["Add", "Mul", "Relu"])
def test_a_direct_step_into_a_channels_last_arena_buffer_on_cupy(op):
    """A compiled elementwise step writing into a channels-last buffer (compiled._direct_in_order):
    the ufunc's ``out`` is that buffer's C-contiguous channels-last view; values as the op's."""
    import numpy as np

    from graphopt.lowering.layout import empty, to_layout
    from graphopt.runtime.compiled import _direct_run
    from graphopt.runtime.onnx_ops.registry import OPS, OpContext

    rng = np.random.default_rng(1)
    x = to_layout(cupy.asarray(rng.standard_normal((2, 24, 5, 7)).astype(np.float16)), "NHWC", cupy)
    c = cupy.asarray(rng.standard_normal((1, 24, 1, 1)).astype(np.float16))
    ins = [x, c] if op != "Relu" else [x]
    node = type("N", (), {"op_type": op, "name": op, "attr": lambda self, k, d=None: d})()
    (want,) = OPS[op](OpContext(cupy, node, 17, {}), ins)
    out = empty((2, 24, 5, 7), np.float16, "NHWC", cupy)
    out[...] = cupy.nan
    step = type("S", (), {"op": op, "node": node})()
    (got,) = _direct_run(step, out, cupy)(ins)
    assert got is out
    np.testing.assert_array_equal(cupy.asnumpy(out), cupy.asnumpy(want))
