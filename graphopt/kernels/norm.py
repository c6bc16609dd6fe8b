"""LayerNorm (with SkipLayerNorm's residual, skip bias and sum output) and RMSNorm lowering candidates.

One family, ``rows`` (``norm.cu``): each row of the last axis held in registers by ``warps`` warps.
Its configurations are ``warps`` (warps per row), ``items`` (vectors per thread), ``vec`` (elements
per load: 16 bytes, or 1 for rows whose length is not a multiple of 16 bytes) and, for a warp per
row only, ``rpc`` (rows per CTA, 1 when absent from the key). For a row length D a configuration
applies when it holds the row and ``items`` is the smallest power of two that does, so each
``warps`` x ``vec`` x ``rpc`` gives at most one candidate and the profiler picks among them.
Several rows per CTA exist for short rows of many rows (BERT-base at bs32: 4,096 rows of 768): one
row per 128-thread CTA leaves a quarter of the threads idle and pays two barriers per reduction; a
warp per row reduces by shuffles alone and a CTA of ``rpc`` warps keeps the CTA count down.

``launch(inputs, outputs)``: the op's inputs in its schema's order, LayerNorm
``[X, scale, bias, skip, skip_bias]``, RMSNorm ``[X, scale, skip]`` (absent ones None),
``outputs = [Y]`` or ``[Y, S]`` (the sum is written when S is given; SkipLayerNorm and SkipRMSNorm).
Arrays are C-contiguous; Y and S have X's shape; skip has X's shape or a suffix of it broadcast over
the leading dims (GPT-2 / BERT add position embeddings [1, S, D] to [B, S, D]); scale, bias and
skip_bias hold D values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.lowering.contract import Candidate, Lowering, Signature
from graphopt.kernels.mma_args import ptr
from graphopt.kernels.source import VEC16, get_kernel, instance, source_hash
from graphopt.ops import get_schema

OPS = ("LayerNorm", "RMSNorm")
MODES = {"LayerNorm": 0, "RMSNorm": 1}
SUPPORTED_DTYPES = ("float16", "float32")
WARPS = (1, 2, 4, 8, 16, 32)
ITEMS = (1, 2, 4, 8)
ROWS_PER_CTA = (4, 8)  # besides 1; with a warp per row only
GRID_ROWS_MAX = 132 * 32  # CTAs; rows beyond this loop inside the kernel


@dataclass(frozen=True)
class NormPlan:
    rows: int
    D: int
    shape: tuple[int, ...]
    mode: int
    eps: float
    skip_rows: int = 0  # rows of skip (it repeats over X's leading dims); 0 without skip


def _vector_of(shape, d: int) -> bool:
    return shape is not None and int(np.prod(shape)) == d and all(s == 1 for s in shape[:-1])


def norm_plan(sig: Signature) -> NormPlan:
    if sig.op not in OPS:
        raise TuningError(f"op {sig.op} is not one of {', '.join(OPS)}")
    shapes = get_schema(sig.op).named(sig.input_shapes)
    x = shapes["X"]
    if x is None or len(x) < 1 or min(x) < 1:
        raise TuningError(f"{sig.op} needs a known, non-empty X shape, got {x}")
    d = int(x[-1])
    rows = int(np.prod(x[:-1])) if len(x) > 1 else 1
    for name in ("scale", "bias", "skip_bias"):
        if (name == "scale" or shapes.get(name) is not None) and not _vector_of(shapes.get(name), d):
            raise TuningError(f"{sig.op} {name} must hold the {d} values of the last axis, got {shapes.get(name)}")
    skip_rows = 0
    if shapes["skip"] is not None:
        sk = tuple(int(v) for v in shapes["skip"])
        core = sk[min(next((i for i, v in enumerate(sk) if v != 1), len(sk)), len(sk) - 1):]  # leading 1s dropped
        if not sk or len(core) > len(x) or core != tuple(int(v) for v in x[len(x) - len(core):]):
            raise TuningError(f"{sig.op} skip {shapes['skip']} must have X's shape {tuple(x)} or a suffix of it "
                              "broadcast over the leading dims")
        skip_rows = int(np.prod(core[:-1]))
    if rows * d > geo.INT32_MAX:
        raise TuningError(f"{sig.op} tensors over 2**31 elements are not supported by the kernels")
    default_eps = 1e-5 if sig.op == "LayerNorm" else 1e-6
    return NormPlan(rows, d, tuple(int(s) for s in x), MODES[sig.op], float(sig.attr("epsilon", default_eps)),
                    skip_rows)


@dataclass(frozen=True)
class NormRows(Candidate):
    """Each row in the registers of ``warps`` warps; params warps, items, vec and rpc (rows per CTA)."""
    ordinary_launch = True  # its launch is one own kernel (Candidate.ordinary_launch)

    def _cfg(self) -> tuple[int, int, int, int]:
        return int(self.param("warps")), int(self.param("items")), int(self.param("vec")), int(self.param("rpc", 1))

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        try:
            p = norm_plan(sig)
        except TuningError as exc:
            return str(exc)
        dt = geo.dtype_of(sig)
        if dt not in SUPPORTED_DTYPES:
            return f"dtype {dt} (supported: {', '.join(SUPPORTED_DTYPES)})"
        w, it, vec, rpc = self._cfg()
        if rpc > 1 and w != 1:
            return f"rpc={rpc} rows per CTA needs a warp per row (warps=1), not warps={w}"
        if vec not in (1, VEC16[dt]):
            return f"vec={vec} is neither 1 nor a 16-byte load of {dt} ({VEC16[dt]})"
        if p.D % vec:
            return f"row length {p.D} is not a multiple of vec={vec}"
        nv = p.D // vec
        if w * 32 * it < nv:
            return f"{w} warps x {it} items x vec {vec} hold {w * 32 * it * vec} < {p.D} elements"
        if it > 1 and w * 32 * (it // 2) >= nv:
            return f"items={it // 2} already holds the row (a smaller config of the same CTA size)"
        return None

    def source_hash(self) -> str:
        return source_hash("norm.cu")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        w, it, vec, rpc = self._cfg()
        return [("norm.cu", instance("norm_rows", geo.dtype_of(sig), vec, w, it, MODES[sig.op], rpc))]

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        p = norm_plan(sig)
        dt = geo.dtype_of(sig)
        w, it, vec, rpc = self._cfg()
        kern = get_kernel("norm.cu", instance("norm_rows", dt, vec, w, it, p.mode, rpc))
        grid = (max(1, min(-(-p.rows // rpc), GRID_ROWS_MAX)),)
        block = (w * 32 * rpc,)
        i32, f32 = np.int32, np.float32

        def arr(a, shape, what):
            if a is None:
                return None
            if str(a.dtype) != dt or not a.flags.c_contiguous or int(a.size) != int(np.prod(shape)):
                raise TuningError(f"{sig.op} {what} must be a C-contiguous {dt} array of {int(np.prod(shape))} "
                                  f"elements, got {a.dtype} {a.shape}")
            if vec > 1 and a.data.ptr % 16:
                raise TuningError(f"{sig.op} {what} is not 16-byte aligned (candidate vec={vec})")
            return a

        schema = get_schema(sig.op)

        def launch(inputs, outputs):
            ins = schema.named(inputs)
            X = arr(ins["X"], p.shape, "X")
            scale = arr(ins["scale"], (p.D,), "scale")
            bias = arr(ins.get("bias"), (p.D,), "bias")
            skip = arr(ins["skip"], (p.skip_rows, p.D), "skip") if p.skip_rows else None
            skip_bias = arr(ins.get("skip_bias"), (p.D,), "skip_bias")
            Y = arr(outputs[0], p.shape, "Y")
            S = arr(outputs[1], p.shape, "S") if len(outputs) > 1 and outputs[1] is not None else None
            if S is not None and skip is None:
                raise TuningError(f"{sig.op}'s sum output S needs the skip input")
            kern(grid, block, (X, ptr(skip), ptr(skip_bias), scale, ptr(bias), Y, ptr(S),
                               i32(p.rows), i32(p.D), f32(p.eps), i32(max(1, p.skip_rows))))

        # with a skip input the kernel also writes the sum S (LayerNorm's second output) when given one
        return Lowering(launch=lambda ins, outs, ws: launch(ins, outs), outputs=2 if p.skip_rows else 1)


def norm_candidates(dtype: str = "float32") -> list[Candidate]:
    """Every configuration; ``vec`` is the 16-byte width of ``dtype`` or 1 (``applies`` checks the dtype)."""
    out: list[Candidate] = []
    for vec in sorted({VEC16["float16"], VEC16["float32"], 1}, reverse=True):
        for w in WARPS:
            for it in ITEMS:
                out.append(NormRows("rows", (("warps", w), ("items", it), ("vec", vec))))
        for rpc in ROWS_PER_CTA:
            for it in ITEMS:
                out.append(NormRows("rows", (("warps", 1), ("items", it), ("vec", vec), ("rpc", rpc))))
    return out


def norm_kernel_instances() -> list[tuple[str, str]]:
    """Every (source, instance) a candidate can compile: both dtypes, both modes."""
    out = []
    for dt in SUPPORTED_DTYPES:
        for mode in (0, 1):
            for vec in (VEC16[dt], 1):
                for w in WARPS:
                    for it in ITEMS:
                        out.append(("norm.cu", instance("norm_rows", dt, vec, w, it, mode, 1)))
                for rpc in ROWS_PER_CTA:
                    for it in ITEMS:
                        out.append(("norm.cu", instance("norm_rows", dt, vec, 1, it, mode, rpc)))
    return out
