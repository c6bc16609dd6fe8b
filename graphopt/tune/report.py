"""What lowering selection reports: one row per node (and bucket), the run's mode and summary line.

``graphopt.tune.select`` fills these; the CLI and the JSON report read them. Modes are explained in
``graphopt.tune.select``'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


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
    layout: str = ""  # NCHW / NHWC the output runs in, for graphopt.tune.layout_choice.LAYOUT_OPS; else ""

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
    cut_short: str = ""  # why tuning is incomplete ("" when it finished); the mode is then "partial"
    tuning_time: dict = field(default_factory=dict)  # where profiling's seconds went (tuning_time.TuningTime)

    def dims_line(self) -> str:
        return dims_line(self.dims)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.mode] = out.get(r.mode, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict:
        out = {
            "requested": self.requested, "target": self.target, "mode": self.mode, "present": self.present,
            "device": self.device, "summary": self.summary, "counts": self.counts(),
            "nodes": [r.to_dict() for r in self.rows], "messages": list(self.messages),
            "dims": {k: dict(v) for k, v in self.dims.items()}, "buckets": [dict(b) for b in self.buckets],
            "cut_short": self.cut_short, "tuning_time": dict(self.tuning_time),
        }
        out.update(conversions=[dict(c) for c in self.conversions], layout_summary=self.layout_summary)
        return out

    # layout conversions left in the chosen plan, estimated (graphopt.tune.layout_choice), every bucket
    conversions: list[dict] = field(default_factory=list)
    layout_summary: str = ""  # one line on the conversions of the largest bucket


def dims_line(dims: Mapping[str, Mapping[str, Any]]) -> str:
    """``tuned at: 'N'=1,8,32 (--shape-profile x), 'seq'=128 (default (SEQ_DIM))``, or ``""`` without dims."""
    if not dims:
        return ""
    parts = [f"{d!r}={','.join(str(v) for v in info['values'])} ({info['source']})" for d, info in dims.items()]
    return "tuned at: " + ", ".join(parts)


def cut_short_line(rows: list[NodeSelection], per_bucket: bool) -> str:
    """"" when every profiled node finished, else the sentence the summary and metadata carry."""
    n = sum(r.mode == "partial" for r in rows)
    if not n:
        return ""
    unit = "node-bucket" if per_bucket else "node"
    return (f"tuning cut short: {n} {unit}{'s' if n != 1 else ''} not fully tuned (the tuning budget was spent); "
            "run again to finish")


def overall_mode(norm: str, profiling: bool, rows: list[NodeSelection]) -> str:
    if norm == "none":
        return "none"
    modes = [r.mode for r in rows]
    if "partial" in modes:  # a run cut short is never reported as tuned
        return "partial"
    if "profiled" in modes:
        return "profiled"
    if modes and all(m == "cached" for m in modes):
        return "cached"
    if "cached" in modes:
        return "cached+heuristic"
    if profiling and not modes:
        return "profiled"
    return "heuristic"


def summary_line(requested, norm, target, device, profiling, profile, rows, measured, n_nodes=None, buckets=()) -> str:
    text = summary_text(requested, norm, target, device, profiling, profile, rows, measured, bool(buckets))
    if buckets:
        n_nodes = len(rows) // len(buckets) if n_nodes is None else n_nodes
        text += f" ({n_nodes} node{'s' if n_nodes != 1 else ''} x {len(buckets)} buckets)"
    return text


def summary_text(requested, norm, target, device, profiling, profile, rows, measured, per_bucket=False) -> str:
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
