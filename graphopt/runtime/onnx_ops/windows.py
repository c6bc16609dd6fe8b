"""Sliding windows for Conv and pooling: their geometry from a node's attributes, constant padding
that stays on the device, and the strided window slices of a padded input (im2col by slices).

The geometry's arithmetic has one home, ``graphopt.ops.cbr.conv_output``; this module only reads a
node's attributes for it.
"""

from __future__ import annotations

import itertools

from graphopt.ops.cbr import conv_output


def conv_geometry(ctx, in_spatial, kernel):
    """(strides, dilations, explicit pads, output spatial sizes) of a Conv or pooling node (``ctx.attr``)."""
    nd = len(kernel)
    strides = list(ctx.attr("strides", [1] * nd))
    dil = list(ctx.attr("dilations", [1] * nd))
    pads, outs = conv_output(in_spatial, kernel, strides, dil, ctx.attr("auto_pad", "NOTSET"),
                             ctx.attr("pads", None), bool(ctx.attr("ceil_mode", 0)))
    return strides, dil, pads, outs


def pad_constant(xp, x, pad_width, fill=0):
    """``xp.pad(x, pad_width, mode="constant", constant_values=fill)`` without host-to-device copies.

    Written by hand because ``cupy.pad`` builds its constant on the host and copies it over, which
    a CUDA-graph capture refuses: on the H200 every captured model with a padded Conv fell back to
    eager with "H2D transfers are disallowed" (the models without one captured), which this is
    meant to fix (not yet re-run there). The output is ``xp.full`` (a fill kernel) and the input
    is copied into its interior: device work only."""
    if not any(a or b for a, b in pad_width):
        return x
    shape = tuple(int(d) + int(a) + int(b) for d, (a, b) in zip(x.shape, pad_width))
    out = xp.full(shape, fill, dtype=x.dtype)
    out[tuple(slice(int(a), int(a) + int(d)) for d, (a, _) in zip(x.shape, pad_width))] = x
    return out


def window_slices(xp, x, kernel, strides, dil, pads, outs, fill):
    """Padded input -> the prod(kernel) strided window slices, each (N, C, *outs), kernel offsets in
    row-major order; any spatial rank."""
    nd = len(kernel)
    pad_width = [(0, 0), (0, 0)]
    for i in range(nd):
        need = (outs[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1  # ceil_mode windows stay in bounds
        pad_width.append((pads[i], max(pads[i + nd], need - x.shape[2 + i] - pads[i])))
    if any(p != (0, 0) for p in pad_width):
        x = pad_constant(xp, x, pad_width, fill)
    slices = []
    for ks in itertools.product(*[range(k) for k in kernel]):
        idx = (slice(None), slice(None)) + tuple(
            slice(k * dil[i], k * dil[i] + strides[i] * (outs[i] - 1) + 1, strides[i]) for i, k in enumerate(ks))
        slices.append(x[idx])
    return slices
