"""``graphopt.kernels.transpose.to_layout``: NCHW <-> NHWC of a dense 4-D fp16/fp32 CuPy array is one
launch of the tiled transpose (rows and cols as the kernel reads them, the grid over 32 x 32 tiles);
anything else goes to ``lowering.layout.to_layout``. On the fake CuPy the "kernel" performs the
transpose on the host, so the values are checked too; tests/gpu/test_layout_declared_gpu.py runs it."""

from __future__ import annotations

import numpy as np
import pytest



@pytest.fixture()
def launches(fake_cuda, monkeypatch):
    cp = fake_cuda
    from graphopt.kernels import transpose

    calls = []

    def get_kernel(source, expr):
        def run(grid, block, args):
            calls.append((expr, grid, block, args))
            x, y, rows, cols = args
            n = grid[2]
            src = np.asarray(x).transpose(0, 2, 3, 1) if not x.flags.c_contiguous else np.asarray(x)
            flat_in = np.ascontiguousarray(src).reshape(n, int(rows), int(cols))
            dst = y.transpose(0, 2, 3, 1) if not y.flags.c_contiguous else y
            dst.reshape(n, int(cols), int(rows))[...] = flat_in.transpose(0, 2, 1)

        return run

    monkeypatch.setattr(transpose, "get_kernel", get_kernel)
    return cp, calls


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (32, 96, 112, 112), (1, 1, 1, 1), (3, 33, 1, 65)])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_nchw_and_nhwc_convert_by_one_tiled_transpose_each_way(launches, shape, dtype):
    from graphopt.kernels import transpose
    from graphopt.lowering.layout import is_layout

    cp, calls = launches
    small = tuple(min(d, 9) for d in shape) if np.prod(shape) > 1e6 else shape
    x = cp.asarray(np.random.default_rng(0).standard_normal(small).astype(dtype))
    y = transpose.to_layout(x, "NHWC", cp)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    back = transpose.to_layout(y, "NCHW", cp)
    assert back.flags.c_contiguous
    np.testing.assert_array_equal(np.asarray(back), np.asarray(x))
    n, c, h, w = small
    if c > 1 and h * w > 1:
        assert is_layout(y, "NHWC") and not y.flags.c_contiguous
        (e1, g1, b1, a1), (e2, g2, b2, a2) = calls
        assert e1 == e2 == f"nchw_to_nhwc<{'half_t' if dtype == 'float16' else 'float'}>" and b1 == b2 == (32, 8)
        assert (int(a1[2]), int(a1[3])) == (c, h * w) and (int(a2[2]), int(a2[3])) == (h * w, c)
        assert g1 == (-(-h * w // 32), -(-c // 32), n) and g2 == (-(-c // 32), -(-h * w // 32), n)
    else:
        assert calls == []  # NCHW and NHWC are the same memory: nothing to convert


def test_other_layouts_dtypes_and_strides_take_the_array_module_path(launches):
    from graphopt.kernels import transpose

    cp, calls = launches
    x = cp.asarray(np.arange(2 * 3 * 4 * 5, dtype=np.int32).reshape(2, 3, 4, 5))
    np.testing.assert_array_equal(np.asarray(transpose.to_layout(x, "NHWC", cp)), np.asarray(x))
    f = cp.asarray(np.ones((2, 3, 4, 6), np.float16))[..., :5]  # not dense
    np.testing.assert_array_equal(np.asarray(transpose.to_layout(f, "NHWC", cp)), np.asarray(f))
    m = cp.asarray(np.ones((4, 6), np.float32))
    assert transpose.to_layout(m, "colmajor", cp).swapaxes(-1, -2).flags.c_contiguous
    assert calls == []
    assert transpose.grid(1, 70000 * 32, 5) is None and transpose.grid(65536, 3, 3) is None


def test_a_backend_without_kernels_converts_through_the_array_module():
    from graphopt.lowering import layout
    from graphopt.runtime.backend import _Backend

    assert _Backend().to_layout is layout.to_layout
