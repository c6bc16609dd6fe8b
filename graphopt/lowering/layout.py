"""Physical layouts of N-C-spatial tensors, as strides: the one place the runtime and the checker
convert to what a lowering declares.

A tensor keeps its logical shape (N, C, H, W) everywhere in graphopt; ``NHWC`` ("channels last")
is a property of its strides, as in PyTorch: ``x.transpose(0, 2, 3, 1)`` is C-contiguous. Array
operations on such a view are correct whatever the layout, so a chain of lowerings that declare
NHWC passes tensors along without a conversion, and a conversion happens only where a producer's
layout differs from its consumer's (the edges of a CNN region).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

LAYOUTS = ("NCHW", "NHWC", "rowmajor", "colmajor", "rowpad", "")  # "": any (the lowering reads the strides itself)
# "rowpad": C order with each row (the last dim) padded to a whole number of 16 bytes: the array is a
# ``[..., :N]`` view of a C-contiguous ``(..., ld)`` buffer. A GEMM output with rows of odd length
# (GPT-2's 50257 logits) is written there by cuBLASLt's Hopper kernels, which need 16-byte aligned
# rows; rows already 16-byte multiples make it plain C order.
ROW_ALIGN = 16
# Layouts only a constant input may be declared in: the runtime converts a constant once, when the plan
# is built, but would convert an activation on every run. "colmajor": the last two dims swapped in
# memory (``x.swapaxes(-1, -2)`` is C-contiguous), a weight matrix stored transposed.
WEIGHT_LAYOUTS = frozenset({"colmajor"})
# Rows narrower than this are copied by the array module, not by one pitched memcpy (a 2-D copy of
# many short rows moves a few bytes per row; an elementwise kernel does better there).
MIN_PITCHED_ROW_BYTES = 256


# Standard ops whose every output element depends only on the inputs' elements at the same (broadcast)
# index: no axis attribute, no reshape. Computed on consistently permuted operands, they give the
# permuted result, so the runtime runs them in the memory order of their first channels-last input
# (``graphopt.runtime.onnx_ops.layout_order``) and the layout choice counts them as keeping it.
ELEMENTWISE_OPS = frozenset({
    "Abs", "Add", "Cast", "Ceil", "Clip", "Div", "Dropout", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid",
    "HardSwish", "Identity", "LeakyRelu", "Log", "Max", "Mean", "Min", "Mish", "Mul", "Neg", "Pow", "PRelu",
    "Reciprocal", "Relu", "Selu", "Sigmoid", "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Tanh",
    "ThresholdedRelu", "Where",
})


def _last_perm(ndim: int) -> tuple[int, ...]:
    return (0,) + tuple(range(2, ndim)) + (1,)


def inverse_perm(perm: Sequence[int]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def padded_row(n: int, itemsize: int) -> int:
    """Elements per row of ``n`` elements padded to whole ``ROW_ALIGN`` bytes (the ``rowpad`` pitch)."""
    per = max(1, ROW_ALIGN // itemsize)
    return -(-int(n) // per) * per


def _rowpad_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    """The strides of a ``rowpad`` array of ``shape``: C order over ``shape[:-1] + (padded row,)``."""
    dims = list(shape[:-1]) + [padded_row(shape[-1], itemsize)]
    strides, step = [], itemsize
    for d in reversed(dims):
        strides.append(step)
        step *= int(d)
    return tuple(reversed(strides))


def is_layout(x: Any, layout: str) -> bool:
    """Whether ``x``'s strides already are ``layout`` (C-contiguous for NCHW / rowmajor)."""
    if not layout:
        return True
    if layout == "NHWC" and x.ndim >= 3:
        return bool(x.transpose(_last_perm(x.ndim)).flags.c_contiguous)
    if layout == "colmajor" and x.ndim >= 2:
        return bool(x.swapaxes(-1, -2).flags.c_contiguous)
    if layout == "rowpad" and x.ndim >= 1:
        if x.size == 0:  # no element to place (as C order: flags.c_contiguous says so for any strides)
            return True
        want = _rowpad_strides(x.shape, x.itemsize)  # a dim of size 1 has no stride to keep
        return all(d == 1 or int(s) == w for d, s, w in zip(x.shape, x.strides, want))
    return bool(x.flags.c_contiguous)


def channels_last_perm(x: Any) -> tuple[int, ...] | None:
    """The axes order that makes ``x`` C-contiguous when ``x`` is stored channels-last and that differs
    from C order in memory (rank >= 3, neither one channel nor one position); None otherwise."""
    if getattr(x, "ndim", 0) < 3 or x.flags.c_contiguous:
        return None
    perm = _last_perm(x.ndim)
    return perm if x.transpose(perm).flags.c_contiguous else None


def permuted(a: Any, perm: Sequence[int]) -> Any:
    """``a`` given leading dims of one up to ``len(perm)`` dims (as broadcasting aligns it), then
    transposed by ``perm``: an operand as it broadcasts against a tensor viewed in ``perm`` order."""
    nd = len(perm)
    if a.ndim < nd:
        a = a.reshape((1,) * (nd - a.ndim) + tuple(a.shape))
    return a.transpose(perm)


def to_layout(x: Any, layout: str, xp: Any) -> Any:
    """``x`` with the same logical shape and values, stored in ``layout`` (no copy when it already is)."""
    if x is None or is_layout(x, layout):
        return x
    if layout == "NHWC" and x.ndim >= 3:
        perm = _last_perm(x.ndim)
        return xp.ascontiguousarray(x.transpose(perm)).transpose(inverse_perm(perm))
    if layout == "colmajor" and x.ndim >= 2:
        return xp.ascontiguousarray(x.swapaxes(-1, -2)).swapaxes(-1, -2)
    if layout == "rowpad" and x.ndim >= 1:
        out = empty(x.shape, x.dtype, "rowpad", xp)
        copy_rows(out, x, xp)
        return out
    if row_pitch(x) is not None:  # a rowpad view to C order: one pitched copy, not an indexed kernel
        out = xp.empty(x.shape, dtype=x.dtype)
        copy_rows(out, x, xp)
        return out
    return xp.ascontiguousarray(x)


def row_pitch(x: Any) -> int | None:
    """Bytes from one row (the last dim) of ``x`` to the next when each row is contiguous and the outer
    dims collapse into one run of equally spaced rows (C order, ``rowpad``, any ``[..., :n]`` view of
    a C-contiguous buffer); None otherwise or when ``x`` holds no element."""
    if x.ndim == 0 or x.size == 0 or (x.shape[-1] > 1 and x.strides[-1] != x.itemsize):
        return None
    pitch = expect = None
    for d, s in zip(reversed(x.shape[:-1]), reversed(x.strides[:-1])):
        if d == 1:  # a dim of size 1 has no stride to keep
            continue
        if pitch is None:
            pitch = int(s)
        elif int(s) != expect:
            return None
        expect = int(s) * int(d)
    row_bytes = x.shape[-1] * x.itemsize
    if pitch is None:  # a single row
        return row_bytes
    return pitch if pitch >= row_bytes else None


def copy_rows(dst: Any, src: Any, xp: Any) -> None:
    """``dst[...] = src`` for two arrays of one shape and dtype whose rows are equally spaced
    (``row_pitch``). On CuPy that is one ``cudaMemcpy2DAsync`` on the current stream: CuPy's own
    copy of a strided view is an indexed elementwise kernel, measured ~1 ms for GPT-2's 412 MB of
    bs32 logits on the H100 against ~0.3 ms for the pitched copy's bandwidth. Anything else
    (NumPy, other strides, rows under ``MIN_PITCHED_ROW_BYTES``): plain assignment."""
    dp, sp = row_pitch(dst), row_pitch(src)
    if (xp.__name__ != "cupy" or dp is None or sp is None or dst.shape != src.shape or dst.dtype != src.dtype
            or dst.shape[-1] * dst.itemsize < MIN_PITCHED_ROW_BYTES):
        dst[...] = src
        return
    row_bytes, rows = dst.shape[-1] * dst.itemsize, dst.size // dst.shape[-1]
    xp.cuda.runtime.memcpy2DAsync(dst.data.ptr, dp, src.data.ptr, sp, row_bytes, rows,
                                  xp.cuda.runtime.memcpyDeviceToDevice, xp.cuda.get_current_stream().ptr)


def empty(shape: Sequence[int], dtype: Any, layout: str, xp: Any) -> Any:
    """An uninitialised array of logical ``shape`` stored in ``layout``."""
    shape = tuple(int(d) for d in shape)
    if layout == "NHWC" and len(shape) >= 3:
        perm = _last_perm(len(shape))
        return xp.empty(tuple(shape[p] for p in perm), dtype=dtype).transpose(inverse_perm(perm))
    if layout == "colmajor" and len(shape) >= 2:
        return xp.empty(shape[:-2] + (shape[-1], shape[-2]), dtype=dtype).swapaxes(-1, -2)
    if layout == "rowpad" and len(shape) >= 1:
        ld = padded_row(shape[-1], np.dtype(dtype).itemsize)
        return xp.empty(shape[:-1] + (ld,), dtype=dtype)[..., :shape[-1]]
    return xp.empty(shape, dtype=dtype)
