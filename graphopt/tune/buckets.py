"""Shape profiles (``--shape-profile NAME=DIM:V1,V2,...``) and the per-bucket lowering record.

Real exports have symbolic dims, such as a batch or a sequence length, and the fastest lowering
depends on them. ``--shape-profile x=batch:1,8,32`` binds the symbolic dim ``batch`` (declared by
graph input ``x``) to 1, then 8, then 32, and tunes every custom-op node once per value (a
*bucket*; identical signatures are still timed once). Several profiles, for different dims,
combine as their Cartesian product: ``x=batch:1,8`` with ``x=seq:128,512`` gives four buckets.

A symbolic dim is one name for the whole graph (``N`` in ``x`` is ``N`` everywhere), so each dim
is profiled once, whichever input names it, and a dim cannot be both profiled and fixed by
``--shape``.

The node records the choices in the STRING attribute ``lowering_buckets``: a compact JSON list,
sorted ascending by the dims' values (in dim-name order),

    [{"dims": {"batch": 1}, "lowering": "direct", "params": "opt=1"},
     {"dims": {"batch": 8}, "lowering": "implicit_gemm", "params": "bm=64,bn=64"}, ...]

and ``lowering`` / ``lowering_params`` keep the choice for the LARGEST bucket (the last one),
which is what a consumer that ignores buckets runs, and what ``choose`` falls back to above the
largest bucket. ``choose(node_attrs_or_json, actual_dims)`` is the runtime's dispatch: the first
bucket whose every dim is at or above the actual size, else the last bucket.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from graphopt.errors import UsageError
# the dispatch half lives in graphopt.lowering.buckets (the runtime uses it); re-exported here
from graphopt.lowering.buckets import ATTR, OPTION, choose, decode, encode  # noqa: F401

# The product of the profiles' value counts: each bucket costs one tuning pass over the model.
MAX_BUCKETS = 64
_EXAMPLE = "for example x=batch:1,8,32"


@dataclass(frozen=True)
class DimProfile:
    """One ``--shape-profile`` item: the values to tune symbolic dim ``dim`` of input ``input`` at."""

    input: str
    dim: str
    values: tuple[int, ...]
    text: str  # as the user wrote it, for error messages

    def where(self) -> str:
        return f"{OPTION} {self.text!r}"


@dataclass(frozen=True)
class ResolvedProfile:
    """The profiled dims checked against one graph, sorted by dim name; values ascending."""

    dims: tuple[DimProfile, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.dims)

    def buckets(self) -> list[dict[str, int]]:
        """Every bucket (the Cartesian product), ascending; ``[]`` without a profile."""
        if not self.dims:
            return []
        names = [d.dim for d in self.dims]
        return [dict(zip(names, combo)) for combo in itertools.product(*(d.values for d in self.dims))]

    def describe(self) -> dict[str, dict[str, Any]]:
        return {d.dim: {"values": list(d.values), "source": f"{OPTION} {d.input}"} for d in self.dims}


def _parse_one(item: str) -> DimProfile:
    text = str(item)
    where = f"{OPTION} {text!r}"
    name, sep, rest = text.rpartition("=")
    dim, colon, values = rest.rpartition(":")
    if not sep or not name or not colon or not dim.strip():
        raise UsageError(f"{where}: expected NAME=DIM:V1,V2,... ({_EXAMPLE})")
    parts = [v.strip() for v in values.split(",")]
    if not values.strip() or any(not p for p in parts):
        raise UsageError(f"{where}: the value list is empty or has an empty entry; give positive integers, {_EXAMPLE}")
    out: list[int] = []
    for p in parts:
        try:
            v = int(p)
        except ValueError:
            raise UsageError(f"{where}: {p!r} is not an integer; give positive integers, {_EXAMPLE}") from None
        if v <= 0:
            raise UsageError(f"{where}: {v} is not positive; every value must be >= 1, {_EXAMPLE}")
        if v in out:
            raise UsageError(f"{where}: {v} is given twice; list each value once")
        out.append(v)
    return DimProfile(name, dim.strip(), tuple(sorted(out)), text)


def parse_shape_profiles(items: Sequence[str]) -> list[DimProfile]:
    """``["x=batch:1,8,32"]`` -> ``[DimProfile("x", "batch", (1, 8, 32), ...)]``; ``UsageError`` (exit 2)
    for a malformed item, a non-integer or non-positive value, an empty list, a repeated value or
    the same input and dim given twice."""
    out: list[DimProfile] = []
    for item in items:
        prof = _parse_one(item)
        for prev in out:
            if (prev.input, prev.dim) == (prof.input, prof.dim):
                raise UsageError(f"{prof.where()}: dim {prof.dim!r} of input {prof.input!r} is already profiled by "
                                 f"{prev.where()}; give each dim once")
        out.append(prof)
    return out


def normalize_profile(profile: Any) -> list[DimProfile]:
    """What ``graphopt.optimize(shape_profile=...)`` accepts: ``None``, strings as on the command line,
    ``DimProfile`` objects, or a mapping ``{"x": {"batch": [1, 8, 32]}}``."""
    if not profile:
        return []
    if isinstance(profile, str):
        profile = [profile]
    if isinstance(profile, Mapping):
        items = []
        for name, dims in profile.items():
            if not isinstance(dims, Mapping):
                raise UsageError(f"shape_profile[{name!r}]: expected a mapping of dim name to values, "
                                 "for example {'x': {'batch': [1, 8, 32]}}")
            for dim, values in dims.items():
                if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                    values = [values]
                items.append(f"{name}={dim}:{','.join(str(v) for v in values)}")
        return parse_shape_profiles(items)
    if all(isinstance(p, DimProfile) for p in profile):
        return parse_shape_profiles([p.text for p in profile])
    return parse_shape_profiles([str(p) for p in profile])


def resolve_profile(graph, profile: Any, shapes: Mapping[str, Sequence[int]] | None = None) -> ResolvedProfile:
    """Check the profile against ``graph``: each input exists, each dim is a symbolic dim of it, a
    dim is profiled once and not also fixed by ``--shape``, and the bucket count stays within
    ``MAX_BUCKETS``. ``UsageError`` (exit 2) naming the option and the fix otherwise."""
    if isinstance(profile, ResolvedProfile):
        return profile
    items = normalize_profile(profile)
    if not items:
        return ResolvedProfile()
    inputs = [t for t in graph.inputs if not graph.is_initializer(t)]
    by_dim: dict[str, DimProfile] = {}
    for prof in items:
        if prof.input not in inputs:
            listed = ", ".join(inputs) if inputs else "none"
            raise UsageError(f"{prof.where()}: the model has no graph input {prof.input!r} (its inputs: {listed})")
        declared = graph.value_info(prof.input).shape
        symbolic = [d for d in (declared or ()) if isinstance(d, str) and d]
        if prof.dim not in symbolic:
            shown = "unknown" if declared is None else "[" + ", ".join(str(d) for d in declared) + "]"
            hint = (f"its symbolic dims: {', '.join(dict.fromkeys(symbolic))}" if symbolic
                    else "it has no symbolic dims; use --shape for fixed shapes")
            raise UsageError(f"{prof.where()}: {prof.dim!r} is not a symbolic dim of input {prof.input!r} "
                             f"(declared shape {shown}; {hint})")
        if prof.dim in by_dim:
            prev = by_dim[prof.dim]
            raise UsageError(f"{prof.where()}: dim {prof.dim!r} is already profiled by {prev.where()}; a symbolic "
                             "dim is one name for the whole graph, give it once")
        for tensor in sorted(shapes or {}):
            declared_there = graph.value_info(tensor).shape
            if declared_there is not None and prof.dim in declared_there:
                raise UsageError(f"{prof.where()}: dim {prof.dim!r} is also fixed by --shape {tensor}=...; drop it "
                                 f"from one of them ({OPTION} tunes each value, --shape fixes one)")
        by_dim[prof.dim] = prof
    resolved = ResolvedProfile(tuple(by_dim[d] for d in sorted(by_dim)))
    count = 1
    for d in resolved.dims:
        count *= len(d.values)
    if count > MAX_BUCKETS:
        sizes = " x ".join(str(len(d.values)) for d in resolved.dims)
        raise UsageError(f"{OPTION}: {sizes} = {count} buckets, more than {MAX_BUCKETS}; each bucket is one tuning "
                         "pass over the model, so give fewer values")
    return resolved


__all__ = [
    "ATTR", "MAX_BUCKETS", "DimProfile", "ResolvedProfile", "choose", "decode", "encode", "normalize_profile",
    "parse_shape_profiles", "resolve_profile",
]
