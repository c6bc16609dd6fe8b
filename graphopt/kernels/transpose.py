"""NCHW <-> NHWC conversions of 4-D fp16/fp32 CuPy arrays by a tiled transpose.

``elementwise.cu``'s ``nchw_to_nhwc`` turns a batch of ``[rows][cols]`` matrices into ``[cols][rows]``
through a 32 x 33 shared-memory tile, so both its reads and its writes are coalesced; NCHW -> NHWC is
rows = C, cols = H*W, and NHWC -> NCHW the same kernel with rows = H*W, cols = C. CuPy's copy of a
permuted view (``ascontiguousarray(x.transpose(...))``, what ``lowering.layout.to_layout`` does on any
array module) walks one side with a stride: MobileNetV2 at bs32 on the H100 ran 2.23 ms where its
tuned nodes add up to 1.01 ms and its 33 conversions were estimated at 0.21 ms at copy bandwidth
(bench/NOTES_e2e.md). The runtime converts through here (``CudaBackend.to_layout``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphopt.kernels.source import CTYPE, get_kernel, instance
from graphopt.lowering import layout as layouts

TILE = 32
MAX_GRID_YZ = 65535


def to_layout(x: Any, layout: str, xp: Any) -> Any:
    """``lowering.layout.to_layout``, with NCHW <-> NHWC of a dense 4-D fp16/fp32 CuPy array as one
    tiled transpose; everything else (other layouts, dtypes, strides, NumPy) as there."""
    if x is None or layouts.is_layout(x, layout):
        return x
    if getattr(xp, "__name__", "") == "cupy" and x.ndim == 4 and str(x.dtype) in CTYPE and x.size > 0:
        n, c, h, w = (int(d) for d in x.shape)
        if layout == "NHWC" and x.flags.c_contiguous:
            return _transposed(x, layouts.empty(x.shape, x.dtype, "NHWC", xp), n, c, h * w)
        if layout in ("NCHW", "rowmajor") and layouts.is_layout(x, "NHWC"):
            return _transposed(x, xp.empty(x.shape, dtype=x.dtype), n, h * w, c)
    return layouts.to_layout(x, layout, xp)


def grid(n: int, rows: int, cols: int) -> tuple[int, int, int] | None:
    """The launch grid of ``nchw_to_nhwc`` over ``n`` ``[rows][cols]`` matrices (blocks of 32 x 8
    threads, one 32 x 32 tile each); None past CUDA's grid limits."""
    g = (-(-cols // TILE), -(-rows // TILE), n)
    return g if g[1] <= MAX_GRID_YZ and g[2] <= MAX_GRID_YZ else None


def _transposed(x: Any, out: Any, n: int, rows: int, cols: int) -> Any:
    """``out`` (the other layout's buffer) after the tiled transpose of ``x``'s ``n`` matrices; the
    array module's copy when the grid would not fit."""
    g = grid(n, rows, cols)
    if g is None:
        out[...] = x
        return out
    k = get_kernel("elementwise.cu", instance("nchw_to_nhwc", str(x.dtype)))
    k(g, (TILE, 8), (x, out, np.int32(rows), np.int32(cols)))
    return out
