"""Elementwise standard ops in the memory order of their first activation input.

CuPy's elementwise kernels allocate their output in C order whatever their inputs' strides (its
ufuncs take no ``order``), so an Add or Mul between two NHWC lowerings (EfficientNet's
squeeze-excite Mul) came out NCHW: the next NHWC lowering converted it back, and the kernel itself
walked its NHWC input with a stride of C elements. The tuner's layout choice counts these ops as
keeping their input's layout (``graphopt.tune.layout_choice``); this wrapper makes the runtime do so.
For an op of ``ELEMENTWISE_OPS`` whose first activation input is stored channels-last, every operand
goes in as its channels-last view (``x.transpose(0, 2, 3, 1)``, lower-rank operands first given
leading ones, as broadcasting does), so the kernel reads and writes each in memory order, and each
output comes back as the NCHW-shaped view of its channels-last result. Any other op, or an op whose
first activation input is in C order, runs as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphopt.lowering.layout import ELEMENTWISE_OPS, channels_last_perm, inverse_perm, permuted
from graphopt.runtime.onnx_ops.registry import OpFn, on_host


def deciding_perm(xp: Any, ins: list) -> tuple[int, ...] | None:
    """The channels-last axes order of the first activation input of ``ins`` (rank >= 3, a device
    array, its layout not ambiguous), or None when that input is in C order or there is none."""
    for x in ins:
        if x is None or getattr(x, "ndim", 0) < 3 or (xp is not np and on_host(xp, x)):
            continue  # omitted, too small to have a layout, or a constant on the host
        if x.flags.c_contiguous:  # (no view made: this runs for every elementwise step of every run)
            if x.shape[1] == 1 or all(d == 1 for d in x.shape[2:]):
                continue  # one channel or one position: both layouts at once, the next input decides
            return None  # C order decides
        return channels_last_perm(x)
    return None


def in_input_order(fn: OpFn) -> OpFn:
    """``fn`` run in the memory order of its first activation input (see the module docstring)."""

    def run(ctx, ins):
        perm = deciding_perm(ctx.xp, ins)
        if perm is None:
            return fn(ctx, ins)
        nd = len(perm)
        if any(x is not None and getattr(x, "ndim", 0) > nd for x in ins):
            return fn(ctx, ins)  # an operand of higher rank broadcasts it: run as it is
        inverse = inverse_perm(perm)
        moved = [None if x is None else permuted(x, perm) for x in ins]
        return [o if o is None or getattr(o, "ndim", 0) != nd else o.transpose(inverse) for o in fn(ctx, moved)]

    return run


def for_device(op_type: str, fn: OpFn) -> OpFn:
    """The implementation a device step of ``op_type`` runs: ``fn``, in its input's order when elementwise."""
    return in_input_order(fn) if op_type in ELEMENTWISE_OPS else fn
