"""``graphopt run`` and ``graphopt bench``: the runtime's commands (``verify --device`` is in cli.py).

Registered into the click group by :func:`register` (one line in cli.py), which hands over cli.py's
error mapping so the exit codes and one-line errors are the same as every other command's.
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from graphopt.errors import InputNotFound, UsageError, WriteFailed

_guard = None  # cli._run: GraphoptError -> one line on stderr + its exit code
_console = None

DEVICE_HELP = ("auto (cuda when a GPU and CuPy are present, else cpu), cuda (the graphopt runtime on the GPU), "
               "cpu (onnxruntime), numpy (the runtime's executor on NumPy: a testing aid)")


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    from graphopt.runtime.session import cuda_available

    return "cuda" if cuda_available() else "cpu"


def _parse_inputs(items) -> dict[str, np.ndarray]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input {item!r}: expected NAME=FILE.npy, for example --input x=image.npy")
        if name in out:
            raise UsageError(f"--input {name}: given twice; give each input once")
        p = Path(path)
        if not p.is_file():
            raise InputNotFound(f"--input {name}: {p} does not exist")
        try:
            out[name] = np.load(p, allow_pickle=False)
        except Exception as e:  # noqa: BLE001 - numpy raises ValueError / OSError / EOFError for bad files
            raise UsageError(f"--input {name}: {p} is not a readable .npy file ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:120] if str(e) else ''}); save it with numpy.save") from None
    return out


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "output"


def write_npys(out_dir: Path, arrays: dict[str, np.ndarray]) -> list[Path]:
    """Write every output as ``<name>.npy``: all to temp files first, then renamed, so either every
    file is written or none is (no partial file is ever left; graphopt.files.Staged)."""
    import io

    from graphopt.files import Staged

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteFailed(f"{out_dir}: cannot write the outputs ({e.strerror or e}); nothing was written") from None
    written = []
    with Staged() as staged:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            dest = out_dir / f"{_safe_name(name)}.npy"
            staged.add(dest, [buf.getbuffer()])
            written.append(dest)
        staged.commit()
    return written


def _stats(arr: np.ndarray) -> tuple[str, str, str]:
    if arr.size == 0:
        return "-", "-", "-"
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int64)
    a = arr.astype(np.float64)
    fin = a[np.isfinite(a)]
    if fin.size == 0:
        return "nan/inf", "nan/inf", "nan/inf"
    extra = f" ({a.size - fin.size} non-finite)" if fin.size < a.size else ""
    return f"{fin.min():.6g}", f"{fin.max():.6g}", f"{fin.mean():.6g}{extra}"


@click.command("run")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="An input from a .npy file (repeatable); the others are random.")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D1xD2..", help="Shape of a random input (repeatable).")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), help="Write every output as NAME.npy here.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu", "numpy"]), default="auto", show_default=True, help=DEVICE_HELP)
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True, help="Compute precision (fp16: cuda/numpy).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the random inputs.")
def run_cmd(model, inputs, shapes, output_dir, device, dtype, seed):
    """Run MODEL once and print shape, dtype, min/max/mean of every output."""

    def work():
        from rich.table import Table

        from graphopt.compare import check_given_inputs, check_shape_overrides, make_inputs, parse_shape_overrides
        from graphopt.ir import load_model, to_model
        from graphopt.runtime import Session, to_numpy

        dev = _device(device)
        given = _parse_inputs(inputs)
        shape_map = parse_shape_overrides(shapes)
        graph = load_model(model)
        proto = to_model(graph)
        check_given_inputs(proto, given)
        check_shape_overrides(proto, shape_map)
        sess = Session(model, device=dev, dtype=None if dtype == "fp32" else "float16")
        random_for = [n for n in sess.input_names if n not in given]
        feeds = dict(given)
        if random_for:
            rnd = make_inputs(proto, shape_map, seed=seed)
            feeds.update({n: rnd[n] for n in random_for})
        outs = {k: to_numpy(v) for k, v in sess.run(feeds).items()}
        con = _console()
        if random_for:
            con.print(f"random inputs (seed {seed}): " + ", ".join(f"{n} {list(feeds[n].shape)}" for n in random_for))
        t = Table(title=f"{model} on {dev}" + (" (fp16)" if dtype == "fp16" else ""))
        for col in ("output", "shape", "dtype", "min", "max", "mean"):
            t.add_column(col)
        for name, arr in outs.items():
            t.add_row(name, str(list(arr.shape)), str(arr.dtype), *_stats(arr))
        con.print(t)
        if output_dir is not None:
            written = write_npys(output_dir, outs)
            con.print(f"wrote {len(written)} file(s) to {output_dir}")

    _guard(work)


@click.command("bench")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--optimized", type=click.Path(dir_okay=False, path_type=Path),
              help="The optimized model: used if it exists, else MODEL is optimized (and tuned on a GPU) and written there.")
@click.option("--batch", "batches", multiple=True, type=click.IntRange(min=1), help="Batch size (repeatable; default: the model's own or 1).")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D1xD2..", help="Full shape of an input (repeatable).")
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True, help="Runtime compute precision.")
@click.option("--device", type=click.Choice(["auto", "cuda", "numpy"]), default="auto", show_default=True,
              help="Where the graphopt runtime runs (auto: cuda if present, else numpy).")
@click.option("--repeats", type=click.IntRange(min=1), default=20, show_default=True, help="Timed runs per row.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Untimed runs per row first.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=20.0, show_default=True, help="Seconds at most per row.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Draw latency and the per-op breakdown (needs graphopt[plot]).")
def bench(model, optimized, batches, shapes, dtype, device, repeats, warmup, budget, plot_path):
    """Median/p90 latency and throughput: onnxruntime CPU (on the CPU also on the optimized model), the
    runtime on MODEL, on the optimized model without and with CUDA graphs; then the optimized model's
    top-15 ops."""

    def work():
        import onnx
        from rich.table import Table

        from graphopt import api
        from graphopt.compare import parse_shape_overrides
        from graphopt.ir import load_model, to_model
        from graphopt.runtime import Session
        from graphopt.runtime import bench as rb

        if plot_path is not None:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise UsageError("--plot needs matplotlib, which the 'plot' extra installs: pip install 'graphopt[plot]'") from None
        dev = device if device != "auto" else ("cuda" if _device("auto") == "cuda" else "numpy")
        rt_dtype = None if dtype == "fp32" else "float16"
        shape_map = parse_shape_overrides(shapes)
        src = to_model(load_model(model))
        con = _console()
        con.width = max(con.width, 130)  # the table's labels stay on one line in a pipe too
        if optimized is not None and optimized.exists():
            opt_model = to_model(load_model(optimized))
            con.print(f"optimized model: {optimized}")
        else:
            gpu = "auto" if dev == "cuda" else "none"
            first = bench_batches(src, batches)[0]
            tune_shapes = {k: list(v.shape) for k, v in rb.bench_feeds(src, first, shape_map).items()}
            opt_model, report = api.optimize(model, gpu=gpu, shapes=tune_shapes, output=optimized)
            con.print(f"optimized {model}: {sum(report.rewrites.values())} "
                      f"rewrite(s)" + (f", written to {optimized}" if optimized is not None else ""))
        kw = dict(warmup=warmup, repeats=repeats, budget_s=budget)
        rows: list[rb.Timing] = []
        breakdown = []
        runtime = f"runtime {dev}" + (" (a testing aid)" if dev == "numpy" else "")
        for bs in bench_batches(src, batches):
            feeds = rb.bench_feeds(src, bs, shape_map)
            ort = Session(src, device="cpu")
            rows.append(rb.time_runs("ORT CPU", bs, lambda: ort.run(feeds), **kw))
            if dev != "cuda":  # on the CPU the optimized model's real runtime is onnxruntime
                ort_opt = Session(opt_model, device="cpu")
                rows.append(rb.time_runs("ORT CPU, optimized", bs, lambda: ort_opt.run(feeds), **kw))
            rows.append(rb.time_session(f"{runtime}, unoptimized", Session(src, device=dev, dtype=rt_dtype), feeds, bs, **kw))
            eager = Session(opt_model, device=dev, dtype=rt_dtype, cuda_graphs=False)
            eager_row = rb.time_session(f"{runtime}, optimized, eager", eager, feeds, bs, **kw)
            rows.append(eager_row)
            if dev == "cuda":
                graphs = Session(opt_model, device=dev, dtype=rt_dtype)
                rows.append(rb.time_session("runtime cuda, optimized, CUDA graphs", graphs, feeds, bs, **kw))
                h = rb.host_time.measure(eager, feeds, idle=False)
                con.print(f"bs {bs}: host overhead {h.us_per_step:.1f} us per node over {h.steps} nodes (eager, no CUDA graphs)")
                for b in h.blocking:
                    if b.get("cause") == rb.host_time.QUEUE:
                        left_out = ("left out of the figure above (counted at the median step's host time)"
                                    if h.queue_limited else "in the figure above, which another step's wait keeps")
                        con.print(f"  launch queue full behind the spin at {b['step']}: that wait is device time, {left_out}")
                    else:
                        con.print(f"  [yellow]waits for the GPU every run:[/] {b['step']} ({b['lowering'] or 'standard op'}); "
                                  "the figure above includes that wait")
            else:
                rows.append(rb.Timing("runtime, optimized, CUDA graphs", bs, error="n/a: CUDA graphs need device cuda"))
            breakdown = rb.top_ops(eager.profile(feeds, repeats=3), total_ms=eager_row.median_ms)
            breakdown_batch = bs
        t = Table(title=f"bench {model} ({dtype}, runtime on {dev})")
        for col in ("configuration", "batch", "median ms", "p90 ms", "items/s", "note"):
            t.add_column(col)
        for r in rows:
            if r.error:
                t.add_row(r.label, str(r.batch), "-", "-", "-", r.error)
            else:
                t.add_row(r.label, str(r.batch), f"{r.median_ms:.3f}", f"{r.p90_ms:.3f}", f"{r.throughput:.1f}", r.note)
        con.print(t)
        if dev == "numpy":
            con.print("The numpy runtime is the graphopt runtime's executor on NumPy, a testing aid, not a fast "
                      "path: on the CPU, compare the two ORT CPU rows.")
        ops = Table(title=f"per-op time, optimized model, eager on {dev} (top 15, batch {breakdown_batch}; "
                          "each op's share of the eager median)")
        for col in ("op", "ms per run", "share"):
            ops.add_column(col)
        for op, ms, pct in breakdown:
            ops.add_row(op, f"{ms:.3f}", f"{pct:.1f}%")
        con.print(ops)
        if plot_path is not None:
            rb.plot(plot_path, rows, breakdown, f"{Path(model).name} ({dtype})")
            con.print(f"wrote {plot_path}")
        _ = onnx  # the model objects above are onnx.ModelProto

    _guard(work)


def bench_batches(model, batches) -> list[int]:
    """The requested batch sizes, else the model's fixed first dim (or 1)."""
    if batches:
        if any(b < 1 for b in batches):
            raise UsageError(f"--batch {min(batches)}: batch sizes are at least 1")
        return list(batches)
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name not in inits and vi.type.tensor_type.shape.dim:
            d = vi.type.tensor_type.shape.dim[0]
            return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1]
    return [1]


def register(group, guard, console) -> None:
    """Add ``run`` and ``bench`` to the ``graphopt`` group with cli.py's error mapping and console."""
    global _guard, _console
    _guard, _console = guard, console
    group.add_command(run_cmd)
    group.add_command(bench)
