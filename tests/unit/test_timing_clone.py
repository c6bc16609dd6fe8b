"""``graphopt.kernels.timing._clone``: the timer's rotated copies keep the strides of the buffers the
lowering declared (dense, NHWC, rowpad), on NumPy here (the same code runs on CuPy arrays)."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt.kernels.timing import _clone
from graphopt.lowering.layout import empty, is_layout


@pytest.mark.parametrize("layout, shape", [("NCHW", (2, 3, 5, 7)), ("NHWC", (2, 3, 5, 7)), ("rowpad", (1, 4, 50257)),
                                           ("rowpad", (3, 5)), ("colmajor", (4, 6))])
def test_a_clone_has_the_strides_and_values_of_its_source(layout, shape):
    a = empty(shape, np.float16, layout, np)
    a[...] = (np.arange(np.prod(shape)) % 2039).reshape(shape).astype(np.float16)
    c = _clone(a)
    assert c.strides == a.strides and is_layout(c, layout) and c.dtype == a.dtype
    np.testing.assert_array_equal(c, a)
    assert not np.shares_memory(c, a)
    c[...] = 0
    assert a.any()  # writing the clone leaves the source alone


def test_rowpad_is_not_packed():
    a = empty((1, 4, 50257), np.float16, "rowpad", np)
    assert a.strides[1] != 50257 * 2  # the layout has gaps: order="K" alone would pack them
    assert _clone(a).strides[1] == a.strides[1]


def test_an_empty_or_torch_like_source():
    a = empty((0, 5), np.float32, "rowpad", np)
    assert _clone(a).shape == (0, 5)

    class T:
        def clone(self):
            return "cloned"

    assert _clone(T()) == "cloned"
