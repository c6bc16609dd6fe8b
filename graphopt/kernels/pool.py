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
VECS = {"float16": 8, "float32": 4}  # channels per thread when they are contiguous: one 16-byte load
THREADS = 256
MAX_BLOCKS = 65536
MAX_ELEMENTS = 2**31 - 1  # the kernel's indices are 32-bit


def instances() -> list[tuple[str, str]]:
    """Every (source, instance) the runtime can launch."""
    return [(SOURCE, instance("pool2d", dt, m, v)) for dt in CTYPE for m in MODES.values() for v in (1, VECS[dt])]


def supports(x: Any, kernel: Sequence[int]) -> bool:
    """Whether ``pool2d`` takes this input: 1-D or 2-D windows over an fp16/fp32 N-C-spatial tensor
    of fewer than 2^31 elements."""
    return str(x.dtype) in CTYPE and x.ndim in (3, 4) and len(kernel) == x.ndim - 2 and int(x.size) <= MAX_ELEMENTS


def pool2d(xp: Any, x: Any, kind: str, kernel: Sequence[int], strides: Sequence[int], dil: Sequence[int],
           pads: Sequence[int], outs: Sequence[int], out: Any = None) -> Any:
    """``kind`` ("max", "avg", "avg_pad") pooling of ``x`` (N, C, H, W) or (N, C, L) with ONNX's
    geometry (``pads`` = begins then ends; ``outs`` = output spatial sizes). The output has the
    input's layout (NHWC strides in, NHWC strides out); ``out`` (optional) is written instead of a
    new array: it must have the output's shape, dtype and the input's layout (a compiled plan's
    arena view of the traced output)."""
    nd = len(kernel)
    if nd == 1:  # (N, C, L) as (N, C, 1, L)
        y = pool2d(xp, x[:, :, None, :], kind, [1, kernel[0]], [1, strides[0]], [1, dil[0]],
                   [0, pads[0], 0, pads[1]], [1, outs[0]], None if out is None else out[:, :, None, :])
        return y[:, :, 0, :]
    n, c, h, w = (int(d) for d in x.shape)
    oh, ow = int(outs[0]), int(outs[1])
    layout = "NHWC" if not is_layout(x, "NCHW") and is_layout(x, "NHWC") else "NCHW"
    y = empty((n, c, oh, ow), x.dtype, layout, xp) if out is None else out
    if y.size == 0:
        return y
    item = x.dtype.itemsize
    sx = [int(s) // item for s in x.strides]
    sy = [int(s) // y.dtype.itemsize for s in y.strides]
    vec = VECS[str(x.dtype)]
    # channel vectors: channels contiguous in both, every other stride and both pointers 16-byte aligned
    if not (sx[1] == 1 and sy[1] == 1 and c % vec == 0 and all(s % vec == 0 for s in sx[:1] + sx[2:] + sy[:1] + sy[2:])
            and x.data.ptr % 16 == 0 and y.data.ptr % 16 == 0):
        vec = 1
    total = n * (c // vec) * oh * ow
    k = get_kernel(SOURCE, instance("pool2d", str(x.dtype), MODES[kind], vec))
    i32 = np.int32
    blocks = min(MAX_BLOCKS, (total + THREADS - 1) // THREADS)
    k((blocks,), (THREADS,), (x, y, i32(n), i32(c), i32(h), i32(w), *(i32(s) for s in sx), i32(oh), i32(ow),
                              *(i32(s) for s in sy), i32(kernel[0]), i32(kernel[1]), i32(strides[0]),
                              i32(strides[1]), i32(dil[0]), i32(dil[1]), i32(pads[0]), i32(pads[1]), i32(pads[2]),
                              i32(pads[3]), i32(1 if layout == "NHWC" else 0)))
    return y
