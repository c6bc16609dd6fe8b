"""GroupNorm lowering candidates: ``groups`` (``group_norm.cu``), one CTA per (sample, group).

Params: ``warps`` (CTA size / 32) and ``vec`` (elements per load: 16 bytes, or 1 where the spatial
size is not a multiple of that). Statistics in fp32 (Chan's merge of exact per-vector moments), then
the channel affine and the op's activation in the same pass that writes Y.

``launch(inputs, outputs)``: ``inputs = [X, scale, bias]``, ``outputs = [Y]``; X and Y C-contiguous
``[N, C, ...]``; scale and bias hold the C per-channel values (``[C]``, ``[C, 1, ..., 1]`` or
``[1, C, 1, ...]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.kernels.source import VEC16, get_kernel, instance, source_hash
from graphopt.lowering.contract import Candidate, Lowering, Signature

SUPPORTED_DTYPES = ("float16", "float32")
WARPS = (4, 8, 16, 32)


@dataclass(frozen=True)
class GroupNormPlan:
    shape: tuple[int, ...]
    groups: int  # per sample
    cpg: int     # channels per group
    hw: int      # spatial elements per channel
    blocks: int  # N * groups
    eps: float


def _channels(shape: Sequence[int] | None, c: int) -> bool:
    return shape is not None and int(np.prod(shape)) == c and sum(1 for v in shape if v != 1) <= 1


def group_norm_plan(sig: Signature) -> GroupNormPlan:
    if sig.op != "GroupNorm":
        raise TuningError(f"op {sig.op} is not GroupNorm")
    shapes = list(sig.input_shapes) + [None] * (3 - len(sig.input_shapes))
    x = shapes[0]
    if x is None or len(x) < 2 or min(x) < 1:
        raise TuningError(f"GroupNorm needs a known, non-empty X [N, C, ...], got {x}")
    n, c = int(x[0]), int(x[1])
    g = int(sig.attr("num_groups", 0) or 0)
    if g < 1 or c % g:
        raise TuningError(f"GroupNorm: {c} channels do not split into num_groups={g}")
    for i, what in ((1, "scale"), (2, "bias")):
        if not _channels(shapes[i], c):
            raise TuningError(f"GroupNorm {what} must hold the {c} channel values, got {shapes[i]}")
    hw = int(np.prod(x[2:])) if len(x) > 2 else 1
    if n * c * hw > geo.INT32_MAX:
        raise TuningError("GroupNorm tensors over 2**31 elements are not supported by the kernel")
    return GroupNormPlan(tuple(int(v) for v in x), g, c // g, hw, n * g, float(sig.attr("epsilon", 1e-5)))


@dataclass(frozen=True)
class GroupNormBlocks(Candidate):
    """One CTA per (n, group); params warps, vec."""
    ordinary_launch = True  # its launch is one own kernel (Candidate.ordinary_launch)

    def _cfg(self) -> tuple[int, int]:
        return int(self.param("warps")), int(self.param("vec"))

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        p, reason = geo.plan_or_reason(sig, group_norm_plan, SUPPORTED_DTYPES)
        if reason:
            return reason
        dt = geo.dtype_of(sig)
        w, vec = self._cfg()
        if vec not in (1, VEC16[dt]):
            return f"vec={vec} is neither 1 nor a 16-byte load of {dt} ({VEC16[dt]})"
        if p.hw % vec:
            return f"spatial size {p.hw} is not a multiple of vec={vec}"
        if w > 4 and w * 32 * vec > p.cpg * p.hw:
            return f"{w} warps for a group of {p.cpg * p.hw} elements (4 warps already cover it)"
        return None

    def source_hash(self) -> str:
        return source_hash("group_norm.cu")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        w, vec = self._cfg()
        return [("group_norm.cu", instance("group_norm", geo.dtype_of(sig), vec, w))]

    def build(self, sig: Signature, arch: str) -> Lowering:
        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        p = group_norm_plan(sig)
        dt = geo.dtype_of(sig)
        w, vec = self._cfg()
        kern = get_kernel("group_norm.cu", instance("group_norm", dt, vec, w))
        act = geo.act_args(sig)
        i32, f32 = np.int32, np.float32
        tail = (i32(p.groups), i32(p.cpg), i32(p.hw), f32(p.eps), i32(act.code), f32(act.alpha), f32(act.beta),
                f32(act.lo), f32(act.hi))
        c = p.shape[1]

        def launch(inputs, outputs):
            x, scale, bias = inputs[:3]
            y = outputs[0]
            for a, n, what in ((x, None, "X"), (scale, c, "scale"), (bias, c, "bias"), (y, None, "Y")):
                if str(a.dtype) != dt or not a.flags.c_contiguous or (n is not None and int(a.size) != n):
                    raise TuningError(f"GroupNorm {what} must be a C-contiguous {dt} array"
                                      f"{'' if n is None else f' of {n} elements'}, got {a.dtype} {a.shape}")
            if tuple(x.shape) != p.shape or tuple(y.shape) != p.shape:
                raise TuningError(f"GroupNorm X and Y must have shape {p.shape}, got {x.shape} and {y.shape}")
            if vec > 1 and (x.data.ptr % 16 or y.data.ptr % 16):
                raise TuningError(f"GroupNorm X / Y are not 16-byte aligned (candidate vec={vec})")
            kern((p.blocks,), (w * 32,), (x, scale, bias, y) + tail)

        return Lowering(launch=lambda ins, outs, ws: launch(ins, outs))


def group_norm_candidates() -> list[Candidate]:
    return [GroupNormBlocks("groups", (("warps", w), ("vec", v)))
            for v in sorted({VEC16["float16"], VEC16["float32"], 1}, reverse=True) for w in WARPS]


def group_norm_kernel_instances() -> list[tuple[str, str]]:
    return [("group_norm.cu", instance("group_norm", dt, v, w))
            for dt in SUPPORTED_DTYPES for v in (VEC16[dt], 1) for w in WARPS]
