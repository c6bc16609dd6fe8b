"""Lowering selection: give every ``graphopt`` custom-op node a ``lowering`` and say how it was chosen.

``select_lowerings(graph, gpu)`` walks the graph and all its subgraphs. For each node in domain
``graphopt`` it builds the node's ``Signature`` and chooses, per the design's ``--gpu`` contract:

- ``profiled``: the named GPU is present and a ``profile`` function is given (``Profiler``); a node
  whose every timing came from the tuning cache is reported as ``cached``;
- ``cached``: the GPU is absent (or present with nothing to profile with) and the tuning cache holds
  entries for that GPU and signature (for example imported from another machine);
- ``heuristic``: otherwise (``graphopt.tune.heuristic``), and also when every candidate failed;
- ``none``: with ``--gpu none``; the heuristic's lowering is still recorded.

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
from graphopt.kernels.registry import signature_of
from graphopt.kernels.heuristic import heuristic_lowering

DOMAIN = "graphopt"
DEFAULT_DIM = 1
SEQ_DIM = 128

META_TARGET = "graphopt.target"
META_MODE = "graphopt.mode"
META_VERSION = "graphopt.version"
META_DEVICE = "graphopt.device"


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


@dataclass
class NodeSelection:
    """One node's choice. ``timings`` lists every candidate's result when it was profiled or cached."""

    graph: str
    node: str
    op: str
    signature: str
    lowering: str
    params: str
    mode: str
    reason: str
    timings: list[dict] = field(default_factory=list)
    dims: dict[str, int] = field(default_factory=dict)  # the bucket ({} without a shape profile)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class SelectionReport:
    requested: str
    target: str
    mode: str
    present: bool
    device: str | None
    summary: str
    rows: list[NodeSelection] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    # symbolic dim -> {"values": [...], "source": "--shape-profile x" | "--shape x" | "default (...)"}
    dims: dict[str, dict] = field(default_factory=dict)
    buckets: list[dict[str, int]] = field(default_factory=list)

    def dims_line(self) -> str:
        return dims_line(self.dims)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.mode] = out.get(r.mode, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict:
        return {
            "requested": self.requested, "target": self.target, "mode": self.mode, "present": self.present,
            "device": self.device, "summary": self.summary, "counts": self.counts(),
            "nodes": [r.to_dict() for r in self.rows], "messages": list(self.messages),
            "dims": {k: dict(v) for k, v in self.dims.items()}, "buckets": [dict(b) for b in self.buckets],
        }


def dims_line(dims: Mapping[str, Mapping[str, Any]]) -> str:
    """``tuned at: 'N'=1,8,32 (--shape-profile x), 'seq'=128 (default (SEQ_DIM))``, or ``""`` without dims."""
    if not dims:
        return ""
    parts = [f"{d!r}={','.join(str(v) for v in info['values'])} ({info['source']})" for d, info in dims.items()]
    return "tuned at: " + ", ".join(parts)


def _dtype_name(dtype: int | None) -> str:
    if dtype is None:
        return "unknown"
    try:
        import numpy as np
        from onnx import helper

        return np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).name
    except Exception:  # noqa: BLE001 - a dtype NumPy has no name for
        import onnx

        return onnx.TensorProto.DataType.Name(dtype).lower()


def bind_dims_sources(graph, shapes: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, str]]:
    """Symbolic dim name -> (value, the tensor in ``shapes`` it was read off)."""
    bound: dict[str, tuple[int, str]] = {}
    for name in sorted(shapes or {}):
        concrete = [int(d) for d in shapes[name]]
        info = graph.value_info(name)
        declared = info.shape if info is not None else None
        if declared is None or len(declared) != len(concrete):
            continue
        for d, v in zip(declared, concrete):
            if isinstance(d, str) and d and d not in bound:
                bound[d] = (v, name)
    return bound


def bind_dims(graph, shapes: Mapping[str, Sequence[int]] | None) -> dict[str, int]:
    """Symbolic dim name -> value, read off the tensors in ``shapes`` whose declared dims are symbolic."""
    return {d: v for d, (v, _) in bind_dims_sources(graph, shapes).items()}


def default_dim(name: str | None) -> tuple[int, str]:
    """The documented default for an unbound dim, and why: ``SEQ_DIM`` for a name containing "seq"."""
    if isinstance(name, str) and "seq" in name.lower():
        return SEQ_DIM, "default (SEQ_DIM)"
    return DEFAULT_DIM, "default (DEFAULT_DIM)"


def _concrete(shape, dims: Mapping[str, int], notes: list[str], defaulted: dict | None = None) -> tuple[int, ...] | None:
    if shape is None:
        return None
    out = []
    for d in shape:
        if isinstance(d, int) and d >= 0:
            out.append(d)
        elif isinstance(d, str) and d in dims:
            out.append(dims[d])
        else:
            value, _ = default_dim(d)
            label = repr(d) if isinstance(d, str) and d else "unknown dim"
            note = f"{label}={value} (default)"
            if note not in notes:
                notes.append(note)
            if defaulted is not None:
                defaulted.setdefault(d if isinstance(d, str) and d else "?", value)
            out.append(value)
    return tuple(out)


def node_signature(
    graph, node, dims: Mapping[str, int] | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
    defaulted: dict | None = None,
) -> tuple[Signature, list[str]]:
    """The ``Signature`` of one custom-op node, and notes on any dims that were defaulted.

    ``graph`` is the (sub)graph holding the node; absent optional inputs get shape ``None`` and
    dtype ``""``; the ``lowering*`` attributes are left out. ``defaulted`` (when given) collects
    ``dim name -> default value`` for every dim that took a default (``"?"`` for unnamed dims).
    """
    notes: list[str] = []
    in_shapes, dtypes = [], []
    for t in node.inputs:
        if not t:
            in_shapes.append(None)
            dtypes.append("")
            continue
        info = graph.value_info(t)
        shape = tuple(shapes[t]) if shapes and t in shapes else (info.shape if info is not None else None)
        in_shapes.append(_concrete(shape, dims or {}, notes, defaulted))
        dtypes.append(_dtype_name(info.dtype if info is not None else None))
    attrs = {k: v for k, v in node.attrs_dict().items() if not k.startswith("lowering")}
    sig = signature_of(node.op_type, in_shapes, dtypes, attrs)
    return sig, notes


def _custom_nodes(graph) -> list[tuple[Any, Any]]:
    return [(g, n) for g, n in graph.walk() if n.domain == DOMAIN]


def infer_missing_shapes(graph, nodes=None) -> int:
    """Run ONNX shape inference (through the custom ops' function bodies) when a custom-op input
    has no known shape; merge what it finds into ``graph``. Returns the number of value_infos added.

    Best effort: a model that shape inference cannot handle keeps the shapes it has.
    """
    nodes = _custom_nodes(graph) if nodes is None else nodes
    missing = any(t and g.value_info(t).shape is None for g, n in nodes for t in n.inputs)
    if not missing or not hasattr(graph, "merge_value_info"):
        return 0
    try:
        import onnx

        from graphopt.ir import to_model
        from graphopt.ops import attach_functions

        from graphopt.ir.large import WEIGHTLESS_ABOVE, infer_shapes_weightless, is_large

        model = attach_functions(to_model(graph))
        if is_large(model, WEIGHTLESS_ABOVE):  # inference on a big model: without the weights
            inferred = infer_shapes_weightless(model, check_type=False, strict_mode=False, data_prop=True)
        else:
            inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True).graph
    except Exception:  # noqa: BLE001 - an aid, never a reason to fail
        return 0
    return int(graph.merge_value_info(inferred.value_info))


def _propagated(graph, nodes, dims: Mapping[str, int], shapes) -> dict[str, tuple[int, ...]]:
    """Concrete shapes of the custom nodes' inputs at these dims, when some input dim is neither
    static nor a dim the graph inputs declare (and so bound by ``dims``); else {} (nothing to do)."""
    declared = {d for name in graph.inputs for d in (graph.value_info(name).shape or ()) if isinstance(d, str)}

    def unbound(shape):
        return shape is None or any(not (isinstance(d, int) and d >= 0) and d not in declared for d in shape)

    wanted = [t for g, n in nodes for t in n.inputs if t and g is graph and unbound(g.value_info(t).shape)]
    if not wanted:
        return {}
    from graphopt.tune.propagate import concrete_shapes

    known = concrete_shapes(graph, dims, lambda name: default_dim(name)[0], shapes, wanted)
    return {t: known[t] for t in wanted if t in known}


def _split_candidate(key: str) -> tuple[str, str]:
    name, _, params = key.partition(":")
    return name, params


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
) -> SelectionReport:
    """Choose and record a lowering for every ``graphopt`` node; see the module docstring.

    ``cache`` is a ``TuningCache`` (or ``None`` for none); ``profile(sig) -> ProfileResult`` is
    usually a ``Profiler``; ``devices`` overrides device detection (tests); ``candidates_for``
    lets cached entries whose kernel source changed be ignored; ``progress`` forces the progress
    bar on or off (default: on when stderr is a terminal and something is profiled);
    ``shape_profile`` (``--shape-profile`` items, a mapping or a ``ResolvedProfile``; see
    ``graphopt.tune.buckets``) tunes each bucket of the profiled dims separately.
    """
    from graphopt.tune import buckets as B

    requested = str(gpu)
    norm = normalize_gpu_name(requested)  # raises TuningError for unknown names, before any work
    resolved = B.resolve_profile(graph, shape_profile, shapes)  # UsageError before any work, too
    target = resolve_target(norm, devices)
    device = target.devices[0] if target.present else None
    cc = target.compute_capability
    profiling = device is not None and profile is not None
    nodes = _custom_nodes(graph)
    infer_missing_shapes(graph, nodes)
    bound = bind_dims_sources(graph, shapes)
    base_dims = {d: v for d, (v, _) in bound.items()}
    bucket_list: list[dict[str, int]] = resolved.buckets() or [{}]
    measured: set[str] = set()  # signature keys measured now; membership only
    defaulted: dict[str, int] = {}

    # signatures[i][b]: node i at bucket b (identical signatures are timed once by the profiler).
    # Where a custom node's input shape has dims no input binds, the shapes are propagated from the
    # inputs at that bucket's sizes (graphopt.tune.propagate), so it is tuned at its real size.
    signatures = [[] for _ in nodes]
    for bucket in bucket_list:
        known = _propagated(graph, nodes, {**base_dims, **bucket}, shapes) if norm != "none" else {}
        for i, (g, n) in enumerate(nodes):
            signatures[i].append(node_signature(g, n, {**base_dims, **bucket}, {**known, **(shapes or {})}, defaulted))

    def choose(g, node, sig, notes, bucket, advance=None) -> NodeSelection:
        key = sig.key()
        note = f" [dims: {', '.join(notes)}]" if notes else ""
        lowering = params = reason = mode = None
        reason_fail = ""
        timings: list[dict] = []
        if norm == "none":
            mode = "none"
        elif profiling:
            res = profile(sig)
            timings = [r.to_dict() for r in res.results]
            if res.winner is not None:
                lowering, params = res.winner.lowering, res.winner.params
                mode = "cached" if res.from_cache else "profiled"
                if not res.from_cache:
                    measured.add(key)
                reason = f"fastest of {sum(r.ok for r in res.results)} passing candidates ({res.winner.ms:.4g} ms)"
            else:
                mode = "heuristic"
                reason_fail = f"every candidate failed ({res.failure_summary()}); "
        elif cache is not None:
            hashes = None
            if candidates_for is not None:
                hashes = {c.key(): c.source_hash() for c in candidates_for(sig)}
            fp = device.fingerprint() if device is not None else None
            best, records = cache.best_for_gpu(target.name, key, source_hashes=hashes, fingerprint=fp)
            if best is not None:
                lowering, params = best.lowering, best.params
                mode = "cached"
                origin = "imported" if best.origin == "imported" else "local"
                reason = f"fastest of {sum(r.ok for r in records)} cached timings for {target.name} ({origin}, {best.ms:.4g} ms)"
                timings = [
                    {"candidate": r.candidate, "lowering": r.lowering, "params": r.params, "status": r.status,
                     "ms": r.ms if math.isfinite(r.ms) else None, "samples": list(r.samples), "reason": r.reason,
                     "cached": True}
                    for r in records
                ]
        if lowering is None:
            lowering, params, h_reason = heuristic_lowering(node.op_type, sig, cc)
            if mode is None:
                mode = "heuristic"
            reason = f"{reason_fail}heuristic: {h_reason}"
        if advance is not None:
            advance(node.name)
        return NodeSelection(g.name, node.name, node.op_type, key, lowering, params, mode, reason + note, timings,
                             dict(bucket))

    def choose_node(i, advance=None) -> list[NodeSelection]:
        g, node = nodes[i]
        picks = [choose(g, node, sig, notes, bucket, advance)
                 for bucket, (sig, notes) in zip(bucket_list, signatures[i])]
        last = picks[-1]  # the largest bucket: what a consumer that ignores the buckets runs
        node.set_attr("lowering", last.lowering)
        node.set_attr("lowering_params", last.params)
        if resolved:
            node.set_attr(B.ATTR, B.encode([(p.dims, p.lowering, p.params) for p in picks]))
        else:
            node.del_attr(B.ATTR)  # stale buckets from an earlier run would dispatch wrongly
        return picks

    rows: list[NodeSelection] = []
    if profiling and hasattr(profile, "profile_many"):
        # Distinct signatures first (spread over the GPUs), then every node from the memo.
        from graphopt.tune.profiler import node_progress

        sigs = [sig for per_node in signatures for sig, _ in per_node]
        distinct = len(dict.fromkeys(sig.key() for sig in sigs))
        ndev = len(target.devices)
        desc = f"tuning on {ndev} x {device.normalized}" if ndev > 1 else f"tuning on {device.normalized}"
        with node_progress(distinct, enabled=progress, description=desc) as advance:
            profile.profile_many(sigs, advance)
        for i in range(len(nodes)):
            rows.extend(choose_node(i))
    elif profiling:
        from graphopt.tune.profiler import node_progress

        total = len(nodes) * len(bucket_list)
        with node_progress(total, enabled=progress, description=f"tuning on {device.normalized}") as advance:
            for i in range(len(nodes)):
                rows.extend(choose_node(i, advance))
    else:
        for i in range(len(nodes)):
            rows.extend(choose_node(i))

    mode = _overall_mode(norm, profiling, rows)
    summary = _summary(requested, norm, target, device, profiling, profile, rows, measured,
                       len(nodes), resolved.buckets())
    meta = graph.metadata
    meta[META_TARGET] = target.name
    meta[META_MODE] = mode
    meta[META_VERSION] = graphopt_version()
    if device is not None and (profiling or mode in ("cached", "cached+heuristic")):
        meta[META_DEVICE] = f"{device.name}; {device.fingerprint().describe()}"
    else:
        meta.pop(META_DEVICE, None)
    messages = list(getattr(cache, "messages", []) or [])
    dims_info = _dims_info(resolved, bound, defaulted)
    return SelectionReport(requested, target.name, mode, target.present, device.name if device else None,
                           summary, rows, messages, dims_info, resolved.buckets())


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


def _overall_mode(norm: str, profiling: bool, rows: list[NodeSelection]) -> str:
    if norm == "none":
        return "none"
    modes = [r.mode for r in rows]
    if "profiled" in modes:
        return "profiled"
    if modes and all(m == "cached" for m in modes):
        return "cached"
    if "cached" in modes:
        return "cached+heuristic"
    if profiling and not modes:
        return "profiled"
    return "heuristic"


def _summary(requested, norm, target, device, profiling, profile, rows, measured, n_nodes=None, buckets=()) -> str:
    text = _summary_text(requested, norm, target, device, profiling, profile, rows, measured, bool(buckets))
    if buckets:
        n_nodes = len(rows) // len(buckets) if n_nodes is None else n_nodes
        text += f" ({n_nodes} node{'s' if n_nodes != 1 else ''} x {len(buckets)} buckets)"
    return text


def _summary_text(requested, norm, target, device, profiling, profile, rows, measured, per_bucket=False) -> str:
    n = len(rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.mode] = counts.get(r.mode, 0) + 1
    unit = "node-bucket" if per_bucket else "node"

    def plural(k: int) -> str:
        return f"{k} {unit}{'s' if k != 1 else ''}"

    if norm == "none":
        return f"--gpu none: nothing was profiled; lowerings recorded by heuristic ({plural(n)})"
    if profiling:
        parts = []
        if counts.get("profiled"):
            parts.append(f"{len(measured)} signature{'s' if len(measured) != 1 else ''} profiled for {plural(counts['profiled'])}")
        if counts.get("cached"):
            parts.append(f"{plural(counts['cached'])} served from the tuning cache")
        if counts.get("heuristic"):
            parts.append(f"{plural(counts['heuristic'])} fell back to the heuristic (every candidate failed)")
        where = device.name
        if len(target.devices) > 1:  # one worker per GPU (Profiler.profile_many)
            where += f" x {len(target.devices)}: devices {', '.join(str(d.index) for d in target.devices)}"
        return f"target {target.name} present ({where}): " + ("; ".join(parts) if parts else "no custom-op nodes to tune")
    if requested.strip().lower() == "auto" and not target.present:
        where = "no GPU detected (--gpu auto)"
    elif target.present:
        where = f"target {target.name} present but no kernel candidates are available"
    else:
        where = f"target {target.name} not present"
    cached, heur = counts.get("cached", 0), counts.get("heuristic", 0)
    if cached and heur:
        how = f"lowerings from tuning-cache entries for {target.name} ({plural(cached)}) and by heuristic ({plural(heur)})"
    elif cached:
        how = f"lowerings from tuning-cache entries for {target.name} ({plural(cached)})"
    else:
        how = f"lowerings chosen by heuristic ({plural(n)})"
    return f"{where}: nothing was profiled; {how}"


__all__ = [
    "DEFAULT_DIM", "SEQ_DIM", "infer_missing_shapes", "META_DEVICE", "META_MODE", "META_TARGET", "META_VERSION", "NodeSelection", "SelectionReport",
    "bind_dims", "bind_dims_sources", "default_dim", "dims_line", "graphopt_version", "node_signature", "select_lowerings",
]
