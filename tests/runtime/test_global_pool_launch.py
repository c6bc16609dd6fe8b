"""``graphopt.kernels.pool`` sends a global pooling (GlobalAveragePool, GlobalMaxPool, a window that
covers its input) to ``global_pool``: the launch's geometry (a block per n, channel tile and slice of
the positions; slices only for an average, each slice's sums written to an fp32 buffer that
``global_pool_finish`` adds up in order and scales into y) checked on the fake CuPy, whose kernels
record their launch. The kernel's values are tested on the GPU (tests/gpu/test_pool_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest



@pytest.fixture()
def launches(fake_cuda, monkeypatch):
    cp = fake_cuda
    from graphopt.kernels import pool

    calls = []

    def get_kernel(source, expr):
        return lambda grid, block, args, shared_mem=0: calls.append((expr, grid, block, args, shared_mem))

    monkeypatch.setattr(pool, "get_kernel", get_kernel)
    return cp, calls


def _global_args(x):
    n, c, h, w = x.shape
    return ("avg", [h, w], [1, 1], [1, 1], [0, 0, 0, 0], [1, 1])


@pytest.mark.parametrize("shape, layout, dtype", [
    ((1, 32, 112, 112), "NHWC", "float16"),  # EfficientNet-B0's first squeeze-excite pool at bs1
    ((1, 1152, 7, 7), "NHWC", "float16"),
    ((32, 2048, 7, 7), "NHWC", "float16"),  # ResNet-50's head at bs32
    ((2, 13, 37, 29), "NCHW", "float32"),
    ((32, 1152, 7, 7), "NCHW", "float16"),  # a small window in NCHW: 32 threads a block, not 256
    ((3, 5, 1, 13), "NHWC", "float32"),
])
def test_a_global_average_covers_every_channel_and_position_once(launches, shape, layout, dtype):
    from graphopt.kernels import pool
    from graphopt.lowering.layout import to_layout

    cp, calls = launches
    x = to_layout(cp.asarray(np.zeros(shape, dtype)), layout, cp)
    y = pool.pool2d(cp, x, *_global_args(x))
    assert y.shape == (shape[0], shape[1], 1, 1)
    main = calls[0]
    expr, (bx, slices), (tx, ty), args, shared = main
    assert expr.startswith("global_pool<") and expr.endswith(",1," + expr.split(",")[-1])
    vec = int(expr.rstrip(">").split(",")[-1])
    n, c, h, w = shape
    per_slice = int(args[-1])
    tiles = -(-(c // vec) // tx)
    assert tx * ty <= pool.THREADS and tx & (tx - 1) == 0 and ty & (ty - 1) == 0 and ty >= 8
    assert bx == n * tiles and tiles * tx * vec >= c
    assert slices * per_slice >= h * w > (slices - 1) * per_slice  # every position once, no empty slice
    assert shared == tx * ty * vec * 4
    if layout == "NHWC" and c % pool.VECS[dtype] == 0:
        assert vec == pool.VECS[dtype]
    if layout == "NCHW":
        assert tx == 1 and 32 <= ty <= max(32, h * w)  # one channel per block, threads on neighbouring positions
    else:
        assert tx * ty == pool.THREADS
    if slices > 1:
        assert per_slice >= ty * pool.MIN_PER_THREAD
        assert bx * slices <= max(pool.TARGET_BLOCKS, bx) + bx
        expr2, grid2, block2, args2, _ = calls[1]
        assert expr2.startswith("global_pool_finish<") and args2[0] is args[2]
        assert args2[0].shape == (slices * n * c,) and args2[0].dtype == np.float32
        assert int(args2[4]) == slices and float(args2[-1]) == pytest.approx(1.0 / (h * w))
    else:
        assert len(calls) == 1 and int(args[2]) == 0  # no fp32 buffer: a null pointer


def test_bs1_squeeze_excite_pool_is_split_across_blocks(launches):
    """The case that took milliseconds with one thread per output: now ~256 blocks."""
    from graphopt.kernels import pool
    from graphopt.lowering.layout import to_layout

    cp, calls = launches
    x = to_layout(cp.asarray(np.zeros((1, 32, 112, 112), np.float16)), "NHWC", cp)
    pool.pool2d(cp, x, *_global_args(x))
    (bx, slices) = calls[0][1]
    assert bx == 1 and 40 <= slices <= pool.TARGET_BLOCKS


def test_a_global_max_is_never_split_and_windowed_pools_keep_pool2d(launches):
    from graphopt.kernels import pool
    from graphopt.lowering.layout import to_layout

    cp, calls = launches
    x = to_layout(cp.asarray(np.zeros((1, 32, 112, 112), np.float16)), "NHWC", cp)
    pool.pool2d(cp, x, "max", [112, 112], [1, 1], [1, 1], [0, 0, 0, 0], [1, 1])
    assert calls[-1][0].startswith("global_pool<half_t,0,") and calls[-1][1][1] == 1
    pool.pool2d(cp, x, "max", [3, 3], [2, 2], [1, 1], [1, 1, 1, 1], [56, 56])
    pool.pool2d(cp, x, "avg", [112, 112], [1, 1], [1, 1], [1, 1, 1, 1], [3, 3])  # padded: not global
    assert [c[0].split("<")[0] for c in calls[-2:]] == ["pool2d", "pool2d"]


def test_every_global_pool_instance_is_prebuilt():
    from graphopt.kernels import pool
    from graphopt.kernels.registry import all_kernel_instances

    mine = {e for _, e in pool.instances() if e.startswith("global_pool")}
    assert len(mine) == 10 and mine <= {e for _, e in all_kernel_instances()}


def test_an_empty_spatial_input_keeps_the_windowed_kernel(launches):
    """No cell to pool over: the global path is not taken (it would divide the positions by zero slices)."""
    from graphopt.kernels import pool

    cp, calls = launches
    x = cp.asarray(np.zeros((2, 3, 0, 4), np.float16))
    pool.pool2d(cp, x, "avg", [0, 4], [1, 1], [1, 1], [0, 0, 0, 0], [1, 1])
    assert [c[0].split("<")[0] for c in calls] == ["pool2d"]
