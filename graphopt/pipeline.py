"""The optimize pipeline: load -> cleanup -> fusion rules -> lowering selection -> save.

Each step takes the ``Graph`` and returns a report; this module strings them together and collects
an ``OptimizeReport``. The library facade (``graphopt.api``) and the CLI are thin layers over it.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import onnx

from graphopt import __version__
from graphopt.errors import GraphoptError, InvalidModel, VerificationFailed
from graphopt.files import Output, Staged, check_outputs
from graphopt.ir import Graph, load_model, save_model, to_model
from graphopt.ir.ahead import InferAhead
from graphopt.ir.io import data_file_for
from graphopt.ir.large import WEIGHTLESS_ABOVE, materialize, small_bytes
from graphopt.compare import VerifyResult, check_shape_overrides, check_tolerances, input_sizes, verify_models
from graphopt.output_check import check_output_model

Progress = Callable[[str], None]


@dataclass
class OptimizeReport:
    """What one optimize run did; ``to_json`` is what ``--report`` writes."""

    source: str
    output: str | None = None
    nodes_before: int = 0
    nodes_after: int = 0
    cleanup: dict[str, int] = field(default_factory=dict)
    rewrites: dict[str, int] = field(default_factory=dict)
    custom_ops: dict[str, int] = field(default_factory=dict)
    matches: list[dict[str, Any]] = field(default_factory=list)
    near_misses: list[dict[str, Any]] = field(default_factory=list)
    unfused: list[dict[str, Any]] = field(default_factory=list)  # --explain: Conv/Gemm/MatMul -> activation left
    target: str = "none"
    mode: str = "none"
    selection_summary: str = ""
    lowerings: list[dict[str, Any]] = field(default_factory=list)  # one per node (per node and bucket with a profile)
    tuning_dims: dict[str, dict[str, Any]] = field(default_factory=dict)  # dim -> {"values", "source"}
    buckets: list[dict[str, int]] = field(default_factory=list)  # the --shape-profile buckets, ascending
    layout_conversions: list[dict[str, Any]] = field(default_factory=list)  # left in the plan, estimated
    layout_summary: str = ""
    verify: dict[str, Any] | None = None
    messages: list[str] = field(default_factory=list)  # warnings, e.g. a tuning cache that was not trusted
    precision: str = "fp32"
    nodes_after_cleanup: int = 0  # nodes_before -> (cleanup) -> nodes_after_cleanup -> (fusion rules) -> nodes_after
    ops_before: dict[str, int] = field(default_factory=dict)  # op type -> count, before and after (--ops)
    ops_after: dict[str, int] = field(default_factory=dict)
    input_dims: list[str] = field(default_factory=list)  # symbolic dims of the graph inputs ("tuned at:")
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    tuning_time: dict[str, Any] = field(default_factory=dict)  # where profiling's seconds went (tuning_time.TuningTime)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)


def _count_nodes(graph: Graph) -> int:
    return sum(1 for _ in graph.walk())


def _input_dims(graph: Graph) -> list[str]:
    dims: list[str] = []
    for t in graph.inputs:
        shape = graph.value_info(t).shape if not graph.is_initializer(t) else None
        dims += [d for d in shape or () if isinstance(d, str) and d and d not in dims]
    return dims


def _census(graph: Graph) -> tuple[int, dict[str, int], dict[str, int]]:
    """(node count, op type -> count, graphopt op type -> count; the dicts sorted by key) from one
    walk over every node and subgraph, not three."""
    ops: Counter = Counter()
    custom: Counter = Counter()
    for _, n in graph.walk():
        ops[n.qualified_op] += 1
        if n.domain == "graphopt":
            custom[n.op_type] += 1
    return sum(ops.values()), dict(sorted(ops.items())), dict(sorted(custom.items()))


def _with_inferred_shapes(graph: Graph, ahead: InferAhead | None = None) -> tuple[onnx.ModelProto, Graph]:
    """(the validated original model, the IR with value_info from onnx shape inference merged in);
    ``ahead``: the child started on the original while the IR was built (graphopt.ir.ahead)."""
    original = graph.source_model if graph.source_model is not None else to_model(graph)
    inferred = (ahead or InferAhead()).inferred_graph(original)
    if inferred is not None:
        graph.merge_value_info(inferred.value_info)
    return original, graph


def _converted(original: onnx.ModelProto, fp32: Graph, precision: str, io_fp16: bool, keep_fp32, source: str,
               report: OptimizeReport) -> Graph:
    """The IR of ``original`` converted to ``precision`` (graphopt.precision), shapes inferred, with the
    dims the fp32 IR ``fp32`` knows where the converted model's inference lost them (``restore_dims``)."""
    from graphopt.precision import PRECISIONS, clamped_fills, convert_fp16, restore_dims

    if precision not in PRECISIONS:
        raise GraphoptError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    converted = convert_fp16(materialize(original), io_fp16=io_fp16, keep_fp32=list(keep_fp32), source=source)
    report.precision = precision + (" (fp16 inputs/outputs)" if io_fp16 else "") + (
        f" (fp32: {', '.join(keep_fp32)})" if keep_fp32 else "")
    graph = _with_inferred_shapes(load_model(converted))[1]
    restore_dims(graph, fp32)
    graph.fp16_clamped = clamped_fills(graph, fp32)
    return graph


def optimize_graph(
    graph: Graph,
    *,
    gpu: str = "auto",
    rules: Sequence[str | os.PathLike] = (),
    disable: Sequence[str] = (),
    explain: bool = False,
    cleanup: bool = True,
    shapes: dict[str, list[int]] | None = None,
    shape_profile: Any = None,
    progress: Progress | None = None,
    report: OptimizeReport | None = None,
    ruleset: Any = None,
    tune_budget: float | None = None,
) -> OptimizeReport:
    """Rewrite ``graph`` in place and return the report.

    ``shape_profile`` (``--shape-profile`` items or a mapping, see ``graphopt.tune.buckets``) is
    checked against the graph's inputs first, so a bad one fails before any work. ``tune_budget``
    (seconds) caps profiling; a run that hits it is reported as cut short (mode ``partial``)."""
    from graphopt.passes import dead_code, fold_constants, merge_duplicates, run_cleanup
    from graphopt.rewrite import apply_rules, load_rules
    from graphopt.tune.buckets import resolve_profile
    from graphopt.tune.shapes_ahead import ShapesAhead
    from graphopt.tune.tuner import tune_graph

    profile = resolve_profile(graph, shape_profile, shapes)
    with ShapesAhead() as shapes_ahead:  # tuning-size shapes beside cleanup and rules (graphopt.tune.shapes_ahead)
        shapes_ahead.start(graph, gpu, shapes, profile)
        report = report or OptimizeReport(source=graph.source_path or "<model>")
        step = progress or (lambda msg: None)
        t = time.perf_counter()
        ruleset = ruleset or load_rules(shipped=True, paths=[str(p) for p in rules], disable=list(disable))
        report.timings["load_rules"] = time.perf_counter() - t
        if not (report.nodes_before and report.ops_before):
            count, ops, _ = _census(graph)
            report.nodes_before = report.nodes_before or count
            report.ops_before = report.ops_before or ops
        report.input_dims = _input_dims(graph)
        if cleanup:
            step("cleanup passes")
            t = time.perf_counter()
            report.cleanup = {k: v for k, v in run_cleanup(graph, refine=True).items() if v}
            report.timings["cleanup"] = time.perf_counter() - t
        report.nodes_after_cleanup = _count_nodes(graph)
        step("fusion rules")
        t = time.perf_counter()
        rw = apply_rules(graph, ruleset, explain=explain)
        report.rewrites = dict(sorted((k, v) for k, v in rw.counts.items() if v))
        report.matches = [_as_dict(m) for m in rw.matches]
        report.near_misses = [_as_dict(m) for m in rw.near_misses] if explain else []
        if explain:
            from graphopt.rewrite.unfused import unfused_chains

            report.unfused = unfused_chains(graph, ruleset, rw.near_misses)
        report.timings["rewrite"] = time.perf_counter() - t
        if cleanup and rw.counts and any(rw.counts.values()):
            # Rewrites can leave constants unused (a bias folded into a new one): sweep them; a rule may
            # also build nodes of constants only (two masks summed): fold them, and the same node twice
            # (the Shape of one input that two head splits' shape rules read): merge them, so a second
            # run is a no-op.
            t = time.perf_counter()
            folded = fold_constants(graph)
            if folded:
                report.cleanup["fold_constants"] = report.cleanup.get("fold_constants", 0) + folded
            merged = merge_duplicates(graph)
            if merged:
                report.cleanup["merge_duplicates"] = report.cleanup.get("merge_duplicates", 0) + merged
            removed = dead_code(graph)
            if removed:
                report.cleanup["dead_code"] = report.cleanup.get("dead_code", 0) + removed
            report.timings["cleanup_after"] = time.perf_counter() - t
        step("lowering selection")
        t = time.perf_counter()
        # Profiles when the named GPU is present, else imported cache entries, else the heuristic.
        sel = tune_graph(graph, gpu=gpu, shapes=shapes, progress=None if progress is not None else False,
                         shape_profile=profile, budget_s=tune_budget, shapes_ahead=shapes_ahead)
        report.target = sel.target
        report.mode = sel.mode
        report.selection_summary = sel.summary
        report.messages = list(sel.messages)
        report.lowerings = [_as_dict(r) for r in sel.rows]
        report.layout_conversions = [dict(c) for c in sel.conversions]
        report.layout_summary = sel.layout_summary
        report.tuning_dims = {k: dict(v) for k, v in sel.dims.items()}
        report.buckets = [dict(b) for b in sel.buckets]
        report.tuning_time = dict(sel.tuning_time)
        report.timings["select"] = time.perf_counter() - t
        graph.toposort()
        graph.lint()
        report.nodes_after, report.ops_after, report.custom_ops = _census(graph)
        return report


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_asdict"):
        return dict(obj._asdict())
    return {"value": str(obj)}


def finalize_model(graph: Graph) -> onnx.ModelProto:
    """The ModelProto to write: custom-op function bodies attached, graphopt metadata recorded."""
    from graphopt.ops import attach_functions

    graph.metadata["graphopt.version"] = __version__
    model = to_model(graph)
    model = attach_functions(model)
    return model


def _verify_or_raise(model, original, report: OptimizeReport, source: str, shapes, rtol: float | None,
                     atol: float | None) -> None:
    """Run both under onnxruntime; record the result; raise VerificationFailed past the tolerance
    (``None``: the default for the models' dtypes, ``graphopt.compare.default_tolerances``; after ``--precision
    fp16``, fp16's, whatever dtypes the optimized model's own tensors still show)."""
    if report.precision.startswith("fp16"):
        from graphopt.precision import fp16_tolerances

        rtol, atol = fp16_tolerances(rtol, atol)
    try:
        result: VerifyResult = verify_models(model, original, shapes=shapes, rtol=rtol, atol=atol)
    except VerificationFailed as e:
        # onnxruntime refused one of the two: if it refuses the input as well, the input is at fault.
        from graphopt.compare import make_inputs, run_onnxruntime

        try:
            run_onnxruntime(original, make_inputs(original, shapes))
        except VerificationFailed as ref_error:
            raise InvalidModel(f"{source}: the input model cannot be run: {ref_error}; fix or re-export the model") from None
        raise VerificationFailed(f"{source}: {e}; nothing was written") from None
    report.verify = result.to_dict()
    report.messages.extend(result.warnings)
    if not result.ok:
        worst = result.worst()
        note = f"; {worst.note}" if worst.note else ""
        raise VerificationFailed(
            f"{source}: optimized output {worst.name!r} differs from the original (max abs {worst.max_abs:.3g}, "
            f"max rel {worst.max_rel:.3g}, rtol {result.rtol}, atol {result.atol}){note}; nothing was written"
        )


def _check_options_first(options: dict) -> None:
    """Options are checked before the model is read: the --gpu name, the rule files and the
    ``disable`` names (by loading the rules, which optimize_graph then uses)."""
    from graphopt.rewrite import load_rules
    from graphopt.tune.gpus import normalize_gpu_name

    normalize_gpu_name(options.get("gpu", "auto"))
    if options.get("ruleset") is None:
        options["ruleset"] = load_rules(shipped=True, paths=[str(p) for p in options.get("rules", ())],
                                        disable=list(options.get("disable", ())))


def default_output_path(source: str | os.PathLike) -> Path:
    p = Path(source)
    name = p.name[: -len(".onnx")] if p.name.endswith(".onnx") else p.name
    return p.with_name(name + ".opt.onnx")


def _rule_files(rules: Sequence[str | os.PathLike]) -> list[Path]:
    """The files ``--rules`` reads (a folder's entries, not its subfolders), for the output checks."""
    out: list[Path] = []
    for r in rules:
        p = Path(r)
        try:
            out.extend(sorted(q for q in p.iterdir() if not q.is_dir()) if p.is_dir() else [p])
        except OSError:
            out.append(p)
    return out


def planned_outputs(source: str | os.PathLike, output: str | os.PathLike | None,
                    report_path: str | os.PathLike | None = None) -> list[Output]:
    """Every path ``optimize_file`` may write: the model, its external-data file and the report."""
    out = Path(output) if output is not None else default_output_path(source)
    planned = [Output(out, "-o"), Output(data_file_for(out), "external data file", maybe=True)]
    if report_path is not None:
        planned.append(Output(Path(report_path), "--report"))
    return planned


def optimize_file(
    source: str | os.PathLike,
    output: str | os.PathLike | None = None,
    *,
    verify: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
    shapes: dict[str, list[int]] | None = None,
    write: bool = True,
    progress: Progress | None = None,
    precision: str = "fp32",
    io_fp16: bool = False,
    keep_fp32: Sequence[str] = (),
    report_path: str | os.PathLike | None = None,
    force: bool = False,
    **options: Any,
) -> tuple[onnx.ModelProto, OptimizeReport]:
    """Optimize the model at ``source`` and (unless ``write`` is False) write it to ``output``, and the
    JSON report to ``report_path`` if given.

    Every output path is checked against every input (the model, its data files, the rule files) and
    against the others before any work (``graphopt.files.check_outputs``); the files are then written
    together: all of them or none. With ``verify``, the original and optimized models run under
    onnxruntime on random inputs first; on a mismatch ``VerificationFailed`` is raised and nothing is
    written."""
    start = time.perf_counter()
    source = Path(source)
    step = progress or (lambda msg: None)
    check_tolerances(rtol, atol)  # a bad value is a usage error with or without --verify
    outputs = planned_outputs(source, output, report_path) if write else []
    reads = [source, *_rule_files(options.get("rules") or ())]
    check_outputs(outputs, reads, force=force)
    _check_options_first(options)
    step("loading")
    with InferAhead() as ahead:  # the input's shape inference runs beside from_model (graphopt.ir.ahead)
        graph = load_model(source, lazy_above=WEIGHTLESS_ABOVE, ahead=ahead)  # big weights stay in their files
        check_shape_overrides(graph.source_model if graph.source_model is not None else to_model(graph), shapes)
        protect = [source] + graph.data_files
        check_outputs(outputs, reads + graph.data_files, force=force)
        if verify:
            input_sizes(graph.source_model, shapes)  # what --verify will allocate, refused before any work
        original_model, graph = _with_inferred_shapes(graph, ahead)
    report = OptimizeReport(source=str(source))
    if precision != "fp32":
        step("converting to fp16")
        graph = _converted(original_model, graph, precision, io_fp16, keep_fp32, str(source), report)
    graph.source_path = str(source)
    optimize_graph(graph, shapes=shapes, progress=progress, report=report, **options)
    model = finalize_model(graph)
    del graph  # the IR's copy of the weights is not needed any more (peak memory on large models);
    # one encoding of the result serves the size check, onnx.checker and the file (None: a large model)
    data = small_bytes(model, WEIGHTLESS_ABOVE)
    if data is None:  # the IR holds reference cycles (parents, networkx): only the cycle collector
        gc.collect()  # frees it; worth its 0.2 s (on 20k nodes) only when the weights are big
    note = check_output_model(model, full=True, original=original_model, source=str(source),
                              rules=options.get("rules") or (), serialized=data)
    if verify:
        step("verifying with onnxruntime")
        _verify_or_raise(model, original_model, report, str(source), shapes, rtol, atol)
        if note:
            report.verify["checker_note"] = note
    if write:
        out = outputs[0].path
        step(f"writing {out}")
        with Staged() as staged:
            save_model(model, out, protect=protect, staged=staged, serialized=data)
            report.output = str(out)
            report.seconds = time.perf_counter() - start
            if report_path is not None:
                staged.add(Path(report_path), [report.to_json().encode() + b"\n"])
            staged.commit()
    report.seconds = time.perf_counter() - start
    return model, report


def optimize_model(
    model: onnx.ModelProto,
    *,
    verify: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
    shapes: dict[str, list[int]] | None = None,
    base_dir: str | os.PathLike | None = None,
    precision: str = "fp32",
    io_fp16: bool = False,
    keep_fp32: Sequence[str] = (),
    **options: Any,
) -> tuple[onnx.ModelProto, OptimizeReport]:
    start = time.perf_counter()
    _check_options_first(options)
    check_shape_overrides(model, shapes)
    original_model, graph = _with_inferred_shapes(load_model(model, base_dir=base_dir))
    report = OptimizeReport(source="<model>")
    if precision != "fp32":
        graph = _converted(original_model, graph, precision, io_fp16, keep_fp32, "<model>", report)
    optimize_graph(graph, shapes=shapes, report=report, **options)
    out = finalize_model(graph)
    note = check_output_model(out, full=True, original=original_model, rules=options.get("rules") or ())
    if verify:
        _verify_or_raise(out, original_model, report, "<model>", shapes, rtol, atol)
        if note:
            report.verify["checker_note"] = note
    report.seconds = time.perf_counter() - start
    return out, report
