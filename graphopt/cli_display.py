"""What the CLI prints: the optimize summary, the per-op before/after table, inspect's rows, the
command list of ``--help``.

Rich tables built from the report; nothing here does work. User text (paths, node, op and rule names)
goes in as ``rich.text.Text``, so it is never read as markup whatever the console's setting. Paths and names are never cut: their
columns do not wrap or shorten, and a narrow terminal folds the free text (doc lines) instead.
"""

from __future__ import annotations

import re

import click
from rich.table import Table
from rich.text import Text


class WholeHelpGroup(click.Group):
    """A click group whose ``--help`` lists each command's description whole (click cuts it at ~45 columns)."""

    def format_commands(self, ctx, formatter):
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.short_help or first_paragraph(cmd.help or "")))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def print_whole(con, renderable, fold: bool = False) -> None:
    """Print a table so that no no-wrap column (a path, a rule name) is cut: the console is widened to
    the table's full width when it is narrower (a pipe counts as 80 columns). ``fold``: to the width
    at which only the wrapping columns (free text) fold."""
    from rich.measure import Measurement

    m = Measurement.get(con, con.options.update_width(10**5), renderable)
    need = m.minimum if fold else m.maximum
    width = con.width
    con.width = max(width, need)
    try:
        con.print(renderable)
    finally:
        con.width = width


def summary_table(report) -> Table:
    """Node counts that add up (before -> cleanup -> fusion rules -> after), what each step did,
    the target, verify and the output path."""
    table = Table(title=Text(f"graphopt optimize: {report.source}"), show_header=True, header_style="bold")
    table.add_column("what", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    after_cleanup = report.nodes_after_cleanup or report.nodes_before
    table.add_row("nodes before", str(report.nodes_before))
    table.add_row("cleanup: nodes removed", str(report.nodes_before - after_cleanup))
    for name, count in report.cleanup.items():
        what = "nodes and initializers removed" if name == "dead_code" else "changes"
        table.add_row(f"  {name} ({what})", str(count))
    table.add_row("fusion rules: nodes removed", str(after_cleanup - report.nodes_after))
    for name, count in report.rewrites.items():
        table.add_row(f"  rule {name} (matches)", str(count))
    table.add_row("nodes after", str(report.nodes_after))
    for name, count in report.custom_ops.items():
        table.add_row(f"custom op graphopt.{name} (nodes)", str(count))
    table.add_row("target / mode", target_mode(report))
    if report.precision != "fp32":
        table.add_row("precision", report.precision)
    if report.verify is not None:
        worst = max((o["max_rel"] for o in report.verify["outputs"]), default=0.0)
        table.add_row("verify (max rel err)", f"ok ({worst:.2e})")
    table.add_row("time", f"{report.seconds:.2f} s")
    if report.tuning_time.get("candidates_run"):
        table.add_row("  of which profiling", tuning_time_line(report.tuning_time))
    if report.output is not None:
        table.add_row("output", Text(str(report.output)))
    return table


def tuning_time_line(tt: dict) -> str:
    """``412 candidates: build 90.1 s, time 40.2 s, check 12.0 s, ...`` (the largest phases first, summed
    over workers), then the profiling's wall time and its slowest signature."""
    phases = sorted(tt.get("phases_s", {}).items(), key=lambda kv: -kv[1])
    line = f"{tt['candidates_run']} candidates: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases if v >= 0.05)
    slow = tt.get("slowest_signatures")
    if slow:
        which = " ".join(x for x in (slow[0]["op"], slow[0].get("shape", "")) if x)
        line += (f"; {tt['profile_wall_s']:.1f} s wall, the slowest signature {slow[0]['seconds']:.1f} s "
                 f"({which}, {slow[0]['candidates']} candidates)")
    return line


def target_mode(report) -> str:
    """``--gpu none`` records the heuristic's lowerings without a target: say that, once."""
    if report.target == "none":
        return "none / heuristic" if report.lowerings else "none / -"
    return f"{report.target} / {report.mode}"


def tuned_at_line(report) -> str:
    """``tuned at: 'batch'=1 (default ...)`` for the graph inputs' symbolic dims only, and only when a
    lowering was chosen for a target (never with ``--gpu none``)."""
    from graphopt.tune.select import dims_line

    if report.target == "none" or not report.lowerings:
        return ""
    wanted = set(report.input_dims)
    return dims_line({d: v for d, v in report.tuning_dims.items() if d in wanted})


def ops_table(report) -> Table:
    """Op type -> count before and after, as onnxsim and onnxslim print (``optimize --ops``)."""
    t = Table(title="ops before / after", show_header=True, header_style="bold")
    t.add_column("op", no_wrap=True)
    t.add_column("before", justify="right")
    t.add_column("after", justify="right")
    t.add_column("change", justify="right")
    ops = sorted(set(report.ops_before) | set(report.ops_after),
                 key=lambda op: (-report.ops_before.get(op, 0), -report.ops_after.get(op, 0), op))
    for op in ops:
        b, a = report.ops_before.get(op, 0), report.ops_after.get(op, 0)
        t.add_row(Text(op), str(b), str(a), "" if a == b else f"{a - b:+d}")
    t.add_row("total", str(sum(report.ops_before.values())), str(sum(report.ops_after.values())),
              f"{sum(report.ops_after.values()) - sum(report.ops_before.values()):+d}", style="bold")
    return t


def shape_text(dtype: str, shape) -> str:
    """``float [batch, 3, 32, 32]``; ``?`` for an unknown dim, ``float [?]`` for an unknown rank."""
    dims = "?" if shape is None else ", ".join("?" if d is None or d == "" else str(d) for d in shape)
    return f"{dtype} [{dims}]"


def opsets_text(opsets: dict) -> str:
    """``ai.onnx 17, com.microsoft 1``."""
    return ", ".join(f"{domain or 'ai.onnx'} {version}" for domain, version in sorted(opsets.items())) or "-"


def first_paragraph(text: str) -> str:
    """A command's description for the command list: its docstring's first paragraph, on one line."""
    return " ".join(re.split(r"\n\s*\n", text.strip(), maxsplit=1)[0].split())
