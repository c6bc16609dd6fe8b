"""The timer's rotated operand sets on the GPU keep the layouts the lowering declared: a ``rowpad``
output (rows padded to 16 bytes) and an NHWC input stay so in every set (CPU twin on NumPy:
tests/unit/test_timing_clone.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import require_device  # noqa: E402

require_device()

import cupy  # noqa: E402

from graphopt.kernels.timing import cuda_event_timer  # noqa: E402
from graphopt.lowering.layout import empty, is_layout  # noqa: E402


def test_every_rotated_set_keeps_rowpad_and_nhwc():
    x = empty((2, 8, 33, 17), np.float16, "NHWC", cupy)
    x[...] = cupy.arange(x.size, dtype=cupy.float32).reshape(x.shape).astype(cupy.float16) % 97
    y = empty((1, 128, 50257), np.float16, "rowpad", cupy)  # 12.9 MB: the timer makes ~10 sets for 128 MiB
    seen = []

    def launch(inputs, outputs):
        xi, yo = inputs[0], outputs[0]
        seen.append((is_layout(xi, "NHWC"), is_layout(yo, "rowpad"), yo.strides == y.strides,
                     bool((xi == x).all())))
        yo[..., :1] = 0

    cuda_event_timer(launch, [x], [y], warmup=1, reps=12, spin_cycles=0)
    assert len(seen) >= 12 and all(all(s) for s in seen), seen[:3]
