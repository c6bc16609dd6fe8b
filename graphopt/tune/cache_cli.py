"""``graphopt cache show|clear|export FILE|import FILE``: the tuning cache from the command line;
``graphopt cache kernels``: every own kernel compiled into the kernel cache.

This module only defines the click group ``cache``; ``graphopt/cli.py`` mounts it. A
``graphopt.errors.GraphoptError`` (one line) is printed as ``graphopt: error: ...`` and the command
exits with that error's code, as everywhere in the CLI. Cache warnings (a file moved aside, entries ignored) are printed to stderr as
``graphopt: warning: ...``.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import click

from graphopt.errors import GraphoptError, TuningError
from graphopt.tune.cache import TuningCache
from graphopt.tune.cache_file import CACHE_FILE, default_cache_dir
from graphopt.tune.gpus import normalize_gpu_name


def _open(ctx: click.Context) -> TuningCache:
    folder = ctx.obj.get("cache_dir") if ctx.obj else None
    path = (Path(folder) if folder else default_cache_dir()) / CACHE_FILE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # printed below, once, in our own format
        cache = TuningCache(path, warn=False)
    for msg in cache.messages:
        click.echo(f"graphopt: warning: {msg}", err=True)
    return cache


def _gpu(name: str | None) -> str | None:
    if not name:
        return None
    norm = normalize_gpu_name(name)
    if norm in ("auto", "none"):
        raise click.BadParameter("give a GPU name such as a100 or h200", param_hint="--gpu")
    return norm


class _OneLineErrors(click.Group):
    """Prints a ``GraphoptError`` from any subcommand as ``graphopt: error: ...`` and exits with its code
    (the main CLI's contract), also when this group is used on its own."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except GraphoptError as exc:
            click.echo(f"graphopt: error: {exc}", err=True)
            ctx.exit(exc.exit_code)


@click.group("cache", cls=_OneLineErrors)
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Cache folder (default: $GRAPHOPT_CACHE_DIR, else $XDG_CACHE_HOME/graphopt, else ~/.cache/graphopt).")
@click.pass_context
def cache(ctx: click.Context, cache_dir: Path | None) -> None:
    """Show, clear, export or import the tuning cache (the per-GPU timings of every lowering); fill the kernel cache."""
    ctx.ensure_object(dict)
    ctx.obj["cache_dir"] = cache_dir


@cache.command("show")
@click.option("--gpu", default=None, help="Only this GPU (any spelling: a100, 'NVIDIA H200', ...).")
@click.option("--entries", is_flag=True, help="List every timing, not just the totals per device.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def show(ctx: click.Context, gpu: str | None, entries: bool, as_json: bool) -> None:
    """Where the cache is, and how many timings it holds per GPU and software version."""
    gpu = _gpu(gpu)
    with _open(ctx) as c:
        stats = [s for s in c.stats() if gpu is None or s["gpu"] == gpu]
        records = c.entries(gpu) if entries else []
        path = c.path
    if as_json:
        doc = {"path": str(path), "devices": stats}
        if entries:
            doc["entries"] = [r.to_json() for r in records]
        click.echo(json.dumps(doc, indent=1, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True, markup=False)  # GPU names and signatures are never markup
    total = sum(s["entries"] for s in stats)
    console.print(f"tuning cache: {path} ({total} timing{'s' if total != 1 else ''})", highlight=False)
    if not stats:
        return
    table = Table("gpu", "sm", "driver", "CUDA", "CuPy", "timings", "signatures", "failures", "imported")
    for s in stats:
        table.add_row(s["gpu"], s["compute_capability"], s["driver"], s["cuda"], s["cupy"], str(s["entries"]),
                      str(s["signatures"]), str(s["failures"]), str(s["imported"]))
    console.print(table)
    if entries:
        t2 = Table("gpu", "signature", "candidate", "ms", "status", "reason")
        for r in records:
            t2.add_row(r.gpu, r.signature, r.candidate, f"{r.ms:.4g}" if math.isfinite(r.ms) else "inf", r.status, r.reason)
        console.print(t2)


@cache.command("clear")
@click.option("--gpu", default=None, help="Only this GPU's timings.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def clear(ctx: click.Context, gpu: str | None, yes: bool) -> None:
    """Delete the cached timings (all, or one GPU's)."""
    gpu = _gpu(gpu)
    what = f"the {gpu} timings" if gpu else "all timings"
    if not yes:
        click.confirm(f"Delete {what} from the tuning cache?", abort=True)
    with _open(ctx) as c:
        n = c.clear(gpu)
        click.echo(f"deleted {n} timing{'s' if n != 1 else ''} from {c.path}")


@cache.command("export")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--gpu", default=None, help="Only this GPU's timings.")
@click.pass_context
def export(ctx: click.Context, file: Path, gpu: str | None) -> None:
    """Write the cache (or one GPU's part) to FILE as JSON, for `graphopt cache import` elsewhere."""
    gpu = _gpu(gpu)
    with _open(ctx) as c:
        n = c.export(file, gpu)
    click.echo(f"exported {n} timing{'s' if n != 1 else ''} to {file}")


@cache.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def import_(ctx: click.Context, file: Path) -> None:
    """Add the timings in FILE (a `graphopt cache export`); they serve `--gpu NAME` where NAME is absent."""
    with _open(ctx) as c:
        n = c.import_(file)
        gpus = sorted({r["gpu"] for r in c.stats()})
    click.echo(f"imported {n} timing{'s' if n != 1 else ''} from {file} (the cache now has timings for {', '.join(gpus) or 'no GPU'})")


@cache.command("kernels")
@click.option("--arch", default=None, metavar="sm_XY",
              help="Target GPU architecture: sm_80 (A100), sm_86, sm_89 (L4, L40), sm_90 (H100, H200), ...; default: this machine's GPU.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Parallel compiles (default: one a CPU).")
def kernels(arch: str | None, workers: int | None) -> None:
    """Compile every graphopt CUDA kernel for a GPU into the kernel cache, no GPU needed (NVRTC only).

    The cache is $GRAPHOPT_KERNEL_CACHE, else $XDG_CACHE_HOME/graphopt/cubin, else ~/.cache/graphopt/cubin
    (the group's --cache-dir is the tuning cache's, not this one).
    A GPU machine that finds them there (built in its image, or copied) skips minutes of compiling on the
    first `graphopt optimize`. A cubin is keyed by the NVRTC major.minor: compile with the one the GPU
    machine will have."""
    import re
    import time

    from graphopt.kernels.registry import all_kernel_instances
    from graphopt.kernels.source import cached_in, compile_to_cache, cubin_cache_dir, device_arch, nvrtc_version

    if arch is None:
        try:
            arch = device_arch()
        except Exception:  # noqa: BLE001 - no CuPy, driver or GPU: the user names the target
            raise click.UsageError("no GPU here to take the architecture from: give --arch, e.g. --arch sm_90") from None
    if not re.fullmatch(r"sm_\d{2,3}a?", arch):
        raise click.BadParameter(f"{arch!r} is not an architecture such as sm_80 or sm_90", param_hint="--arch")
    ver = nvrtc_version()
    if ver == "?":
        raise TuningError("NVRTC is not available: pip install 'graphopt[nvrtc]' (cupy-cuda13x and nvidia-cuda-nvrtc)")
    jobs = list(dict.fromkeys(all_kernel_instances()))
    todo = [job for job, have in zip(jobs, cached_in(jobs, arch)) if not have]
    folder = cubin_cache_dir()
    click.echo(f"kernel cache {folder}: {len(jobs)} kernel instances for {arch} (NVRTC {ver}), {len(jobs) - len(todo)} already there")
    t0 = time.perf_counter()
    errors: dict = {}
    if todo:
        from graphopt.tune.progress import node_progress

        with node_progress(len(todo), description=f"compiling for {arch}") as advance:  # stderr, when a terminal
            errors = compile_to_cache(todo, arch, workers, progress=lambda: advance(""))
    click.echo(f"compiled {len(todo) - len(errors)} in {time.perf_counter() - t0:.0f} s")
    unsaved = [job for job, have in zip(todo, cached_in(todo, arch)) if not have and job not in errors]
    if unsaved:  # the compile keeps going without a writable cache (it only costs a recompile there)
        raise TuningError(f"{len(unsaved)} compiled kernel(s) could not be written to {folder}: make it writable "
                          "or point GRAPHOPT_KERNEL_CACHE at a folder that is")
    if errors:
        (src, expr), why = next(iter(errors.items()))
        raise TuningError(f"{len(errors)} kernel instance(s) failed to compile for {arch}, the first: {src} {expr}: {why}")


__all__ = ["cache"]
