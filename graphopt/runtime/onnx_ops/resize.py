"""ONNX ``Resize`` (opsets 10-19) and ``Upsample`` (7-9) for the runtime, written once against ``xp``.

Interpolation is separable: each resized axis is one gather of ``taps`` neighbours per output index
and a weighted sum, with the neighbours and weights computed on the host at plan time from the
node's attributes and its plan-time ``scales`` / ``sizes`` / ``roi`` (``HOST_INPUTS``), so a run
only gathers and multiplies on the device. The arithmetic follows the ONNX specification and its
reference implementation (``onnx.reference.ops.op_resize``), which the tests compare against,
together with onnxruntime: source coordinate per coordinate-transformation mode, a window of the
``n`` nearest source indices (ties to the smaller), edge clamping, ``exclude_outside``
renormalisation, ``tf_crop_and_resize`` extrapolation, antialiasing filters when downsampling.
Written by hand because CuPy has no Resize (``cupyx.scipy.ndimage.zoom`` has neither ONNX's
coordinate modes nor its rounding rules).

Opset 10 Resize and Upsample have no coordinate-transformation attribute: they are asymmetric, and
nearest rounds down when enlarging and up when shrinking, as onnxruntime runs them.
"""

from __future__ import annotations

import math

import numpy as np

from graphopt.errors import UsageError
from graphopt.runtime.onnx_ops.registry import for_accumulation, op

MODES = ("nearest", "linear", "cubic")
TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
              "tf_crop_and_resize", "tf_half_pixel_for_nn")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


def _source_coords(transform: str, out_len: int, in_len: int, scale: float, roi: tuple[float, float] | None):
    """(source coordinate of every output index, mask of those outside the input or None)."""
    y = np.arange(out_len, dtype=np.float64)
    out_real = scale * in_len
    if transform == "align_corners":  # the integer output length, as onnxruntime (the reference takes scale * in)
        return (np.zeros(out_len) if out_len == 1 else y * (in_len - 1) / (out_len - 1)), None
    if transform == "asymmetric":
        return y / scale, None
    if transform == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale, None
    if transform == "pytorch_half_pixel":
        return (np.full(out_len, -0.5) if out_real == 1 else (y + 0.5) / scale - 0.5), None
    if transform == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if transform == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_real)
        return offset + (y + 0.5) / scale - 0.5, None
    start, end = roi if roi is not None else (0.0, 1.0)
    if out_len == 1:  # (the integer output length here too, as onnxruntime)
        x = np.full(out_len, (end - start) * (in_len - 1) / 2)
    else:
        x = y * (end - start) * (in_len - 1) / (out_len - 1)
    x = x + start * (in_len - 1)
    return x, (x < 0) | (x > in_len - 1)


def _cubic(t, a: float):
    """Keys' cubic convolution kernel at distances ``t`` (array)."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _weights(mode: str, ratio: np.ndarray, scale: float, antialias: bool, cubic_a: float, nearest: str,
             shrinking: bool) -> np.ndarray:
    """Per output index, the weight of each neighbour in its window (rows of ``taps`` weights); the
    window's first neighbour sits ``taps // 2 - 1`` below the coordinate's floor (``ratio`` in (0, 1])."""
    if mode == "nearest":
        if nearest == "simple":
            nearest = "ceil" if shrinking else "floor"
        take_upper = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                      "floor": np.zeros_like(ratio, bool), "ceil": np.ones_like(ratio, bool)}[nearest]
        take_upper = take_upper | (ratio == 1.0)  # an exact source index: itself
        return np.stack([~take_upper, take_upper], axis=1).astype(np.float64)
    if antialias and scale < 1:  # a filter widened by 1/scale, normalised per row
        if mode == "linear":
            first = math.floor(-1 / scale) + 1
            offsets = np.arange(first, 2 - first)
            w = np.clip(1 - np.abs((offsets[None, :] - ratio[:, None]) * scale), 0, 1)
        else:
            first = math.floor(-2 / scale) + 1
            offsets = np.arange(first, 2 - first)
            w = _cubic((offsets[None, :] - ratio[:, None]) * scale, cubic_a)
        return w / w.sum(axis=1, keepdims=True)
    if mode == "linear":
        return np.stack([1 - ratio, ratio], axis=1)
    return _cubic(np.arange(-1, 3)[None, :] - ratio[:, None], cubic_a)


def axis_taps(in_len: int, out_len: int, scale: float, *, mode: str, transform: str, nearest: str = "round_prefer_floor",
              cubic_a: float = -0.75, exclude_outside: bool = False, antialias: bool = False,
              roi: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(source indices ``(out_len, taps)``, their weights ``(out_len, taps)``, the mask of output
    indices to fill with the extrapolation value or None) for one resized axis."""
    x, outside = _source_coords(transform, out_len, in_len, scale, roi)
    base = np.floor(x)
    ratio = np.where(x == base, 1.0, x - base)  # in (0, 1]: an exact index counts as the window's upper end
    w = _weights(mode, ratio, scale, antialias, cubic_a, nearest, scale < 1)
    taps = w.shape[1]  # even for every mode
    # The window: the ``taps`` source indices nearest to x, ties to the smaller, found in the
    # edge-padded coordinate x + pad as the reference does (where x + pad rounds to an integer, this
    # decides the window, not x itself; the reference's choice is ONNX's behaviour)
    pad = -(-taps // 2)
    shifted = x + pad
    first = np.floor(shifted)
    start = first + np.where(shifted == first, -(taps // 2), 1 - taps // 2) - pad
    idx = start.astype(np.int64)[:, None] + np.arange(taps)[None, :]
    if exclude_outside and mode != "nearest":
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_len - 1), w, outside


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def plan(ctx, x_shape: tuple[int, ...]):
    """(output shape, [(axis, indices, weights, outside mask)] for the axes that change, mode), from
    the node's attributes and plan-time inputs; a usage error names what the runtime does not take."""
    name = getattr(ctx.node, "name", "") or "?"
    op_type = ctx.node.op_type
    mode = _text(ctx.attr("mode", "nearest"))
    rank = len(x_shape)
    old = op_type == "Upsample" or ctx.opset < 11
    if old:
        scales = ctx.attr("scales") if op_type == "Upsample" and ctx.opset < 9 else ctx.host(1)
        sizes, roi, axes = None, None, None
        transform, nearest = "asymmetric", "simple"
    else:
        roi, scales, sizes = ctx.host(1), ctx.host(2), ctx.host(3)
        axes = ctx.attr("axes", None)
        transform = ctx.attr("coordinate_transformation_mode", "half_pixel")
        nearest = ctx.attr("nearest_mode", "round_prefer_floor")
    transform, nearest = _text(transform), _text(nearest)
    if mode not in MODES or transform not in TRANSFORMS or nearest not in NEAREST:
        raise UsageError(f"{op_type} node {name!r}: mode {mode!r}, coordinate_transformation_mode {transform!r}, "
                         f"nearest_mode {nearest!r}: not an ONNX combination the runtime knows")
    antialias = bool(ctx.attr("antialias", 0))
    if antialias and mode == "nearest":
        raise UsageError(f"{op_type} node {name!r}: antialias applies to linear and cubic modes, not nearest")
    axes = [int(a) % rank for a in axes] if axes is not None else list(range(rank))
    scales = None if scales is None or np.asarray(scales).size == 0 else [float(s) for s in np.asarray(scales).reshape(-1)]
    sizes = None if sizes is None or np.asarray(sizes).size == 0 else [int(s) for s in np.asarray(sizes).reshape(-1)]
    if (scales is None) == (sizes is None):
        raise UsageError(f"{op_type} node {name!r}: exactly one of scales and sizes must be given")
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        raise UsageError(f"{op_type} node {name!r}: {len(given)} scales/sizes for {len(axes)} axes of a rank-{rank} input")
    full_scale = [1.0] * rank
    out_shape = list(x_shape)
    if sizes is not None:
        ratios = {a: s / x_shape[a] if x_shape[a] else 1.0 for a, s in zip(axes, sizes)}
        policy = _text(ctx.attr("keep_aspect_ratio_policy", "stretch"))
        if policy in ("not_larger", "not_smaller"):
            one = (min if policy == "not_larger" else max)(ratios.values())
            ratios = {a: one for a in axes}
            sizes = [int(one * x_shape[a] + 0.5) for a in axes]
        elif policy != "stretch":
            raise UsageError(f"{op_type} node {name!r}: keep_aspect_ratio_policy {policy!r} is not ONNX's")
        for a, s in zip(axes, sizes):
            full_scale[a], out_shape[a] = ratios[a], s
    else:
        for a, s in zip(axes, scales):
            if not s > 0:
                raise UsageError(f"{op_type} node {name!r}: scale {s} for axis {a}; scales must be positive")
            full_scale[a], out_shape[a] = s, int(s * x_shape[a])
    full_roi = None
    if roi is not None and np.asarray(roi).size and transform == "tf_crop_and_resize":
        r = [float(v) for v in np.asarray(roi).reshape(-1)]
        k = len(r) // 2
        full_roi = {a: (r[i], r[k + i]) for i, a in enumerate(axes if k == len(axes) else range(rank))}
    cubic_a = float(ctx.attr("cubic_coeff_a", -0.75))
    exclude = bool(ctx.attr("exclude_outside", 0))
    steps = []
    for a in range(rank):
        roi_a = full_roi.get(a) if full_roi else None
        if out_shape[a] == x_shape[a] and math.isclose(full_scale[a], 1.0) and (
                roi_a is None or (math.isclose(roi_a[0], 0.0) and math.isclose(roi_a[1], 1.0))):
            continue  # identity along this axis, exactly
        if out_shape[a] == 0 or x_shape[a] == 0:
            steps.append((a, None, None, None))
            continue
        idx, w, outside = axis_taps(x_shape[a], out_shape[a], full_scale[a], mode=mode, transform=transform,
                                    nearest=nearest, cubic_a=cubic_a, exclude_outside=exclude, antialias=antialias,
                                    roi=roi_a)
        steps.append((a, idx, w, outside if outside is not None and outside.any() else None))
    return tuple(out_shape), steps, mode


def _memory_order(x) -> tuple[int, ...]:
    """The axes of ``x`` from its largest stride to its smallest: ``x.transpose(order)`` is dense in
    C order for a tensor stored in any permuted layout (NHWC: (0, 2, 3, 1))."""
    return tuple(sorted(range(x.ndim), key=lambda a: (-abs(x.strides[a]) if x.shape[a] > 1 else 0, a)))


def _resize(ctx, ins):
    """Resize in the input's own memory layout: an NHWC tensor (a region between NHWC lowerings)
    comes out NHWC, so no conversion follows it."""
    x = ins[0]
    order = _memory_order(x)
    if order == tuple(range(x.ndim)):
        return _resize_dense(ctx, x, tuple(range(x.ndim)))
    inverse = tuple(order.index(a) for a in range(x.ndim))
    return [_resize_dense(ctx, x.transpose(order), order)[0].transpose(inverse)]


def _device_steps(ctx, x, order):
    """(mode, [(axis in memory order, indices, weights, outside mask)]) with the arrays on the device,
    planned and uploaded once per step and input shape (``ctx.memo``): a later run, and a CUDA-graph
    capture, only gathers and multiplies (no host-to-device copy inside a capture)."""
    hosts = tuple(None if ctx.host(i) is None else np.asarray(ctx.host(i)).tobytes() for i in (1, 2, 3))
    key = ("resize", tuple(x.shape), order, str(x.dtype), hosts)
    hit = ctx.memo.get(key)
    if hit is not None:
        return hit
    xp = ctx.xp
    logical = tuple(int(x.shape[order.index(a)]) for a in range(x.ndim))
    _, logical_steps, mode = plan(ctx, logical)
    wdt = np.float64 if x.dtype == np.float64 else np.float32
    steps = []
    for a, idx, w, outside in logical_steps:
        a = order.index(a)
        shape = (-1,) + (1,) * (x.ndim - a - 1)
        if idx is None:
            steps.append((a, None, None, None))
        elif mode == "nearest":
            steps.append((a, xp.asarray(_nearest_index(idx, w)), None,
                          None if outside is None else xp.asarray(outside.reshape(shape))))
        else:
            steps.append((a, [xp.asarray(idx[:, k]) for k in range(idx.shape[1])],
                          [xp.asarray(w[:, k].astype(wdt).reshape(shape)) for k in range(idx.shape[1])],
                          None if outside is None else xp.asarray(outside.reshape(shape))))
    ctx.memo[key] = (mode, steps)
    return mode, steps


def _resize_dense(ctx, x, order):
    """``_resize`` of ``x``, the input's axes permuted by ``order`` into memory order."""
    xp = ctx.xp
    mode, steps = _device_steps(ctx, x, order)
    fill = float(ctx.attr("extrapolation_value", 0.0))
    if mode == "nearest":  # a gather per axis: values and dtype unchanged
        y = x
        for a, idx, _, outside in steps:
            if idx is None:
                y = xp.empty(y.shape[:a] + (0,) + y.shape[a + 1:], dtype=y.dtype)
                continue
            y = xp.take(y, idx, axis=a)
            if outside is not None:
                y = xp.where(outside, y.dtype.type(fill), y)
        return [xp.ascontiguousarray(y) if y is not x else y.copy()]
    if not steps:  # nothing resized: a new array, never the input itself
        return [x.copy()]
    if x.dtype == np.float16:
        y = for_accumulation(ctx, x)
    else:  # a float32 input is read as it is
        y = x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)
    wdt = y.dtype
    for a, idx, w, outside in steps:
        if idx is None:
            y = xp.empty(y.shape[:a] + (0,) + y.shape[a + 1:], dtype=wdt)
            continue
        acc = None
        for tap, weight in zip(idx, w):
            term = xp.take(y, tap, axis=a) * weight
            acc = term if acc is None else acc + term
        y = acc
        if outside is not None:
            y = xp.where(outside, wdt.type(fill), y)
    return [_cast_back(xp, y, x.dtype)]


def _nearest_index(idx: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The neighbour a nearest window picks (the one with weight 1)."""
    return np.where(w[:, 1] > 0.5, idx[:, 1], idx[:, 0])


def _cast_back(xp, y, dtype):
    """The interpolated values in the input's dtype: integers rounded to nearest even and saturated, as
    the ONNX reference does (``onnx.numpy_helper.saturate_cast``)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return xp.clip(xp.rint(y), info.min, info.max).astype(dtype)
    return y.astype(dtype, copy=False)  # the interpolated array is new: no second copy for float32


op("Resize", host=(1, 2, 3))(_resize)
op("Upsample", host=(1,))(_resize)
