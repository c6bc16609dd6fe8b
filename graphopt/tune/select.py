"""Lowering selection: give every ``graphopt`` custom-op node a ``lowering`` and say how it was chosen.

``select_lowerings(graph, gpu)`` walks the graph and all its subgraphs. For each node in domain
``graphopt`` it builds the node's ``Signature`` and chooses, per the design's ``--gpu`` contract:

- ``profiled``: the named GPU is present and a ``profile`` function is given (``Profiler``); a node
  whose every timing came from the tuning cache is reported as ``cached``;
- ``cached``: the GPU is absent (or present with nothing to profile with) and the tuning cache holds
  entries for that GPU and signature (for example imported from another machine);
- ``heuristic``: otherwise (``graphopt.tune.heuristic``), and also when every candidate failed;
- ``none``: with ``--gpu none``; the heuristic's lowering is still recorded;
- ``partial``: profiled, but the tuning run was cut short for this node (the tuning budget was
  spent before all its candidates ran): the best finished candidate (else the heuristic) is
  recorded, the report's ``cut_short`` and the summary say so, and the model's metadata gets
  ``graphopt.mode = partial`` and ``graphopt.tuning_cut_short``. Such a run is never reported as tuned.

It sets the node attributes ``lowering`` and ``lowering_params`` and the model metadata
``graphopt.target``, ``graphopt.mode`` and ``graphopt.version`` (plus ``graphopt.device`` when a
GPU was used), and returns a ``SelectionReport`` whose ``summary`` is one line that says plainly
whether anything was profiled.

Shapes come from ``graph.value_info``. When a custom-op input has no shape (a tensor made by a
rewrite), ONNX shape inference is run once over the model with the custom ops' function bodies
attached, and what it finds is merged into the graph's value_info. Symbolic dims are bound from
``shapes`` (tensor name -> concrete shape, typically the graph inputs from ``--shape``): a graph
input declared ``("N", 3, 224, 224)`` given as ``(8, 3, 224, 224)`` binds ``N=8`` everywhere.
Unbound dims get documented defaults, and the node's reason says so: ``SEQ_DIM`` (128) for a dim
whose name contains "seq" (a sequence length), else ``DEFAULT_DIM`` (1, batch-1 inference).
``SelectionReport.dims`` says, per symbolic dim, the value(s) tuned at and where they came from
(``--shape-profile NAME``, ``--shape NAME`` or ``default``).

With a shape profile (``shape_profile``, see ``graphopt.tune.buckets``) every node is chosen once
per bucket: the report has one row per node and bucket (``NodeSelection.dims`` names the bucket),
the node gets the ``lowering_buckets`` attribute, and ``lowering`` / ``lowering_params`` hold the
choice for the largest bucket. Without a profile a stale ``lowering_buckets`` is removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from graphopt.lowering.contract import Signature
from graphopt.tune.gpus import DeviceInfo, normalize_gpu_name, resolve_target
from graphopt.tune.signatures import (DEFAULT_DIM, SEQ_DIM, custom_nodes, propagated_shapes, bind_dims,
                                      bind_dims_sources, default_dim, infer_missing_shapes, node_signature)
from graphopt.tune.report import NodeSelection, SelectionReport, cut_short_line, dims_line, overall_mode, summary_line
from graphopt.tune.layout_choice import LAYOUT_ATTR, LAYOUT_OPS, choose_layouts, layout_line
from graphopt.kernels.heuristic import heuristic_lowering
from graphopt.kernels.registry import candidate_from_key


META_TARGET = "graphopt.target"
META_MODE = "graphopt.mode"
META_VERSION = "graphopt.version"
META_DEVICE = "graphopt.device"
META_CUT_SHORT = "graphopt.tuning_cut_short"


def graphopt_version() -> str:
    """The installed graphopt version (``graphopt.__version__``, else the package metadata)."""
    try:
        import graphopt

        v = getattr(graphopt, "__version__", None)
        if v:
            return str(v)
    except Exception:  # noqa: BLE001
        pass
    try:
        from importlib.metadata import version

        return version("graphopt")
    except Exception:  # noqa: BLE001 - running from a source tree that is not installed
        return "0+unknown"


def _split_candidate(key: str) -> tuple[str, str]:
    name, _, params = key.partition(":")
    return name, params


@dataclass
class _Context:
    """What every step of one ``select_lowerings`` run reads: the request, the target and the collaborators."""

    requested: str
    norm: str
    target: Any
    device: DeviceInfo | None
    profile: Callable[[Signature], Any] | None
    cache: Any
    candidates_for: Callable[[Signature], Sequence] | None
    measured: set[str] = field(default_factory=set)  # signature keys measured now; membership only
    # per signature key, computed once per run (a 200-layer model repeats a handful of signatures)
    source_hashes: dict[str, dict[str, str]] = field(default_factory=dict)
    heuristic: dict[tuple[str, str], tuple[str, str, str]] = field(default_factory=dict)
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)  # signature key -> candidate key -> candidate
    base_dims: dict[str, int] = field(default_factory=dict)  # symbolic dims bound from --shape
    shapes_ahead: Any = None  # graphopt.tune.shapes_ahead.ShapesAhead: tuning-size shapes computed ahead

    @property
    def profiling(self) -> bool:
        return self.device is not None and self.profile is not None


@dataclass
class _Choice:
    """One signature's choice before the heuristic fills what is missing."""

    lowering: str | None = None
    params: str | None = None
    mode: str | None = None
    reason: str = ""
    reason_prefix: str = ""
    timings: list[dict] = field(default_factory=list)


def _signatures(graph, nodes, ctx: _Context, base_dims: Mapping[str, int], bucket_list, shapes,
                defaulted: dict) -> list[list[tuple[Signature, list[str]]]]:
    """``signatures[i][b]``: node i at bucket b, with its notes on defaulted dims. Where a custom
    node's input shape has dims no input binds, the shapes are propagated from the inputs at that
    bucket's sizes (``graphopt.tune.propagate``), so it is tuned at its real size."""
    signatures: list[list[tuple[Signature, list[str]]]] = [[] for _ in nodes]
    for bucket in bucket_list:
        dims = {**base_dims, **bucket}
        known = propagated_shapes(graph, nodes, dims, shapes, ctx.shapes_ahead) if ctx.norm != "none" else {}
        for i, (g, n) in enumerate(nodes):
            signatures[i].append(node_signature(g, n, dims, {**known, **(shapes or {})}, defaulted))
    return signatures


def _from_profile(ctx: _Context, sig: Signature) -> _Choice:
    """Profile the signature (the profiler's memo makes a repeated signature free)."""
    res = ctx.profile(sig)
    choice = _Choice(timings=[r.to_dict() for r in res.results])
    cut = getattr(res, "cut_short", 0)
    if res.winner is None:
        choice.mode = "heuristic"
        choice.reason_prefix = f"every candidate failed ({res.failure_summary()}); "
        if cut:
            choice.mode = "partial"
            choice.reason_prefix = f"tuning cut short, no candidate finished ({res.failure_summary()}); "
        return choice
    choice.lowering, choice.params = res.winner.lowering, res.winner.params
    choice.mode = "cached" if res.from_cache else "profiled"
    if not res.from_cache:
        ctx.measured.add(sig.key())
    choice.reason = f"fastest of {sum(r.ok for r in res.results)} passing candidates ({res.winner.ms:.4g} ms)"
    if cut:
        choice.mode = "partial"
        choice.reason = f"tuning cut short ({cut} candidate{'s' if cut != 1 else ''} not run): " + choice.reason
    return choice


def _from_cache(ctx: _Context, sig: Signature) -> _Choice:
    """The fastest cached timing for the target GPU (entries imported from another machine count)."""
    hashes = None
    if ctx.candidates_for is not None:
        hashes = ctx.source_hashes.get(sig.key())
        if hashes is None:
            hashes = ctx.source_hashes[sig.key()] = {c.key(): c.source_hash() for c in ctx.candidates_for(sig)}
    fp = ctx.device.fingerprint() if ctx.device is not None else None
    best, records = ctx.cache.best_for_gpu(ctx.target.name, sig.key(), source_hashes=hashes, fingerprint=fp)
    if best is None:
        return _Choice()
    origin = "imported" if best.origin == "imported" else "local"
    timings = [
        {"candidate": r.candidate, "lowering": r.lowering, "params": r.params, "status": r.status,
         "ms": r.ms if math.isfinite(r.ms) else None, "samples": list(r.samples), "reason": r.reason,
         "cached": True}
        for r in records
    ]
    reason = f"fastest of {sum(r.ok for r in records)} cached timings for {ctx.target.name} ({origin}, {best.ms:.4g} ms)"
    return _Choice(best.lowering, best.params, "cached", reason, "", timings)


def _choose(ctx: _Context, g, node, sig: Signature, notes: list[str], bucket) -> NodeSelection:
    """One node at one bucket: profiled, else cached, else (and for what they leave open) the heuristic."""
    if ctx.norm == "none":
        choice = _Choice(mode="none")
    elif ctx.profiling:
        choice = _from_profile(ctx, sig)
    elif ctx.cache is not None:
        choice = _from_cache(ctx, sig)
    else:
        choice = _Choice()
    if choice.lowering is None:
        memo_key = (node.op_type, sig.key())
        if memo_key not in ctx.heuristic:
            ctx.heuristic[memo_key] = heuristic_lowering(node.op_type, sig, ctx.target.compute_capability)
        choice.lowering, choice.params, h_reason = ctx.heuristic[memo_key]
        choice.mode = choice.mode or "heuristic"
        choice.reason = f"{choice.reason_prefix}heuristic: {h_reason}"
    note = f" [dims: {', '.join(notes)}]" if notes else ""
    return NodeSelection(g.name, node.name, node.op_type, sig.key(), choice.lowering, choice.params, choice.mode,
                         choice.reason + note, choice.timings, dict(bucket))


def _write_attrs(node, picks: list[NodeSelection], per_bucket: bool) -> None:
    """``lowering`` / ``lowering_params`` from the largest bucket (what a consumer that ignores the
    buckets runs), ``lowering_buckets`` with a shape profile (a stale one is removed), and on the
    ops that run on N-C-spatial tensors ``lowering_layout``, the layout the output runs in."""
    from graphopt.tune import buckets as B

    last = picks[-1]
    node.set_attr("lowering", last.lowering)
    node.set_attr("lowering_params", last.params)
    if per_bucket:
        node.set_attr(B.ATTR, B.encode([(p.dims, p.lowering, p.params) for p in picks]))
    else:
        node.del_attr(B.ATTR)  # stale buckets from an earlier run would dispatch wrongly
    if node.op_type in LAYOUT_OPS and last.layout:
        node.set_attr(LAYOUT_ATTR, last.layout)
    else:
        node.del_attr(LAYOUT_ATTR)


def _layouts_of(ctx: _Context, sig: Signature, key: str) -> tuple[str, ...]:
    """The layouts candidate ``key`` declares for ``sig`` (``Candidate.layouts``, no GPU needed):
    looked up among the run's candidates, else in the registry; ``()`` when it is unknown."""
    cands = ctx.by_key.get(sig.key())
    if cands is None:
        listed = (getattr(ctx.profile, "listed", None) or {}).get(sig.key())  # the profiler's own listing
        source = ctx.candidates_for or getattr(ctx.profile, "candidates_for", None)
        try:
            if listed is None and source is not None:
                listed = source(sig)
            cands = {c.key(): c for c in listed or ()}
        except Exception:  # noqa: BLE001 - a broken candidate list: look keys up in the registry
            cands = {}
        ctx.by_key[sig.key()] = cands
    cand = cands.get(key)
    try:
        if cand is None:
            cand = candidate_from_key(sig.op, key)
        return tuple(cand.layouts(sig))
    except Exception:  # noqa: BLE001 - unknown key (the runtime's "default"): C-contiguous
        return ()


def _choose_all(ctx: _Context, nodes, signatures, bucket_list, per_bucket: bool,
                advance: Callable[[str], None] | None = None) -> tuple[list[NodeSelection], list[dict]]:
    """Every node at every bucket (``advance(node name)`` after each), chosen jointly with the layout
    conversions counted (``graphopt.tune.layout_choice``), its attributes written; and the
    conversions that remain."""
    picks_per_node: list[list[NodeSelection]] = []
    for (g, node), per_node in zip(nodes, signatures):
        picks = []
        for bucket, (sig, notes) in zip(bucket_list, per_node):
            picks.append(_choose(ctx, g, node, sig, notes, bucket))
            if advance is not None:
                advance(node.name)
        picks_per_node.append(picks)
    sigs = [[sig for sig, _ in per_node] for per_node in signatures]
    dims = [{**ctx.base_dims, **bucket} for bucket in bucket_list]
    conversions = choose_layouts(nodes, picks_per_node, sigs, dims, lambda sig, key: _layouts_of(ctx, sig, key))
    rows: list[NodeSelection] = []
    for (g, node), picks in zip(nodes, picks_per_node):
        _write_attrs(node, picks, per_bucket)
        rows.extend(picks)
    return rows, conversions


def _profile_and_choose(ctx: _Context, nodes, signatures, bucket_list, per_bucket: bool,
                        progress: bool | None) -> tuple[list[NodeSelection], list[dict]]:
    """Profiling behind a progress bar. A profiler with ``profile_many`` gets every distinct signature
    first (spread over the GPUs; identical signatures once), then its memo serves every node;
    a plain ``profile`` function is called node by node."""
    from graphopt.tune.progress import node_progress

    ndev = len(ctx.target.devices)
    desc = f"tuning on {ndev} x {ctx.device.normalized}" if ndev > 1 else f"tuning on {ctx.device.normalized}"
    if hasattr(ctx.profile, "profile_many"):
        sigs = [sig for per_node in signatures for sig, _ in per_node]
        distinct = len(dict.fromkeys(sig.key() for sig in sigs))
        with node_progress(distinct, enabled=progress, description=desc) as advance:
            ctx.profile.profile_many(sigs, advance)
        return _choose_all(ctx, nodes, signatures, bucket_list, per_bucket)
    with node_progress(len(nodes) * len(bucket_list), enabled=progress, description=desc) as advance:
        return _choose_all(ctx, nodes, signatures, bucket_list, per_bucket, advance)


def file_mode(mode: str, profiling: bool) -> str:
    """The ``graphopt.mode`` the model records for a run of report mode ``mode``. With the GPU
    present, a timing served from the tuning cache was measured on this device as much as a fresh one
    (only entries of this exact device fingerprint and kernel source are served), so the file says
    ``profiled`` either way and a cold and a warm run write the same bytes; the report keeps
    ``cached``, so the user still sees what the cache served."""
    if profiling and mode in ("cached", "cached+heuristic"):
        return "profiled"
    return mode


def _record_metadata(graph, ctx: _Context, mode: str, cut_short: str) -> None:
    meta = graph.metadata
    meta[META_TARGET] = ctx.target.name
    meta[META_MODE] = file_mode(mode, ctx.profiling)
    meta[META_VERSION] = graphopt_version()
    if ctx.device is not None and (ctx.profiling or mode in ("cached", "cached+heuristic")):
        meta[META_DEVICE] = f"{ctx.device.name}; {ctx.device.fingerprint().describe()}"
    else:
        meta.pop(META_DEVICE, None)
    if cut_short:
        meta[META_CUT_SHORT] = cut_short
    else:
        meta.pop(META_CUT_SHORT, None)


def select_lowerings(
    graph,
    gpu: str = "auto",
    *,
    cache=None,
    profile: Callable[[Signature], Any] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    devices: list[DeviceInfo] | None = None,
    candidates_for: Callable[[Signature], Sequence] | None = None,
    progress: bool | None = None,
    shape_profile: Any = None,
    shapes_ahead: Any = None,
) -> SelectionReport:
    """Choose and record a lowering for every ``graphopt`` node; see the module docstring.

    ``cache`` is a ``TuningCache`` (or ``None`` for none); ``profile(sig) -> ProfileResult`` is
    usually a ``Profiler``; ``devices`` overrides device detection (tests); ``candidates_for``
    lets cached entries whose kernel source changed be ignored; ``progress`` forces the progress
    bar on or off (default: on when stderr is a terminal and something is profiled);
    ``shape_profile`` (``--shape-profile`` items, a mapping or a ``ResolvedProfile``; see
    ``graphopt.tune.buckets``) tunes each bucket of the profiled dims separately; ``shapes_ahead`` (a
    started ``graphopt.tune.shapes_ahead.ShapesAhead``) may answer the tuning-size shapes.
    """
    from graphopt.tune import buckets as B

    requested = str(gpu)
    norm = normalize_gpu_name(requested)  # raises TuningError for unknown names, before any work
    resolved = B.resolve_profile(graph, shape_profile, shapes)  # UsageError before any work, too
    target = resolve_target(norm, devices)
    ctx = _Context(requested, norm, target, target.devices[0] if target.present else None, profile, cache,
                   candidates_for, shapes_ahead=shapes_ahead)
    nodes = custom_nodes(graph)
    infer_missing_shapes(graph, nodes)
    bound = bind_dims_sources(graph, shapes)
    bucket_list: list[dict[str, int]] = resolved.buckets() or [{}]
    defaulted: dict[str, int] = {}
    ctx.base_dims = {d: v for d, (v, _) in bound.items()}
    signatures = _signatures(graph, nodes, ctx, ctx.base_dims, bucket_list, shapes,
                             defaulted)
    if ctx.profiling:
        rows, conversions = _profile_and_choose(ctx, nodes, signatures, bucket_list, bool(resolved), progress)
    else:
        rows, conversions = _choose_all(ctx, nodes, signatures, bucket_list, bool(resolved))
    last = [c for c in conversions if c["dims"] == dict(bucket_list[-1])]
    layout_summary = layout_line(last) if last or any(r.layout for r in rows) else ""  # silent without CNN nodes
    mode = overall_mode(norm, ctx.profiling, rows)
    cut_short = cut_short_line(rows, len(bucket_list) > 1 and bool(resolved))
    summary = summary_line(requested, norm, target, ctx.device, ctx.profiling, profile, rows, ctx.measured,
                       len(nodes), resolved.buckets())
    if cut_short:
        summary += f"; {cut_short}"
    _record_metadata(graph, ctx, mode, cut_short)
    messages = list(getattr(cache, "messages", []) or [])
    dims_info = _dims_info(resolved, bound, defaulted)
    report = SelectionReport(requested, target.name, mode, target.present, ctx.device.name if ctx.device else None,
                             summary, rows, messages, dims_info, resolved.buckets(), cut_short,
                             conversions=conversions, layout_summary=layout_summary)
    if ctx.profiling and hasattr(ctx.profile, "tuning_time"):
        report.tuning_time = ctx.profile.tuning_time()
    return report


def _dims_info(resolved, bound: Mapping[str, tuple[int, str]], defaulted: Mapping[str, int]) -> dict[str, dict]:
    """Per symbolic dim: the value(s) tuned at and where they came from, sorted by dim name."""
    out: dict[str, dict] = {}
    for d, (v, tensor) in bound.items():
        out[d] = {"values": [v], "source": f"--shape {tensor}"}
    for d, v in defaulted.items():
        if d not in out:
            out[d] = {"values": [v], "source": default_dim(None if d == "?" else d)[1]}
    out.update(resolved.describe())
    return dict(sorted(out.items()))


__all__ = [
    "DEFAULT_DIM", "SEQ_DIM", "infer_missing_shapes", "META_CUT_SHORT", "META_DEVICE", "META_MODE", "META_TARGET", "META_VERSION", "NodeSelection", "SelectionReport",
    "bind_dims", "bind_dims_sources", "default_dim", "dims_line", "graphopt_version", "node_signature", "select_lowerings",
]
