"""The ``graphopt`` command line (click). Thin: parsing, printing, exit codes; the work is elsewhere.

Every user error is a ``GraphoptError``: it is printed as one line, ``graphopt: error: ...``, and the
process exits with that error's code (listed in ``graphopt --help``). Tracebacks are shown only for
internal errors, and only with ``GRAPHOPT_DEBUG=1``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections import Counter
from pathlib import Path

import click
from rich.text import Text

from graphopt import __version__
from graphopt.cli_display import WholeHelpGroup
from graphopt.errors import EXIT_CODES, GraphoptError, UsageError
from graphopt.files import Terminated, terminate_cleanly

_EXIT_HELP = "\b\nExit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in sorted(EXIT_CODES.items()))
_GPU_HELP = (
    "Target GPU: 'auto' (the device present, if any), 'none', or a name such as a100, h100, h200, l4, l40s, "
    "rtx4090. Without that GPU present, imported tuning-cache entries for it are used, else a documented "
    "heuristic, and graphopt says that nothing was profiled."
)


def _console(stderr: bool = False):
    """Every print goes through this console. ``markup=False``: user text (a model path, a node or rule
    name such as ``x[/]``) is never read as rich markup; styles are given with ``rich.text.Text``."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True, markup=False)


class _Progress:
    """One-line progress on stderr, shown only on a terminal and unless --quiet."""

    def __init__(self, quiet: bool):
        self.enabled = not quiet and sys.stderr.isatty()
        self._status = None

    def __enter__(self):
        if self.enabled:
            self._status = _console(stderr=True).status("graphopt")
            self._status.__enter__()
        return self

    def __call__(self, message: str) -> None:
        if self._status is not None:
            self._status.update(f"graphopt: {message}")

    def __exit__(self, *exc):
        if self._status is not None:
            self._status.__exit__(*exc)


def _run(fn):
    """Map GraphoptError to its exit code with a one-line message; never a traceback for user errors."""
    try:
        with terminate_cleanly():
            return fn()
    except GraphoptError as e:
        click.echo(f"graphopt: error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("graphopt: interrupted; nothing was written", err=True)
        sys.exit(130)
    except Terminated:
        click.echo("graphopt: terminated; nothing was written", err=True)
        sys.exit(143)
    except click.exceptions.Exit:
        raise
    except Exception as e:  # a bug: say so plainly, keep the traceback behind GRAPHOPT_DEBUG
        if os.environ.get("GRAPHOPT_DEBUG"):
            raise
        first = str(e).splitlines()[0] if str(e) else ""
        click.echo(
            f"graphopt: internal error: {type(e).__name__}: {first[:300]} (a bug in graphopt; rerun with GRAPHOPT_DEBUG=1 "
            "for the traceback and report it)",
            err=True,
        )
        sys.exit(1)


@click.group(cls=WholeHelpGroup, epilog=_EXIT_HELP,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="graphopt")
def main() -> None:
    """graphopt: a kernel-tuning graph optimizer for ONNX models."""


# ------------------------------------------------------------------------------------ optimize
@main.command(epilog=_EXIT_HELP)
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Output path (default: MODEL with .opt.onnx).")
@click.option("--gpu", default="auto", show_default=True, help=_GPU_HELP)
@click.option("--rules", "rules", multiple=True, type=click.Path(path_type=Path), help="Extra rule file or folder (repeatable).")
@click.option("--disable", multiple=True, metavar="NAME", help="Turn off a shipped rule by name (repeatable).")
@click.option("--explain", is_flag=True, help="List every match and every near-miss with the reason it did not fire.")
@click.option("--report", "report_path", type=click.Path(path_type=Path), help="Write the full report as JSON.")
@click.option("--verify", is_flag=True, help="Compare original and optimized under onnxruntime; on a mismatch write nothing.")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D1xD2..", help="Concrete input shape for --verify and tuning (repeatable).")
@click.option("--shape-profile", "shape_profiles", multiple=True, metavar="NAME=DIM:V1,V2..",
              help="Tune each value of symbolic dim DIM of input NAME separately, e.g. x=batch:1,8,32 (repeatable; "
                   "several dims combine as their product). Nodes record the choice per bucket in 'lowering_buckets'; "
                   "'lowering' is the largest bucket's. Without it, tuning uses --shape or the defaults "
                   "(batch-like dims 1, dims named *seq* 128) and says which.")
@click.option("--tune-budget", "tune_budget", type=float, default=None, metavar="SECONDS",
              help="Stop profiling after SECONDS; candidates not reached are skipped and the run is reported as "
                   "cut short (mode 'partial', metadata graphopt.tuning_cut_short), never as tuned.")
@click.option("--rtol", type=float, default=None, help="Relative tolerance for --verify (default 1e-4; 1e-2 for fp16/bf16 models).")
@click.option("--atol", type=float, default=None, help="Absolute tolerance for --verify (default 1e-5; 1e-2 for fp16/bf16 models).")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="fp16: convert the model to fp16 first (onnxconverter-common); fusions and tuning then run at fp16.")
@click.option("--io-fp16", is_flag=True, help="With --precision fp16: fp16 graph inputs and outputs too (default: they keep their dtypes).")
@click.option("--keep-fp32", "keep_fp32", default="", metavar="OP,...", help="With --precision fp16: op types kept at fp32 (e.g. Softmax,ReduceMean).")
@click.option("--ops", "ops_table", is_flag=True, help="Also print each op type's count before and after.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@click.option("--force", is_flag=True, help="Replace an existing output (-o, --report) even when it is read-only.")
def optimize(model, output, gpu, rules, disable, explain, report_path, verify, shapes, shape_profiles, tune_budget,
             rtol, atol, precision, io_fp16, keep_fp32, ops_table, quiet, force):
    """Optimize MODEL: cleanup, fusion rules, lowering selection; write MODEL.opt.onnx."""

    def work():
        from graphopt.pipeline import optimize_file
        from graphopt.compare import parse_shape_overrides
        from graphopt.tune.buckets import parse_shape_profiles

        if tune_budget is not None and not 0 < tune_budget < float("inf"):
            raise UsageError(f"--tune-budget {tune_budget:g}: expected a positive number of seconds")
        shape_map = parse_shape_overrides(shapes)
        profile = parse_shape_profiles(shape_profiles)  # syntax errors before the model is read
        from graphopt.precision import parse_keep_fp32

        keep = parse_keep_fp32(keep_fp32)
        if (io_fp16 or keep) and precision != "fp16":
            raise UsageError("--io-fp16 and --keep-fp32 go with --precision fp16")
        with _Progress(quiet) as progress:
            _, report = optimize_file(
                model,
                output,
                gpu=gpu,
                rules=list(rules),
                disable=list(disable),
                explain=explain,
                verify=verify,
                shapes=shape_map,
                shape_profile=profile,
                tune_budget=tune_budget,
                rtol=rtol,  # None: the default for the model's dtypes (fp16's after --precision fp16)
                atol=atol,
                progress=progress,
                precision=precision,
                io_fp16=io_fp16,
                keep_fp32=keep,
                report_path=report_path,
                force=force,
            )
        if not quiet:
            _print_summary(report, explain, ops_table)

    _run(work)


def _print_summary(report, explain: bool, ops: bool = False) -> None:
    from graphopt.cli_display import ops_table, print_whole, summary_table, tuned_at_line

    con = _console()
    if explain:
        _print_explain(con, report)
    print_whole(con, summary_table(report))
    if ops:
        con.print(ops_table(report))
    if report.buckets:
        _print_buckets(con, report)
    if report.selection_summary:
        con.print(report.selection_summary)
    if tuned_at_line(report):
        con.print(tuned_at_line(report))
    for message in report.messages:
        click.echo(f"graphopt: warning: {message}", err=True)


def _print_buckets(con, report) -> None:
    """One row per node and bucket: what --shape-profile tuned."""
    from rich.table import Table

    names = list(report.buckets[0])
    t = Table(title="lowering per bucket", show_header=True, header_style="bold")
    for col in ("node", "op", *names, "lowering", "params", "mode"):
        t.add_column(col, justify="right" if col in names else "left", overflow="fold")
    for row in report.lowerings:
        dims = row.get("dims") or {}
        t.add_row(row["node"], row["op"], *(str(dims.get(n, "")) for n in names),
                  row["lowering"], row["params"] or "-", row["mode"])
    con.print(t)


def _print_explain(con, report) -> None:
    con.print(Text(f"matches ({len(report.matches)})", style="bold"))
    for m in report.matches:
        sources = m.get("sources") or []
        con.print(f"  {m.get('rule')}: {m.get('node')} <- {', '.join(map(str, sources))}")
    con.print(Text(f"near-misses ({len(report.near_misses)})", style="bold"))
    for m in report.near_misses:
        con.print(f"  {m.get('rule')} at {m.get('anchor', m.get('node', ''))!r}: {m.get('reason')}")

    con.print(Text(f"unfused Conv/Gemm/MatMul -> activation ({len(report.unfused)})", style="bold"))
    for u in report.unfused:
        con.print(Text(f"  {u['chain']} at {u['node']!r} -> {u['activation']!r}: {u['reason']}"))
    _print_conversions(con, report)


def _print_conversions(con, report) -> None:
    """The layout conversions left in the plan (graphopt.tune.layout_choice), estimated."""
    if not report.layout_summary:
        return
    con.print(Text(report.layout_summary, style="bold"))
    for c in report.layout_conversions:
        bucket = ", ".join(f"{k}={v}" for k, v in (c.get("dims") or {}).items())
        src = c["producer"] or "graph input"
        dst = c["consumer"] or "graph output"
        con.print(Text(f"  {c['tensor']!r}: {src} -> {dst}, {c['from']} -> {c['to']}, ~{c['ms'] * 1e3:.3g} us"
                       + (f" [{bucket}]" if bucket else "")))


# ------------------------------------------------------------------------------------ inspect
@main.command(epilog=_EXIT_HELP)
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--rules", "rules", multiple=True, type=click.Path(path_type=Path), help="Extra rule file or folder.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def inspect(model, rules, as_json):
    """Op histogram, opsets, inputs/outputs with shapes, and which rules would fire."""

    def work():
        from graphopt.ir import load_model
        from graphopt.passes import run_cleanup
        from graphopt.rewrite import find_matches, load_rules

        graph = load_model(model)
        hist = Counter(n.qualified_op for _, n in graph.walk())
        io = {
            "inputs": {t: _shape_str(graph, t) for t in graph.inputs if not graph.is_initializer(t)},
            "outputs": {t: _shape_str(graph, t) for t in graph.outputs},
        }
        ruleset = load_rules(shipped=True, paths=[str(r) for r in rules])
        # as optimize does, cleanup runs first (on a copy) so rules see BatchNorm folded into Conv
        would_fire = Counter(m.rule for m in find_matches(graph, ruleset, prepare=run_cleanup))
        info = {
            "model": str(model),
            "ir_version": graph.ir_version,
            "opsets": dict(sorted(graph.opset.items())),
            "producer": f"{graph.producer_name} {graph.producer_version}".strip(),
            "nodes": sum(hist.values()),
            "ops": dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))),
            **io,
            "rules_that_would_fire": dict(sorted((k, v) for k, v in would_fire.items() if v)),
        }
        if as_json:
            click.echo(json.dumps(info, indent=2))
            return
        from rich.table import Table

        from graphopt.cli_display import opsets_text, print_whole

        con = _console()
        con.print(Text(str(model), style="bold") + f": ir_version {info['ir_version']}, opsets {opsets_text(info['opsets'])}, "
                  f"{info['nodes']} nodes, producer {info['producer'] or '-'}")
        for kind in ("inputs", "outputs"):
            t = Table(title=kind)
            t.add_column("name", no_wrap=True)
            t.add_column("type / shape", no_wrap=True)
            for name, s in info[kind].items():
                t.add_row(Text(name), Text(s))
            print_whole(con, t)
        t = Table(title="ops")
        t.add_column("op")
        t.add_column("count", justify="right")
        for op, c in info["ops"].items():
            t.add_row(op, str(c))
        con.print(t)
        t = Table(title="rules that would fire")
        t.add_column("rule")
        t.add_column("matches", justify="right")
        for r, c in info["rules_that_would_fire"].items():
            t.add_row(str(r), str(c))
        con.print(t)

    _run(work)


def _as_dict(obj):
    from graphopt.pipeline import _as_dict as impl

    return impl(obj)


def _shape_str(graph, tensor: str) -> str:
    import onnx

    from graphopt.cli_display import shape_text

    vi = graph.value_info(tensor)
    return shape_text(onnx.TensorProto.DataType.Name(vi.dtype).lower() if vi.dtype else "?", vi.shape)


# ------------------------------------------------------------------------------------ verify
@main.command(epilog=_EXIT_HELP)
@click.argument("a", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("b", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--device", type=click.Choice(["cpu", "cuda", "numpy"]), default="cpu", show_default=True,
              help="Where A (the candidate) runs: cpu (onnxruntime), cuda (the graphopt runtime), numpy (its CPU testing backend); B, the reference, runs under onnxruntime CPU.")
@click.option("--rtol", type=float, default=None, help="Relative tolerance (default 1e-4, 1e-2 for fp16/bf16 models).")
@click.option("--atol", type=float, default=None, help="Absolute tolerance (default 1e-5, 1e-2 for fp16/bf16 models).")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D1xD2..", help="Concrete input shape (repeatable).")
def verify(a, b, device, rtol, atol, shapes):
    """Compare models A and B on random inputs; per-output max abs/rel error; exit 9 if they differ."""

    def work():
        from rich.table import Table

        from graphopt.api import verify as run_verify
        from graphopt.errors import VerificationFailed
        from graphopt.compare import parse_shape_overrides

        result = run_verify(a, b, shapes=parse_shape_overrides(shapes), rtol=rtol, atol=atol, device=device)
        t = Table(title=f"verify {a} against {b} (rtol {result.rtol:g}, atol {result.atol:g})")
        for col in ("output", "shape", "max abs", "max rel", "ok"):
            t.add_column(col)
        for o in result.outputs:
            t.add_row(o.name, str(o.shape), f"{o.max_abs:.3g}", f"{o.max_rel:.3g}", "yes" if o.ok else f"NO {o.note}")
        _console().print(t)
        for message in result.warnings:
            click.echo(f"graphopt: warning: {message}", err=True)
        if not result.ok:
            w = result.worst()
            raise VerificationFailed(f"{a} and {b} differ at output {w.name!r} (max abs {w.max_abs:.3g}, max rel {w.max_rel:.3g})")

    _run(work)


# ------------------------------------------------------------------------------------ rules
@main.group(cls=WholeHelpGroup)
def rules():
    """List and check fusion rules."""


@rules.command("list")
@click.option("--rules", "extra", multiple=True, type=click.Path(path_type=Path), help="Extra rule file or folder.")
def rules_list(extra):
    """List the shipped (and extra) rules with their doc lines."""

    def work():
        from rich.table import Table

        from graphopt.rewrite import load_rules

        ruleset = load_rules(shipped=True, paths=[str(p) for p in extra])
        from graphopt.cli_display import print_whole

        t = Table(title="fusion rules")
        t.add_column("name", no_wrap=True)  # the names --disable takes: never cut
        t.add_column("file", no_wrap=True)
        t.add_column("doc", min_width=20)
        for r in ruleset.rules:
            t.add_row(Text(r.name), Text(Path(str(getattr(r, "source", "") or "")).name), Text(getattr(r, "doc", "")))
        print_whole(_console(), t, fold=True)

    _run(work)


@rules.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
def rules_check(files):
    """Validate rule files; report errors with file, line and rule name (exit 10 on errors)."""

    def work():
        from graphopt.errors import RuleError
        from graphopt.rewrite import check_rule_file

        problems = []
        for f in files:
            problems.extend(check_rule_file(f))
        for p in problems:
            d = _as_dict(p)
            click.echo(f"{d.get('file')}:{d.get('line')}: rule {d.get('rule') or '-'}: {d.get('message')}", err=True)
        if problems:
            raise RuleError(f"{len(problems)} problem(s) in {', '.join(map(str, files))}")
        click.echo(f"ok: {', '.join(map(str, files))}")

    _run(work)


def _mount_optional_groups() -> None:
    try:
        from graphopt.tune.cache_cli import cache
    except ImportError:  # the tuning cache CLI lands with graphopt.tune
        return
    main.add_command(cache)


_mount_optional_groups()
__import__("graphopt.cli_runtime").cli_runtime.register(main, _run, _console)  # graphopt run / bench

#: Allocations between young-generation collections while a command runs (CPython's default is 700).
GC_THRESHOLD = 50_000


def entry() -> None:
    """The ``graphopt`` console script and ``python -m graphopt.cli``: ``main`` in a process of its own.

    Why the collector is tuned here: building and rewriting a 20k-node graph allocates millions of
    objects, and CPython's default thresholds collected 600 times and spent 0.45 s of a 3.5 s optimize
    scanning them (mostly live objects), then 0.18 s more in the last collection at exit
    (bench/NOTES_optimizer.md). What was imported lives to the end (frozen: never scanned again);
    garbage cycles are still collected, less often (peak memory did not change); at exit the OS takes the
    memory back. Only for the process's own entry point: ``main`` called in-process (tests, a host
    program) leaves the host's collector alone."""
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)
    try:
        main()
    finally:
        gc.freeze()  # no last collection of the graph at exit


if __name__ == "__main__":  # pragma: no cover
    entry()
