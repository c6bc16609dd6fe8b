"""RoPE lowering candidates: ``rope`` (``rope.cu``), both forms, param ``vec``: 1 (one thread per
rotated pair, any cos/sin broadcast) or a 16-byte load (8 fp16 / 4 fp32 elements per load, for
tables whose last axis is contiguous and rows that split into whole loads; a launch on tensors that
are not 16-byte aligned takes the scalar kernel).

``launch(inputs, outputs)``: ``inputs = [X, cos, sin]``, ``outputs = [Y]``; X and Y C-contiguous, Y of
shape ``[..., D]`` (D even) and X of Y's shape, or ``[B, S, H, D]`` for Y ``[B, H, S, D]`` (``x_bshd=1``:
the kernel reads each row of X where it lies, so the head split's Transpose is never written); cos and
sin C-contiguous, each broadcasting to Y (any shape: the exports' ``[1, 1, S, D]`` or ``[B, 1, S, D]``
tables, a ``[S, D]`` cache). The broadcast and row strides are worked out at build time and live in a
small device array, so a launch is one kernel and captures.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphopt.errors import RuleError, TuningError
from graphopt.kernels import geometry as geo
from graphopt.kernels.source import VEC16, get_kernel, instance, source_hash
from graphopt.lowering.contract import Candidate, Lowering, Signature
from graphopt.ops.rope import HEADS_PERM, rotated_shape, x_bshd

SUPPORTED_DTYPES = ("float16", "float32")
THREADS = 256
GRID_MAX = 132 * 32


@dataclass(frozen=True)
class RopePlan:
    shape: tuple[int, ...]  # Y's
    D: int
    pairs: int
    interleaved: int
    meta: tuple[int, ...]  # Y's leading dims, cos strides, sin strides, X's row strides, cos and sin last-axis strides
    x_shape: tuple[int, ...] = ()  # X's (Y's, or [B, S, H, D] with x_bshd=1)


def _strides(table, x) -> tuple[list[int], int]:
    """Element strides of ``table`` (right-aligned to X's rank) per leading dim of X, and for the
    last axis; 0 where it broadcasts. ``TuningError`` when it does not broadcast to X."""
    t = (1,) * (len(x) - len(table)) + tuple(table)
    if len(t) != len(x) or any(a not in (1, b) for a, b in zip(t, x)):
        raise TuningError(f"RoPE cos/sin {tuple(table)} do not broadcast to X {tuple(x)}")
    strides, acc = [0] * len(t), 1
    for k in range(len(t) - 1, -1, -1):
        strides[k] = acc if t[k] != 1 else 0
        acc *= t[k]
    return strides[:-1], strides[-1]


def rope_plan(sig: Signature) -> RopePlan:
    if sig.op != "RoPE":
        raise TuningError(f"op {sig.op} is not RoPE")
    shapes = list(sig.input_shapes) + [None] * (3 - len(sig.input_shapes))
    xin, c, s = shapes[:3]
    if xin is None or c is None or s is None or len(xin) < 1 or min(xin) < 1:
        raise TuningError(f"RoPE needs known, non-empty X, cos and sin shapes, got {xin}, {c}, {s}")
    attrs = dict(sig.attrs)
    try:
        x = rotated_shape(tuple(int(v) for v in xin), attrs)
    except RuleError as e:  # x_bshd=1 on an X that is not rank 4
        raise TuningError(str(e)) from None
    d = int(x[-1])
    if d % 2:
        raise TuningError(f"RoPE's rotated dim must be even, got {d}")
    (cl, cs), (sl, ss) = _strides(c, x), _strides(s, x)
    numel = int(np.prod(x))
    if numel > geo.INT32_MAX or max(int(np.prod(c)), int(np.prod(s))) > geo.INT32_MAX:
        raise TuningError("RoPE tensors over 2**31 elements are not supported by the kernel")
    lead = [int(v) for v in x[:-1]]
    rows = [int(np.prod(xin[k + 1:-1])) * d for k in range(len(xin) - 1)]  # X's own row strides, in X's axis order
    xl = [rows[HEADS_PERM[k]] for k in range(3)] if x_bshd(attrs) else rows
    return RopePlan(tuple(int(v) for v in x), d, numel // 2, int(sig.attr("interleaved", 0) or 0),
                    tuple(lead + cl + sl + xl + [cs, ss]), tuple(int(v) for v in xin))


@dataclass(frozen=True)
class RopePairs(Candidate):
    """fp32 arithmetic; param vec (1: a thread per pair; 16 bytes: a thread per load)."""
    ordinary_launch = True  # its launch is one own kernel (Candidate.ordinary_launch)

    def _vec(self) -> int:
        return int(self.param("vec", 1))

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        try:
            p = rope_plan(sig)
            dt = geo.dtype_of(sig)
        except TuningError as exc:
            return str(exc)
        if dt not in SUPPORTED_DTYPES:
            return f"dtype {dt} (supported: {', '.join(SUPPORTED_DTYPES)})"
        if p.interleaved not in (0, 1):
            return f"interleaved={p.interleaved} must be 0 or 1"
        vec = self._vec()
        if vec not in (1, VEC16[dt]):
            return f"vec={vec} is neither 1 nor a 16-byte load of {dt} ({VEC16[dt]})"
        if vec > 1:
            if p.meta[-2:] != (1, 1):
                return "cos/sin broadcast along the rotated axis: no vector loads"
            span = p.D if p.interleaved else p.D // 2
            if span % vec:
                return f"{'the row' if p.interleaved else 'half the row'} ({span}) is not a multiple of vec={vec}"
        return None

    def source_hash(self) -> str:
        return source_hash("rope.cu")

    def _instances(self, dt: str, form: int) -> list[str]:
        out = [instance("rope", dt, form)]
        if self._vec() > 1:
            out.append(instance("rope_vec", dt, form, self._vec()))
        return out

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        return [("rope.cu", e) for e in self._instances(geo.dtype_of(sig), int(sig.attr("interleaved", 0) or 0))]

    def build(self, sig: Signature, arch: str) -> Lowering:
        import cupy

        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        p = rope_plan(sig)
        dt = geo.dtype_of(sig)
        vec = self._vec()
        kerns = [get_kernel("rope.cu", e) for e in self._instances(dt, p.interleaved)]
        meta = cupy.asarray(np.asarray(p.meta, dtype=np.int32))
        nlead = len(p.shape) - 1

        def grid(work: int) -> tuple[int]:
            return (max(1, min(-(-work // THREADS), GRID_MAX)),)

        scalar = (kerns[0], grid(p.pairs), (np.int32(p.pairs), np.int32(p.D), np.int32(nlead), meta))
        units = 2 * p.pairs // vec if p.interleaved else p.pairs // vec
        wide = (kerns[-1], grid(units), (np.int32(units), np.int32(p.D), np.int32(nlead), meta))

        def launch(inputs, outputs):
            x, c, s = inputs[:3]
            y = outputs[0]
            for a, what in ((x, "X"), (c, "cos"), (s, "sin"), (y, "Y")):
                if str(a.dtype) != dt or not a.flags.c_contiguous:
                    raise TuningError(f"RoPE {what} must be a C-contiguous {dt} array, got {a.dtype} {a.shape}")
            if tuple(x.shape) != p.x_shape or tuple(y.shape) != p.shape:
                raise TuningError(f"RoPE X and Y must have shapes {p.x_shape} and {p.shape}, got {x.shape} and {y.shape}")
            aligned = vec > 1 and all(a.data.ptr % 16 == 0 for a in (x, c, s, y))
            kern, g, tail = wide if aligned else scalar
            kern(g, (THREADS,), (x, c, s, y) + tail)

        return Lowering(launch=lambda ins, outs, ws: launch(ins, outs))


def rope_candidates() -> list[Candidate]:
    return [RopePairs("rope", (("vec", v),)) for v in sorted({VEC16["float16"], VEC16["float32"], 1}, reverse=True)]


def rope_kernel_instances() -> list[tuple[str, str]]:
    return ([("rope.cu", instance("rope", dt, form)) for dt in SUPPORTED_DTYPES for form in (0, 1)]
            + [("rope.cu", instance("rope_vec", dt, form, VEC16[dt])) for dt in SUPPORTED_DTYPES for form in (0, 1)])
