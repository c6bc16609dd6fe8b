"""Pooling kernels for the runtime's standard ops (MaxPool, AveragePool, GlobalAveragePool,
GlobalMaxPool) on the device: one launch per node, in whatever layout the input is stored.

The runtime's array-module pooling (window slices and elementwise maxima) costs one kernel per
window cell plus a padded copy, and on an NHWC input every one of those walks strided memory: on the
H200 ResNet-50's stem MaxPool took 552 us at bs32 fp16 that way (bench/results/plan_breakdown_h200.md).
This kernel reads each input cell once per window that covers it and writes the output in the
input's layout, so an NHWC region stays NHWC through its pooling. A global pooling (the window is the
whole input) goes to ``global_pool`` instead: one thread per output would walk the whole window
alone (``global_geometry`` says how a block, and for an average several, share it).
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


GLOBAL_MODES = {"max": 0, "avg": 1}  # global_pool's modes (no pads: "avg_pad" is "avg")
TARGET_BLOCKS = 256  # global_pool splits the positions until about this many blocks run (~2 per H100/H200 SM)
MIN_PER_THREAD = 4  # ... but gives each thread at least this many positions of its slice
_NULL = np.uint64(0)  # global_pool's part when nothing is split (a null pointer argument)


def instances() -> list[tuple[str, str]]:
    """Every (source, instance) the runtime can launch."""
    return ([(SOURCE, instance("pool2d", dt, m, v)) for dt in CTYPE for m in MODES.values() for v in (1, VECS[dt])]
            + [(SOURCE, instance("global_pool", dt, m, v)) for dt in CTYPE for m in GLOBAL_MODES.values()
               for v in (1, VECS[dt])]
            + [(SOURCE, instance("global_pool_finish", dt)) for dt in CTYPE])


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
    if h * w > 0 and is_global(kind, kernel, strides, dil, pads, (h, w), (oh, ow)):
        _global_pool(xp, x, y, GLOBAL_MODES["max" if kind == "max" else "avg"], sx, sy)
        return y
    vec = _vec(x, y, sx, sy)
    total = n * (c // vec) * oh * ow
    k = get_kernel(SOURCE, instance("pool2d", str(x.dtype), MODES[kind], vec))
    i32 = np.int32
    blocks = min(MAX_BLOCKS, (total + THREADS - 1) // THREADS)
    k((blocks,), (THREADS,), (x, y, i32(n), i32(c), i32(h), i32(w), *(i32(s) for s in sx), i32(oh), i32(ow),
                              *(i32(s) for s in sy), i32(kernel[0]), i32(kernel[1]), i32(strides[0]),
                              i32(strides[1]), i32(dil[0]), i32(dil[1]), i32(pads[0]), i32(pads[1]), i32(pads[2]),
                              i32(pads[3]), i32(1 if layout == "NHWC" else 0)))
    return y


def _channel_vectors(arr, strides: list) -> bool:
    """Whether ``arr``'s channels are contiguous, a whole number of 16-byte vectors apart everywhere
    else, and its pointer 16-byte aligned (one vector load or store per ``VECS`` channels)."""
    vec = VECS[str(arr.dtype)]
    return (strides[1] == 1 and int(arr.shape[1]) % vec == 0 and all(s % vec == 0 for s in strides[:1] + strides[2:])
            and arr.data.ptr % 16 == 0)


def _vec(x, y, sx: list, sy: list) -> int:
    """Channels per thread: ``VECS`` when both tensors have channel vectors, else 1."""
    return VECS[str(x.dtype)] if _channel_vectors(x, sx) and _channel_vectors(y, sy) else 1


def is_global(kind: str, kernel, strides, dil, pads, spatial, outs) -> bool:
    """Whether a pooling is global: one output cell whose window is the whole input, no pads (then
    "avg" and "avg_pad" agree)."""
    return (tuple(int(o) for o in outs) == (1, 1) and tuple(int(k) for k in kernel) == tuple(int(d) for d in spatial)
            and not any(int(p) for p in pads) and all(int(d) == 1 for d in dil) and kind in MODES)


def global_geometry(n: int, c: int, hw: int, vec: int, avg: bool, channels_last: bool) -> tuple[int, int, int, int]:
    """``(tx, ty, tiles, slices)`` of a ``global_pool`` launch: ``tx`` channel groups by ``ty`` rows of
    positions per block (both powers of two), ``tiles`` blocks across the channel groups, ``slices``
    blocks across the positions (more than one only for an average: each slice's sums go to an fp32
    buffer that ``global_pool_finish`` adds up). Channels contiguous (NHWC): ``tx * ty == THREADS``, a
    warp on neighbouring channel groups. Otherwise (NCHW) one channel per block, its ``ty`` threads
    (32 to ``THREADS``, about a quarter of the positions) on neighbouring positions: a 7 x 7 pool does
    not idle 207 of 256 threads. Enough blocks to keep the GPU busy at bs1, where one block per
    (n, channel tile) would leave most SMs idle."""
    cv = c // vec
    if channels_last:
        tx = 1
        while tx < min(cv, 32):
            tx *= 2
        ty = THREADS // tx
    else:
        tx, ty = 1, 32
        while ty < THREADS and ty * 4 < hw:
            ty *= 2
    tiles = -(-cv // tx)
    slices = 1
    if avg:
        slices = max(1, min(-(-TARGET_BLOCKS // (n * tiles)), hw // (ty * MIN_PER_THREAD)))
    return tx, ty, tiles, slices


def _global_pool(xp, x, y, mode: int, sx: list, sy: list) -> None:
    n, c, h, w = (int(d) for d in x.shape)
    vec = VECS[str(x.dtype)] if _channel_vectors(x, sx) else 1  # y is written one channel at a time
    tx, ty, tiles, slices = global_geometry(n, c, h * w, vec, mode == GLOBAL_MODES["avg"], sx[1] == 1 and c > 1)
    per_slice = -(-(h * w) // slices)
    slices = -(-(h * w) // per_slice)
    dt = str(x.dtype)
    i32 = np.int32
    part = xp.empty((slices * n * c,), dtype=np.float32) if slices > 1 else _NULL
    k = get_kernel(SOURCE, instance("global_pool", dt, mode, vec))
    k((n * tiles, slices), (tx, ty), (x, y, part, i32(n), i32(c), i32(h), i32(w), *(i32(s) for s in sx),
                                     i32(sy[0]), i32(sy[1]), i32(per_slice)),
      shared_mem=tx * ty * vec * 4)
    if slices > 1:
        fin = get_kernel(SOURCE, instance("global_pool_finish", dt))
        total = n * c
        fin((min(MAX_BLOCKS, -(-total // THREADS)),), (THREADS,),
            (part, y, i32(n), i32(c), i32(slices), i32(sy[0]), i32(sy[1]), np.float32(1.0 / (h * w))))
