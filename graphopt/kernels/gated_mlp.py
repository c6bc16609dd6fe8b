"""GatedMLP lowering candidate: ``cublas_glu``, two cuBLAS GEMMs sharing X, then one gate kernel.

The up projection ``X @ Wu`` is written straight into Y and the gate projection ``X @ Wg`` into the
lowering's workspace (rows x N elements), both through graphopt's own cuBLAS handle
(``graphopt.kernels.blas``: fp32 accumulation, CUDA-graph capturable); ``glu.cu`` then computes
``Y = act(G + Bg) * (Y + Bu)`` in place in fp32, with 16-byte loads where N allows. Three launches,
all capturable.

``launch(inputs, outputs, workspace)``: ``inputs = [X, Wg, Wu, Bg, Bu]`` (biases optional),
``outputs = [Y]``; X ``[..., K]`` and Y ``[..., N]`` C-contiguous, Wg and Wu ``[K, N]`` row-major.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import blas
from graphopt.kernels import geometry as geo
from graphopt.kernels.mma_args import ptr
from graphopt.kernels.source import VEC16, get_kernel, instance, source_hash
from graphopt.lowering.contract import Candidate, Lowering, Signature

SUPPORTED_DTYPES = ("float16", "float32")  # the cuBLAS path's types
THREADS = 256
GRID_MAX = 132 * 32
ITEMSIZE = {"float16": 2, "float32": 4}


@dataclass(frozen=True)
class GluPlan:
    x_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    M: int
    N: int
    K: int


def glu_plan(sig: Signature) -> GluPlan:
    if sig.op != "GatedMLP":
        raise TuningError(f"op {sig.op} is not GatedMLP")
    shapes = list(sig.input_shapes) + [None] * (5 - len(sig.input_shapes))
    x, wg, wu, bg, bu = shapes[:5]
    if x is None or wg is None or wu is None or len(x) < 1 or min(x) < 1:
        raise TuningError(f"GatedMLP needs known X, Wg and Wu shapes, got {x}, {wg}, {wu}")
    if len(wg) != 2 or tuple(wu) != tuple(wg) or int(x[-1]) != int(wg[0]) or min(wg) < 1:
        raise TuningError(f"GatedMLP X {x}, Wg {wg} and Wu {wu} must be [..., K], [K, N] and [K, N]")
    k, n = int(wg[0]), int(wg[1])
    for b, what in ((bg, "Bg"), (bu, "Bu")):
        if b is not None and int(np.prod(b)) != n:
            raise TuningError(f"GatedMLP {what} must hold {n} values, got {b}")
    m = int(np.prod(x[:-1])) if len(x) > 1 else 1
    if max(m * n, m * k, k * n) > geo.INT32_MAX:
        raise TuningError("GatedMLP operands over 2**31 elements are not supported")
    return GluPlan(tuple(int(v) for v in x), tuple(int(v) for v in x[:-1]) + (n,), m, n, k)


@dataclass(frozen=True)
class CublasGlu(Candidate):
    """cuBLAS GEMMs (own handle) plus the fused gate kernel; no params."""

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        return geo.plan_or_reason(sig, glu_plan, SUPPORTED_DTYPES)[1]

    def source_hash(self) -> str:
        return source_hash("glu.cu") + f"+blas{blas.VERSION}"

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        dt = geo.dtype_of(sig)
        return [("glu.cu", instance("glu_gate", dt, v)) for v in (VEC16[dt], 1)]

    def build(self, sig: Signature, arch: str) -> Lowering:
        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        p = glu_plan(sig)
        dt = geo.dtype_of(sig)
        vec = VEC16[dt] if p.N % VEC16[dt] == 0 else 1
        wide = get_kernel("glu.cu", instance("glu_gate", dt, vec))
        narrow = get_kernel("glu.cu", instance("glu_gate", dt, 1))
        act = geo.act_args(sig)
        total = p.M * p.N
        tail = (np.int64(total), np.int32(p.N), np.int32(act.code), np.float32(act.alpha), np.float32(act.beta),
                np.float32(act.lo), np.float32(act.hi))
        nbytes = total * ITEMSIZE[dt]

        def grid(v: int) -> tuple[int]:
            return (max(1, min(-(-(total // v) // THREADS), GRID_MAX)),)

        def launch(inputs, outputs, workspace):
            x, wg, wu = inputs[:3]
            bg = inputs[3] if len(inputs) > 3 else None
            bu = inputs[4] if len(inputs) > 4 else None
            y = outputs[0]
            for a, what in ((x, "X"), (wg, "Wg"), (wu, "Wu"), (y, "Y"), (bg, "Bg"), (bu, "Bu")):
                if a is not None and (str(a.dtype) != dt or not a.flags.c_contiguous):
                    raise TuningError(f"GatedMLP {what} must be a C-contiguous {dt} array, got {a.dtype} {a.shape}")
            if tuple(x.shape) != p.x_shape or tuple(y.shape) != p.out_shape:
                raise TuningError(f"GatedMLP X and Y must have shapes {p.x_shape} and {p.out_shape}, got {x.shape} and {y.shape}")
            if workspace is None or workspace.nbytes < nbytes:
                raise TuningError(f"GatedMLP needs a workspace of {nbytes} bytes")
            g = workspace[:nbytes].view(dt)
            blas.gemm(x, wu, y, p.M, p.N, p.K)
            blas.gemm(x, wg, g, p.M, p.N, p.K)
            aligned = all(a is None or a.data.ptr % 16 == 0 for a in (g, y, bg, bu))
            v = vec if aligned else 1
            (wide if v == vec else narrow)(grid(v), (THREADS,), (g, y, ptr(bg), ptr(bu)) + tail)

        return Lowering(launch=launch, workspace_bytes=nbytes)


def gated_mlp_candidates() -> list[Candidate]:
    return [CublasGlu("cublas_glu", ())]


def gated_mlp_kernel_instances() -> list[tuple[str, str]]:
    return [("glu.cu", instance("glu_gate", dt, v)) for dt in SUPPORTED_DTYPES for v in (VEC16[dt], 1)]
