"""Pooling kernels for the runtime's standard ops (MaxPool, AveragePool, GlobalAveragePool,
GlobalMaxPool) on the device: one launch per node, in whatever layout the input is stored.

The runtime's array-module pooling (window slices and elementwise maxima) costs one kernel per
window cell plus a padded copy, and on an NHWC input every one of those walks strided memory: on the
H200 ResNet-50's stem MaxPool took 552 us at bs32 fp16 that way (bench/results/plan_breakdown_h200.md).
This kernel reads each input cell once per window that covers it and writes the output in the
input's layout, so an NHWC region stays NHWC through its pooling.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from graphopt.kernels.source import CTYPE, get_kernel, instance
from graphopt.lowering.layout import empty, is_layout

SOURCE = "pool.cu"
MODES = {"max": 0, "avg": 1, "avg_pad": 2}
THREADS = 256
MAX_BLOCKS = 65536


def instances() -> list[tuple[str, str]]:
    """Every (source, instance) the runtime can launch."""
    return [(SOURCE, instance("pool2d", dt, m)) for dt in CTYPE for m in MODES.values()]


def supports(x: Any, kernel: Sequence[int]) -> bool:
    """Whether ``pool2d`` takes this input: 1-D or 2-D windows over an fp16/fp32 N-C-spatial tensor."""
    return str(x.dtype) in CTYPE and x.ndim in (3, 4) and len(kernel) == x.ndim - 2


def pool2d(xp: Any, x: Any, kind: str, kernel: Sequence[int], strides: Sequence[int], dil: Sequence[int],
           pads: Sequence[int], outs: Sequence[int]) -> Any:
    """``kind`` ("max", "avg", "avg_pad") pooling of ``x`` (N, C, H, W) or (N, C, L) with ONNX's
    geometry (``pads`` = begins then ends; ``outs`` = output spatial sizes). The output has the
    input's layout (NHWC strides in, NHWC strides out)."""
    nd = len(kernel)
    if nd == 1:  # (N, C, L) as (N, C, 1, L)
        y = pool2d(xp, x[:, :, None, :], kind, [1, kernel[0]], [1, strides[0]], [1, dil[0]],
                   [0, pads[0], 0, pads[1]], [1, outs[0]])
        return y[:, :, 0, :]
    n, c, h, w = (int(d) for d in x.shape)
    oh, ow = int(outs[0]), int(outs[1])
    layout = "NHWC" if not is_layout(x, "NCHW") and is_layout(x, "NHWC") else "NCHW"
    y = empty((n, c, oh, ow), x.dtype, layout, xp)
    total = n * c * oh * ow
    if total == 0:
        return y
    item = x.dtype.itemsize
    sx = [int(s) // item for s in x.strides]
    sy = [int(s) // y.dtype.itemsize for s in y.strides]
    k = get_kernel(SOURCE, instance("pool2d", str(x.dtype), MODES[kind]))
    i32, i64 = np.int32, np.int64
    blocks = min(MAX_BLOCKS, (total + THREADS - 1) // THREADS)
    k((blocks,), (THREADS,), (x, y, i32(n), i32(c), i32(h), i32(w), *(i64(s) for s in sx), i32(oh), i32(ow),
                              *(i64(s) for s in sy), i32(kernel[0]), i32(kernel[1]), i32(strides[0]),
                              i32(strides[1]), i32(dil[0]), i32(dil[1]), i32(pads[0]), i32(pads[1]), i32(pads[2]),
                              i32(pads[3]), i32(1 if layout == "NHWC" else 0)))
    return y
