"""All lowering candidates per op, from every provider: the profiler enumerates these and prunes
with ``applies``; the runtime finds a recorded one by its key (a dict, not a scan).

Providers: graphopt's own kernels (this package) and the vendor libraries in ``graphopt.providers``
(cuDNN frontend graphs; they import without the library and report in ``applies`` why they cannot
run). ``register_family`` adds a candidate family from outside (for a new op, or more candidates
for CBR / GemmAct); docs/adding_a_fused_op.md walks through one. ``signature_of`` is the one place
a node's signature is made (the tuner and the runtime both call it).
"""

from __future__ import annotations

from typing import Callable, Sequence

from graphopt.errors import TuningError
from graphopt.kernels.attention import attention_candidates, attention_kernel_instances
from graphopt.lowering.contract import Candidate, Signature
from graphopt.kernels.cbr import cbr_candidates
from graphopt.kernels.gated_mlp import gated_mlp_candidates, gated_mlp_kernel_instances
from graphopt.kernels.earned import earns_place
from graphopt.kernels.gemm_act import gemm_act_candidates, vector_epilogue_kernel
from graphopt.kernels.geometry import dtype_of
from graphopt.kernels.group_norm import group_norm_candidates, group_norm_kernel_instances
from graphopt.kernels.norm import norm_candidates, norm_kernel_instances
from graphopt.kernels.rope import rope_candidates, rope_kernel_instances
import graphopt.providers as _providers  # a module, not its names: importing graphopt.providers first works too

_FAMILIES = {"CBR": cbr_candidates, "GemmAct": gemm_act_candidates, "LayerNorm": norm_candidates,
             "RMSNorm": norm_candidates, "Attention": attention_candidates, "RoPE": rope_candidates,
             "GroupNorm": group_norm_candidates, "GatedMLP": gated_mlp_candidates}
_KEYS: dict[str, dict[str, Candidate]] = {}  # op -> key -> candidate (built on first lookup; reset on registration)
# Registered families: op -> [make() -> candidates], in registration order, after the built-in one.
_EXTRA: dict[str, list[Callable[[], Sequence[Candidate]]]] = {}
# op -> output_shape(sig): what the profiler's checker allocates for an op it does not know.
_OUTPUT_SHAPES: dict[str, Callable[[Signature], tuple[int, ...]]] = {}


def _same(a: Callable, b: Callable) -> bool:
    key = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))  # noqa: E731
    return a is b or key(a) == key(b)


def register_family(op: str, make: Callable[[], Sequence[Candidate]], *,
                    output_shape: Callable[[Signature], tuple[int, ...]] | None = None) -> None:
    """Add ``make() -> [Candidate, ...]`` to the candidates the profiler enumerates for ``op``.

    ``output_shape(sig)`` is required for an op other than CBR / GemmAct: the profiler's checker
    allocates the (NaN-poisoned) output with it. Call this at import time of the module that defines
    the candidates: the profiler's worker process imports that module when it unpickles one.
    Registering the same function again (a reload) is a no-op.
    """
    if op not in _FAMILIES and output_shape is None and op not in _OUTPUT_SHAPES:
        raise ValueError(f"register_family({op!r}): pass output_shape=fn(sig) -> shape for an op that is not built in")
    fams = _EXTRA.setdefault(op, [])
    fams[:] = [f for f in fams if not _same(f, make)] + [make]
    _KEYS.pop(op, None)
    if output_shape is not None:
        _OUTPUT_SHAPES[op] = output_shape


def unregister_family(op: str, make: Callable[[], Sequence[Candidate]]) -> None:
    """Remove a family added with ``register_family`` (tests)."""
    fams = [f for f in _EXTRA.get(op, []) if not _same(f, make)]
    _KEYS.pop(op, None)
    if fams:
        _EXTRA[op] = fams
    else:
        _EXTRA.pop(op, None)
        _OUTPUT_SHAPES.pop(op, None)


def output_shape_of(sig: Signature) -> tuple[int, ...]:
    """The output shape a registered op's family declared (``register_family(output_shape=)``)."""
    fn = _OUTPUT_SHAPES.get(sig.op)
    if fn is None:
        raise TuningError(f"graphopt.{sig.op} has no output_shape; pass output_shape= to register_family")
    return tuple(int(d) for d in fn(sig))


def _makers(op: str) -> list[Callable[[], Sequence[Candidate]]]:
    base = [_FAMILIES[op]] if op in _FAMILIES else []
    return base + list(_EXTRA.get(op, []))


def layout_of(op: str) -> str:
    """The layout a node's signature is made in: GEMMs row-major, the rest NCHW (1-D convs too)."""
    return "rowmajor" if op == "GemmAct" else "NCHW"


def signature_of(op: str, shapes: Sequence, dtypes: Sequence[str], attrs) -> Signature:
    """The signature of a node of ``op`` with these input shapes / dtypes / attributes (the
    ``lowering*`` attributes are left out): the tuner and the runtime both make it here."""
    return Signature.make(op, shapes, dtypes, attrs, layout=layout_of(op))


def ops() -> list[str]:
    """Op types that have GPU lowerings."""
    return sorted(set(_FAMILIES) | set(_EXTRA))


def candidates_for(sig: Signature) -> list[Candidate]:
    """Every candidate (each family, each config that earned its place, ``graphopt.kernels.earned``)
    for ``sig.op`` in a fixed order; [] for other ops.

    The list is not pruned: call ``cand.applies(sig, compute_capability)`` and skip those that return
    a reason.
    """
    makers = _makers(sig.op)
    dtype = _data_dtype(sig)
    first = _built_in(sig.op, dtype) if sig.op in _FAMILIES else [
        c for make in makers[:1] for c in make() if earns_place(c, dtype)]  # a new op's first registered family
    return first + _providers.provider_candidates(sig.op, sig) + [c for make in makers[1:] for c in make()]


_BUILT_IN: dict[tuple[str, str], list[Candidate]] = {}  # (op, data dtype) -> the built-in family's earned configs


def _built_in(op: str, dtype: str) -> list[Candidate]:
    """The built-in family's configurations that earned their place for ``dtype`` (retired ones:
    ``graphopt.kernels.earned``), listed once per (op, dtype): the family is fixed at import and its
    candidates are frozen, so every signature of a model shares one list (a copy is returned)."""
    own = _BUILT_IN.get((op, dtype))
    if own is None:
        own = _BUILT_IN[(op, dtype)] = [c for c in _FAMILIES[op]() if earns_place(c, dtype)]
    return list(own)


def _data_dtype(sig: Signature) -> str:
    """The signature's one data dtype, or "" when its inputs mix dtypes (no verdict: every config stays;
    each candidate's ``applies`` says why it cannot run them)."""
    try:
        return dtype_of(sig)
    except TuningError:
        return ""


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
    index = _KEYS.get(op)
    if index is None:
        index = _KEYS[op] = {}
        for cand in (c for make in _makers(op) for c in make()):
            index.setdefault(cand.key(), cand)
    if key in index:
        return index[key]
    vendor = _providers.provider_from_key(op, key)  # provider plans are per signature: parsed, not listed
    if vendor is not None:
        return vendor
    raise TuningError(f"no {op} lowering named {key!r}; run `graphopt optimize` again to re-tune")


def all_kernel_instances() -> list[tuple[str, str]]:
    """Every (source, template instance) any candidate can compile, for CI and prebuilding."""
    from graphopt.kernels.mma_tiles import PIPE_DTYPES, PIPE_STAGES, PIPE_TILES, TILE_CONFIGS_BK
    from graphopt.kernels.cbr_depthwise import instances as depthwise_instances
    from graphopt.kernels.cbr_stem import instances as stem_instances
    from graphopt.kernels.pool import instances as pool_instances
    from graphopt.kernels.source import VEC16, instance

    out: list[tuple[str, str]] = []
    for dt in ("float16", "float32"):
        for opt in (1, 2, 4):
            out.append(("direct_conv.cu", instance("direct_conv", dt, opt, 0, 0)))
        for opt in (4, 8):
            for sw in (1, 2):
                out.append(("direct_conv.cu", instance("direct_conv", dt, opt, 3, sw)))
        out += depthwise_instances(dt)
        out += stem_instances(dt)
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
        for t in ("epilogue_nchw", "epilogue_gemm", "im2col", "nchw_to_nhwc", "weight_to_rsc", "pad_channels_nhwc"):
            out.append(("elementwise.cu", instance(t, dt)))
        out += [vector_epilogue_kernel(dt, loads) for loads in (1, 2)]  # 2: timed by bench/transformer_kernels.py
        out.append(("im2col_rows.cu", instance("im2col_rows", dt, VEC16[dt])))  # cuBLASLt's im2col variant
    out.append(("elementwise.cu", "spin"))
    out += norm_kernel_instances()
    out += attention_kernel_instances()
    out += pool_instances()
    out += rope_kernel_instances() + group_norm_kernel_instances() + gated_mlp_kernel_instances()
    return out
