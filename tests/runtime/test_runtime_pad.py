"""pad_constant: the capture-safe constant pad the runtime's Conv / Pool / LRN / Pad use."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt.runtime.onnx_ops.windows import pad_constant


@pytest.mark.parametrize("shape, widths, fill", [
    ((2, 3, 5, 7), [(0, 0), (0, 0), (1, 2), (3, 0)], 0.0),
    ((1, 4, 3), [(0, 0), (2, 1), (0, 0)], 1.0),
    ((2, 2, 4, 4), [(0, 0), (0, 0), (0, 0), (0, 0)], 5.0),  # nothing to pad: the input itself
    ((3, 1, 2, 2), [(1, 1), (0, 2), (1, 0), (0, 1)], -np.inf),
])
def test_pad_constant_equals_numpy_pad(shape, widths, fill, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    got = pad_constant(np, x, widths, fill)
    want = np.pad(x, widths, mode="constant", constant_values=fill)
    assert got.dtype == x.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
