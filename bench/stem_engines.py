"""Which cuDNN engines run an image stem's convolution, and which kernels torch runs for it (GPU; one JSON + table).

The stem breakdown (``bench/stem_breakdown.py``, H100, 2026-12-07, code 34c2a8f) found ResNet-50's 7x7 / 2 stem
at bs32 fp16 taking 84.5 us as torch channels_last's convolution alone (in a CUDA graph) against 192.4 us for
the best plan cuDNN's frontend heuristics list for the same convolution-only graph (``cudnn_split``'s 19 plans,
heuristics A then the fallback list, graphopt's filter of inexact numerical notes applied). Torch reaches an
engine graphopt is not offered. Two hypotheses, each answered here:

- the engine is in cuDNN's engine list but no heuristic lists it: every engine id of the operation graph
  (``get_engine_count``) is built with its default knobs (``create_execution_plan``), timed and checked;
- the engine is listed but graphopt bars it: torch allows plans with ``REDUCED_PRECISION_REDUCTION`` for fp16
  (``allow_fp16_reduced_precision_reduction``), graphopt's ``INEXACT_NOTES`` did not (since the fifteenth session
  a stem may take them: ``cudnn.barred_notes``). Every plan of heuristics
  A / B / fallback is timed *without* the filter, and marked barred where graphopt's listing lacks it.

For each: device time (the tuner's eager timer, median, as the stem breakdown's torch columns), the max error
against a float32 convolution (TF32 off) relative to the largest reference value, and its name. Torch's own
kernels come from ``torch.profiler``: which cuDNN / cuBLAS kernel torch's conv runs, and its device time.

The first run (H100, code bf317c9) refuted both: torch runs cuDNN's ``image_first_layer`` kernel after cuDNN's
own channel padding, which no listed plan and no engine id with default knobs reaches. So the configuration
torch executes is read from cuDNN's API log in a child process (``bench/cudnn_log.py``: engine id and knob
choices) and built on graphopt's graph with exactly those knobs (``torch_plan``), timed and checked like the
rest; ``--torch-plan-only`` does that part alone.

    python3 bench/stem_engines.py --out DIR [--batch 32] [--only r50.stem] [--budget 200] [--torch-plan-only]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import cudnn_log  # noqa: E402
from lowering_bench import env_header, gpu_tag  # noqa: E402
from stem_breakdown import STEMS, cbr_sig, stem_arguments  # noqa: E402
from stem_engines_report import write as _write  # noqa: E402


def torch_conv(x, w, s, p, warmup: int):
    """torch channels_last's fp16 convolution of stem geometry (cudnn.benchmark on, ``warmup`` calls made, so
    its choice is settled): the call, for profiling or logging."""
    import torch

    torch.backends.cudnn.benchmark = True
    xt = torch.randn(x, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    wt = torch.randn(w, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)

    def call():
        torch.nn.functional.conv2d(xt, wt, stride=s, padding=p)

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    return call


def torch_kernels(x, w, s, p, reps: int) -> dict:
    """torch channels_last's convolution alone (cudnn.benchmark): its kernels and their mean device times."""
    import torch

    call = torch_conv(x, w, s, p, warmup=5)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time", None) or getattr(ev, "cuda_time", 0.0)
        if t and ev.count:
            kernels[ev.key] = {"count": ev.count, "mean_us": round(float(t), 2)}
    return kernels


class Probe:
    """One stem's convolution-only graph on cuDNN's frontend: inputs, a float32 reference, a timer."""

    def __init__(self, mod, handle, x, w, s, p, dtype: str, reps: int):
        import cupy
        import torch

        from graphopt.lowering import layout
        from graphopt.providers import cudnn_split

        self.mod, self.handle, self.reps = mod, handle, reps
        self.sig = cudnn_split.conv_only(cbr_sig(x, w, s, p, "Relu", {}, dtype, bias=False))
        rng = cupy.random.default_rng(0)
        xl = rng.standard_normal(x, dtype=cupy.float32)
        wl = rng.standard_normal(w, dtype=cupy.float32) * 0.1
        with torch.backends.cudnn.flags(allow_tf32=False):
            ref = torch.nn.functional.conv2d(torch.as_tensor(xl, device="cuda"), torch.as_tensor(wl, device="cuda"),
                                             stride=s, padding=p)
        self.ref = cupy.asarray(ref)
        self.scale = float(cupy.abs(self.ref).max())
        self.x = layout.to_layout(xl.astype(dtype), "NHWC", cupy)
        self.w = layout.to_layout(wl.astype(dtype), "NHWC", cupy)  # KRSC: W's NHWC
        self.y = layout.empty(self.ref.shape, dtype, "NHWC", cupy)

    def graph(self, alignment: int | None = None):
        """The convolution-only graph, built; ``alignment``: the byte alignment its X, W and Y declare to cuDNN
        (torch declares its pointers' alignment, up to 32; ``cudnn.declare_alignment``)."""
        from graphopt.providers import cudnn as base

        graph, tensors = base.conv_graph(self.mod, self.handle, self.sig)[:2]
        graph.validate()
        if alignment is not None:
            base.declare_alignment(graph, alignment)  # as torch declares them (refuses where it cannot)
        graph.build_operation_graph()
        return graph, tensors

    def run_plan(self, graph, tensors, index: int) -> dict:
        """Build plan ``index`` of ``graph``, check it (output poisoned first), and time it with the tuner's
        eager timer (``cuda_event_timer``: operands rotated past L2, a spin kernel ahead so the events see
        device time), as ``bench/stem_breakdown.py``'s torch columns are timed."""
        import cupy

        from graphopt.kernels.timing import cuda_event_timer, median
        from graphopt.providers import cudnn as base

        graph.build_plan_at_index(index)
        ws_bytes = int(graph.get_workspace_size_plan_at_index(index))
        ws = cupy.empty(max(1, ws_bytes), dtype=cupy.uint8)
        self.mod.set_stream(handle=self.handle, stream=cupy.cuda.get_current_stream().ptr)

        def launch(ins, outs):
            pack = {tensors["X"]: base._Dl(ins[0]), tensors["W"]: base._Dl(ins[1]), tensors["Y"]: base._Dl(outs[0])}
            graph.execute_plan_at_index(pack, base._Dl(ws), index, handle=self.handle)

        self.y.fill(float("nan"))  # poisoned: a plan that writes nothing fails the check
        launch([self.x, self.w], [self.y])
        err = float(cupy.abs(self.y.astype(cupy.float32) - self.ref).max()) / self.scale
        us = median(cuda_event_timer(launch, [self.x, self.w], [self.y], reps=self.reps)) * 1e3
        return {"us": round(us, 2), "max_rel_err": err if err == err else "nan", "workspace": ws_bytes}


def every_engine(probe: Probe, deadline: float) -> list[dict]:
    """Every engine id of the convolution-only graph with its default knobs: built, timed, checked."""
    graph, _ = probe.graph()
    count = int(graph.get_engine_count())
    out = [{"engine_count": count, "appends": _appends(probe, count)}]
    print(json.dumps(out[0]), flush=True)
    for eid in range(count):
        if time.monotonic() > deadline:
            out.append({"engine": eid, "skipped": "budget"})
            continue
        row = {"engine": eid}
        try:
            g, t = probe.graph()
            g.create_execution_plan(eid, {})
            g.check_support()
            row["name"] = str(g.get_plan_name_at_index(0))
            row.update(probe.run_plan(g, t, 0))
        except Exception as e:  # noqa: BLE001 - an engine that refuses this graph: its reason, one line
            row["refused"] = (str(e).splitlines() or [type(e).__name__])[0][:160]
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def torch_log_child(x, w, s, p) -> None:
    """In a child whose environment turns cuDNN's API log on: torch channels_last's convolution, benchmarked,
    then run nine more times, so the configuration torch chose is the one the log executes most."""
    import torch

    torch_conv(x, w, s, p, warmup=8)()
    torch.cuda.synchronize()


def _logged_child(child_args: list[str], timeout: float) -> dict:
    """Run this script's ``child_args`` in a child with cuDNN's API log on; the configuration it executed most
    (``cudnn_log.chosen_execution``, with every configuration's count), its size and function counts, or ``error``."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "cudnn_api.log")
        env = dict(os.environ, CUDNN_LOGLEVEL_DBG="3", CUDNN_LOGDEST_DBG=log)
        cmd = [sys.executable, os.path.abspath(__file__), *child_args, "--out", tmp]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"child over {timeout:.0f} s"}
        if done.returncode != 0:
            return {"error": f"child exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:200]}"}
        if not os.path.exists(log):
            return {"error": "cuDNN wrote no API log (CUDNN_LOGLEVEL_DBG not honoured by this cuDNN)"}
        with open(log, errors="replace") as f:
            text = f.read()
    out = cudnn_log.chosen_execution(text) or {"error": "no executing call in the log"}
    out["log_bytes"] = len(text)
    out["functions"] = dict(sorted(cudnn_log.functions(text).items(), key=lambda kv: -kv[1])[:12])
    return out


def _child_timeout(deadline: float) -> float:
    """A logged child's limit: two fifths of the stem's time left, at least 15 s."""
    return max(15.0, 0.4 * (deadline - time.monotonic()))


def torch_plan(name: str, batch: int, timeout: float) -> dict:
    """The configuration torch executes for stem ``name``: engine id and knobs (or a legacy algorithm)."""
    return _logged_child(["--torch-log-child", "--only", name, "--batch", str(batch)], timeout)


def graphopt_plan_log(name: str, batch: int, dtype: str, plan: dict, timeout: float) -> dict:
    """The same configuration executed on graphopt's convolution graph, logged the same way: what cuDNN was
    given differs from torch's call somewhere in the descriptors when the same engine and knobs run slower."""
    config = json.dumps({"engine_id": plan["engine_id"], "knobs": plan.get("knobs") or {}})
    return _logged_child(["--graphopt-log-child", config, "--only", name, "--batch", str(batch), "--dtype", dtype], timeout)


def descriptor_diff(torch_lines: list[str], graphopt_lines: list[str]) -> list[str]:
    """A unified diff of the two executions' descriptors (``cudnn_log.descriptor``), at most 200 lines."""
    import difflib

    diff = difflib.unified_diff(cudnn_log.descriptor(torch_lines), cudnn_log.descriptor(graphopt_lines),
                                "torch", "graphopt", lineterm="", n=1)
    return list(diff)[:200]


def default_alignment(probe: Probe) -> dict:
    """The byte alignment the frontend declares for graphopt's tensors when nobody sets one."""
    from graphopt.providers import cudnn as base

    try:
        g, _ = probe.graph()
        return {"alignments": sorted({int(t.get_alignment()) for t in base.lowered_tensors(g)})}
    except Exception as e:  # noqa: BLE001
        return {"error": (str(e).splitlines() or [type(e).__name__])[0][:160]}


def try_torch_config(probe: Probe, plan: dict, default_knobs: bool = True, alignments=(None,)) -> list[dict]:
    """Torch's engine id built on graphopt's convolution graph, with torch's knob choices (and the engine's
    default knobs), for each tensor byte ``alignments`` (None: the frontend's own): timed and checked, or the
    reason cuDNN refuses it."""
    if "engine_id" not in plan:
        return []
    mod, rows = probe.mod, []
    knobs, unknown = {}, []
    for kname, value in (plan.get("knobs") or {}).items():
        kt = getattr(getattr(mod, "knob_type", None), kname, None)
        (unknown.append(kname) if kt is None else knobs.__setitem__(kt, value))
    variants = [("torch's knobs", knobs, a) for a in alignments] + ([("default knobs", {}, None)] if default_knobs else [])
    for label, kd, align in variants:
        row = {"engine": plan["engine_id"], "knobs": label + (f", {align}-byte tensors" if align else ""), "unknown_knobs": unknown}
        try:
            g, t = probe.graph(alignment=align)
            g.create_execution_plan(plan["engine_id"], kd)
            g.check_support()
            row["name"] = str(g.get_plan_name_at_index(0))
            row.update(probe.run_plan(g, t, 0))
        except Exception as e:  # noqa: BLE001 - cuDNN's reason, one line
            row["refused"] = (str(e).splitlines() or [type(e).__name__])[0][:200]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _appends(probe: Probe, count: int) -> dict:
    """Whether ``create_execution_plan`` adds to a graph's plan list or replaces it: the heuristics' plan
    count before and after adding each engine id in turn (what a listing of every engine would rely on)."""
    try:
        graph, _ = probe.graph()
        graph.create_execution_plans([probe.mod.heur_mode.A])
        before = int(graph.get_execution_plan_count())
        added = []
        for eid in range(min(count, 64)):
            try:
                graph.create_execution_plan(eid, {})
                added.append(eid)
            except Exception:  # noqa: BLE001 - an engine that refuses the graph adds nothing
                pass
        after = int(graph.get_execution_plan_count())
        names = [str(graph.get_plan_name_at_index(i)) for i in range(after)]
        return {"heuristic_a": before, "engines_added": len(added), "after": after, "names": names[:80]}
    except Exception as e:  # noqa: BLE001
        return {"error": (str(e).splitlines() or [type(e).__name__])[0][:160]}


def barred_by_note(probe: Probe) -> dict:
    """For each of graphopt's ``INEXACT_NOTES`` alone: the names of the heuristic plans (A, then the
    fallback list) it bars, read from the frontend's own record (``_barred_indices``), so a fast plan's
    notes are named, not guessed."""
    from graphopt.providers import cudnn as base

    mod = probe.mod
    out = {}
    for note in base.INEXACT_NOTES:
        value = getattr(getattr(mod, "numerical_note", None), note, None)
        if value is None:
            out[note] = "not in this frontend"
            continue
        try:
            graph, _ = probe.graph()
            graph.create_execution_plans([mod.heur_mode.A, mod.heur_mode.FALLBACK])
            graph.deselect_numeric_notes([value])
            barred = getattr(graph, "_barred_indices", None)
            idx = sorted(barred()) if callable(barred) else []
            out[note] = [str(graph.get_plan_name_at_index(i)) for i in idx]
        except Exception as e:  # noqa: BLE001
            out[note] = "error: " + (str(e).splitlines() or [type(e).__name__])[0][:160]
    return out


def unfiltered_heuristics(probe: Probe, offered: set, deadline: float) -> list[dict]:
    """Every plan heuristics A, B and the fallback list give, without graphopt's inexact-notes filter;
    ``barred``: not among the plans graphopt's own listing offers."""
    mod = probe.mod
    out = []
    for mode in ("A", "B", "FALLBACK"):
        hm = getattr(mod.heur_mode, mode, None)
        if hm is None:
            continue
        try:
            graph, tensors = probe.graph()
            graph.create_execution_plans([hm])
            graph.check_support()
            n = int(graph.get_execution_plan_count())
        except Exception as e:  # noqa: BLE001
            out.append({"mode": mode, "refused": (str(e).splitlines() or [type(e).__name__])[0][:160]})
            continue
        for i in range(n):
            if time.monotonic() > deadline:
                out.append({"mode": mode, "index": i, "skipped": "budget"})
                continue
            row = {"mode": mode, "index": i}
            try:
                row["name"] = str(graph.get_plan_name_at_index(i))
                row["barred"] = row["name"] not in offered
                row.update(probe.run_plan(graph, tensors, i))
            except Exception as e:  # noqa: BLE001
                row["refused"] = (str(e).splitlines() or [type(e).__name__])[0][:160]
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def main(argv=None) -> int:
    ap = stem_arguments(__doc__.splitlines()[0], reps=20, only="r50.stem")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for the engines of all stems")
    ap.add_argument("--torch-plan-only", action="store_true", help="only torch's kernels and its logged plan")
    ap.add_argument("--torch-log-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--graphopt-log-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.torch_log_child or args.graphopt_log_child:
        xs, w, s, p, _act, _extra = STEMS[args.only.split(",")[0]]
        if args.torch_log_child:
            torch_log_child((args.batch,) + xs, w, s, p)
            return 0
        from graphopt.providers import cudnn as base

        mod = base._load()
        probe = Probe(mod, base._handle(mod), (args.batch,) + xs, w, s, p, args.dtype, reps=3)
        rows = try_torch_config(probe, json.loads(args.graphopt_log_child), default_knobs=False)
        return 0 if rows and "us" in rows[0] else 1

    from graphopt.providers import cudnn as base
    from graphopt.providers import cudnn_split

    header = env_header("python3 bench/stem_engines.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    tag = gpu_tag(args.gpu_name)
    mod = base._load()
    if mod is None:
        print(f"stem_engines: cuDNN frontend unavailable: {base.unavailable()}", file=sys.stderr)
        return 1
    handle = base._handle(mod)
    names = [n for n in args.only.split(",") if n in STEMS]
    start = time.monotonic()
    rows = []
    for k, name in enumerate(names):
        xs, w, s, p, _act, _extra = STEMS[name]
        x = (args.batch,) + xs
        deadline = start + args.budget * (k + 1) / len(names)
        row = {"layer": name, "bs": args.batch, "dtype": args.dtype, "torch_kernels": torch_kernels(x, w, s, p, args.reps)}
        rows.append(row)  # written after every part below: a call cut short keeps what it measured
        print(json.dumps(row), flush=True)
        probe = Probe(mod, handle, x, w, s, p, args.dtype, args.reps)
        row["torch_plan"] = torch_plan(name, args.batch, timeout=_child_timeout(deadline))
        print(json.dumps({k: v for k, v in row["torch_plan"].items() if k != "lines"}), flush=True)
        _write(args.out, tag, header, rows)
        row["frontend_alignment"] = default_alignment(probe)
        row["torch_plan_on_graphopt_graph"] = try_torch_config(probe, row["torch_plan"], alignments=(None, 16, 32))
        _write(args.out, tag, header, rows)
        if "engine_id" in row["torch_plan"]:
            gp = graphopt_plan_log(name, args.batch, args.dtype, row["torch_plan"], timeout=_child_timeout(deadline))
            row["graphopt_plan_log"] = {k: v for k, v in gp.items() if k != "lines"}
            if "error" not in gp:  # a failed child has no descriptors to set against torch's
                row["descriptor_diff"] = descriptor_diff(row["torch_plan"].get("lines", []), gp.get("lines", []))
                print("\n".join(row["descriptor_diff"]), flush=True)
            _write(args.out, tag, header, rows)
        if args.torch_plan_only:
            continue
        offered = set(cudnn_split._graph_for(cbr_sig(x, w, s, p, "Relu", {}, args.dtype)).names)
        row["offered_by_graphopt"] = sorted(offered)
        row["barred_by_note"] = barred_by_note(probe)
        print(json.dumps({"barred_by_note": row["barred_by_note"]}), flush=True)
        row["heuristics_unfiltered"] = unfiltered_heuristics(probe, offered, deadline - (deadline - time.monotonic()) / 2)
        _write(args.out, tag, header, rows)
        row["engines"] = every_engine(probe, deadline)
        _write(args.out, tag, header, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
