"""All lowering candidates per op: the profiler enumerates these and prunes with ``applies``."""

from __future__ import annotations

from graphopt.kernels.attention import attention_candidates, attention_kernel_instances
from graphopt.kernels.base import Candidate, Signature
from graphopt.kernels.cbr import cbr_candidates
from graphopt.kernels.gemm_act import gemm_act_candidates
from graphopt.kernels.norm import norm_candidates, norm_kernel_instances

_FAMILIES = {"CBR": cbr_candidates, "GemmAct": gemm_act_candidates, "LayerNorm": norm_candidates,
             "RMSNorm": norm_candidates, "Attention": attention_candidates}


def ops() -> list[str]:
    """Op types that have GPU lowerings."""
    return sorted(_FAMILIES)


def candidates_for(sig: Signature) -> list[Candidate]:
    """Every candidate (each family, each config) for ``sig.op`` in a fixed order; [] for other ops.

    The list is not pruned: call ``cand.applies(sig, compute_capability)`` and skip those that return
    a reason.
    """
    make = _FAMILIES.get(sig.op)
    return make() if make else []


def applicable(sig: Signature, compute_capability: tuple[int, int]) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """(candidates that apply, [(candidate, reason)] for those that do not)."""
    ok, skipped = [], []
    for cand in candidates_for(sig):
        reason = cand.applies(sig, compute_capability)
        if reason is None:
            ok.append(cand)
        else:
            skipped.append((cand, reason))
    return ok, skipped


def candidate_from_key(op: str, key: str) -> Candidate:
    """The candidate whose ``key()`` is ``key`` (as recorded in a model or the tuning cache)."""
    from graphopt.errors import TuningError

    for cand in _FAMILIES.get(op, lambda: [])():
        if cand.key() == key:
            return cand
    raise TuningError(f"no {op} lowering named {key!r}; run `graphopt optimize` again to re-tune")


def all_kernel_instances() -> list[tuple[str, str]]:
    """Every (source, template instance) any candidate can compile, for CI and prebuilding."""
    from graphopt.kernels.cbr import PIPE_DTYPES, PIPE_STAGES, PIPE_TILES, TILE_CONFIGS_BK
    from graphopt.kernels.source import instance

    out: list[tuple[str, str]] = []
    for dt in ("float16", "float32"):
        for opt in (1, 2, 4):
            out.append(("direct_conv.cu", instance("direct_conv", dt, opt, 0, 0)))
        for opt in (4, 8):
            for sw in (1, 2):
                out.append(("direct_conv.cu", instance("direct_conv", dt, opt, 3, sw)))
        for mode in (0, 1, 2, 3):
            for bm, bn, wm, wn, bk in TILE_CONFIGS_BK:
                for sepi in (0, 1):
                    out.append(("mma_gemm.cu", instance("mma_gemm", dt, mode, bm, bn, bk, wm, wn, sepi, 2)))
        if dt in PIPE_DTYPES:
            for mode in (0, 1, 3):
                for st in PIPE_STAGES:
                    for bm, bn, wm, wn, bk in PIPE_TILES:
                        for sepi in (0, 1):
                            out.append(("mma_gemm.cu", instance("mma_gemm", dt, mode, bm, bn, bk, wm, wn, sepi, st)))
        for t in ("epilogue_nchw", "epilogue_gemm", "im2col", "nchw_to_nhwc", "weight_to_rsc"):
            out.append(("elementwise.cu", instance(t, dt)))
    out.append(("elementwise.cu", "spin"))
    out += norm_kernel_instances()
    out += attention_kernel_instances()
    return out
