"""``layout.row_pitch`` / ``copy_rows``: which arrays are equally spaced rows, and that a copy between
two of them is one pitched memcpy on CuPy (a fake CuPy here records the call and performs it on host
memory) and plain assignment otherwise, including to and from ``rowpad``."""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

from graphopt.lowering import layout


@pytest.mark.parametrize("make, pitch", [
    (lambda: np.zeros((3, 5), np.float16), 10),
    (lambda: layout.empty((3, 5), np.float16, "rowpad", np), 16),
    (lambda: layout.empty((2, 3, 33), np.float32, "rowpad", np), 144),
    (lambda: np.zeros((4, 1, 7), np.float16)[:, :, :5], 14),  # a size-1 dim keeps no stride
    (lambda: np.zeros((1, 7), np.float16), 14),  # one row
    (lambda: np.zeros((2, 3, 8), np.float16)[:, :, :5], 16),
])
def test_row_pitch_of_equally_spaced_rows(make, pitch):
    assert layout.row_pitch(make()) == pitch


@pytest.mark.parametrize("make", [
    lambda: np.zeros((4, 6), np.float16).T,  # columns, not rows
    lambda: np.zeros((4, 6, 8), np.float16)[:, :3, :5],  # rows not equally spaced across dim 0
    lambda: np.broadcast_to(np.zeros(5, np.float16), (3, 5)),  # pitch 0
    lambda: np.zeros((3, 5), np.float16)[::-1],  # negative pitch
    lambda: np.zeros((0, 5), np.float16),  # nothing to copy
    lambda: np.zeros((), np.float16),
    lambda: np.zeros((2, 3, 4, 5), np.float16).transpose(0, 2, 3, 1),  # NHWC
])
def test_row_pitch_near_misses(make):
    assert layout.row_pitch(make()) is None


class _FakeCupy(types.SimpleNamespace):
    """Just what ``copy_rows`` calls; memcpy2DAsync performed on host addresses."""

    def __init__(self):
        calls = []

        def memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream):
            calls.append((dpitch, spitch, width, height))
            for r in range(height):
                ctypes.memmove(dst + r * dpitch, src + r * spitch, width)

        runtime = types.SimpleNamespace(memcpy2DAsync=memcpy2d, memcpyDeviceToDevice=3)
        cuda = types.SimpleNamespace(runtime=runtime, get_current_stream=lambda: types.SimpleNamespace(ptr=0))
        super().__init__(__name__="cupy", cuda=cuda, calls=calls)


class _HostArray(np.ndarray):
    """A NumPy array with CuPy's ``.data.ptr`` (the address of its first element)."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


def _host(a):
    return a.view(_HostArray)


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 33), (1, 1), (7, 50257 % 97)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_copy_rows_rowpad_to_c_order_and_back_is_one_pitched_copy(shape, dtype, monkeypatch):
    monkeypatch.setattr(layout, "MIN_PITCHED_ROW_BYTES", 1)
    xp = _FakeCupy()
    rng = np.random.default_rng(0)
    padded = layout.empty(shape, dtype, "rowpad", np)
    padded.base[...] = np.nan  # the padding must not travel
    padded[...] = rng.standard_normal(shape).astype(dtype)
    dense = np.full(shape, np.nan, dtype)
    layout.copy_rows(_host(dense), _host(padded), xp)
    np.testing.assert_array_equal(dense, padded)
    back = layout.empty(shape, dtype, "rowpad", np)
    back.base[...] = 7
    layout.copy_rows(_host(back), _host(dense), xp)
    np.testing.assert_array_equal(back, padded)
    rows = int(np.prod(shape[:-1]))
    item = np.dtype(dtype).itemsize
    assert xp.calls == [(shape[-1] * item, layout.row_pitch(padded), shape[-1] * item, rows),
                        (layout.row_pitch(back), shape[-1] * item, shape[-1] * item, rows)]
    assert np.all(back.base[..., shape[-1]:] == 7)  # nothing written past a row


def test_copy_rows_falls_back_to_assignment_off_cupy_or_for_other_strides():
    xp = _FakeCupy()
    src = np.arange(24, dtype=np.float32).reshape(4, 6)
    dst = np.zeros((6, 4), np.float32).T  # columns
    layout.copy_rows(dst, src, xp)
    np.testing.assert_array_equal(dst, src)
    assert xp.calls == []
    out = layout.empty((4, 6), np.float32, "rowpad", np)
    layout.copy_rows(out, src, np)  # NumPy: assignment
    np.testing.assert_array_equal(out, src)


@pytest.mark.parametrize("target", ["rowpad", "rowmajor", "NCHW"])
def test_to_layout_between_rowpad_and_c_order_keeps_values(target):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 13)).astype(np.float16)
    src = layout.to_layout(x, "rowpad", np) if target != "rowpad" else x
    got = layout.to_layout(src, target, np)
    assert layout.is_layout(got, target)
    np.testing.assert_array_equal(got, x)


def test_narrow_rows_are_copied_by_the_array_module():
    xp = _FakeCupy()
    src = layout.empty((64, 33), np.float16, "rowpad", np)
    src[...] = 1
    dst = np.zeros((64, 33), np.float16)
    layout.copy_rows(_host(dst), _host(src), xp)  # 66-byte rows
    assert xp.calls == [] and np.all(dst == 1)
