"""What the per-kernel benchmarks share (bench/cbr_layers.py, gemm_act.py, transformer_kernels.py):
the run's header and ceilings, the tuner's own choice among every registered candidate, torch timed
with the same timer, a time budget, and atomic result files written as the run goes.

``TunerChoice.profile(sig)`` is what ``graphopt optimize`` would choose for one signature: every
candidate of ``graphopt.kernels.registry`` (graphopt's own kernels and every provider's plans, so a
new provider appears here without a change), built, checked against the float64 reference and timed
by the tuner's own backend (``graphopt.tune.tuner.kernels_backend``: ``cuda_event_timer``, which times
a capturable lowering inside a CUDA graph with ``graph_timer``) in the isolated worker, as the tuner
runs them (a cuDNN plan that faults costs only the worker). Results are grouped by provider: ``own``
for graphopt's kernels, else the providers' module name (``cudnn``, ``cublaslt``, ...).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
from pathlib import Path
import time


def env_header(command: str) -> dict:
    import cupy

    from runtime_bench import versions

    props = cupy.cuda.runtime.getDeviceProperties(0)
    head = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "compute_capability": cupy.cuda.Device().compute_capability,
        "sm_count": props["multiProcessorCount"],
        "l2_bytes": props["l2CacheSize"],
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "nvrtc": ".".join(map(str, cupy.cuda.nvrtc.getVersion())),
        **versions(),  # runtime_bench.versions: the one list of library versions and the commit
        "command": command,
        "timing": "graphopt.kernels.timing.cuda_event_timer, median of reps: a capturable lowering inside a CUDA "
                  "graph (graph_timer), others and torch with CUDA events per launch after a spin-kernel prefill "
                  "(device time, no host gaps); inputs rotated over >= 128 MiB",
    }
    try:
        from graphopt.providers import provider_reasons

        head["providers"] = {k: (v or "available") for k, v in provider_reasons().items()}
    except Exception as exc:  # noqa: BLE001
        head["providers"] = f"unknown ({type(exc).__name__})"
    return head


def _event_ms(fn, reps: int = 10) -> float:
    import torch

    from graphopt.kernels.timing import median

    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return median(ts)


def measure_ceilings() -> dict:
    """Copy bandwidth (bytes read + written, 1 GiB each way) and dense fp16 / tf32 GEMM peaks."""
    import torch

    out = {}
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    out["copy_TBps"] = 2 * n / (_event_ms(lambda: b.copy_(a)) * 1e-3) / 1e12
    a = b = None  # noqa: F841 - frees 2 GiB before the GEMMs
    for name, dt, tf32 in (("fp16_TFLOPs", torch.float16, False), ("tf32_TFLOPs", torch.float32, True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        m = 8192
        x = torch.randn(m, m, device="cuda", dtype=dt)
        y = torch.randn(m, m, device="cuda", dtype=dt)
        out[name] = 2 * m**3 / (_event_ms(lambda: x @ y) * 1e-3) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.empty_cache()
    return out


def provider_of(cand) -> str:
    """``own`` for graphopt's kernels, else the provider module's name (``graphopt.providers.<name>``)."""
    mod = type(cand).__module__
    return mod.split(".")[2] if mod.startswith("graphopt.providers.") else "own"


def us(ms: float | None) -> float | None:
    return round(ms * 1e3, 2) if ms is not None and math.isfinite(ms) else None


class TunerChoice:
    """The tuner's choice per signature, through its backend, its isolated worker and its timer."""

    def __init__(self, timeout_s: float = 120.0, *, backend=None, runner=None, compute_capability=None, arch=None,
                 providers: tuple[str, ...] | None = None):
        """The real backend on the present GPU; ``backend`` / ``runner`` / ``compute_capability`` /
        ``arch`` replace them (CPU tests with fake candidates and an InlineRunner); ``providers``
        (``provider_of`` names) keeps only their candidates (a short device call)."""
        self.providers = providers
        if backend is None:
            from graphopt.tune.tuner import kernels_backend

            backend, why = kernels_backend()
            if backend is None:
                raise RuntimeError(f"no tuning backend: {why}")
        if arch is None or compute_capability is None:
            import cupy

            from graphopt.kernels.source import device_arch

            arch = device_arch()
            compute_capability = tuple(int(c) for c in cupy.cuda.Device().compute_capability)
        if runner is None:
            from graphopt.tune.runners import IsolatedRunner

            runner = IsolatedRunner(backend.timer, backend.checker, backend.buffers, arch, timeout_s=timeout_s)
        self.backend, self.arch, self.cc, self.runner, self.timeout_s = backend, arch, tuple(compute_capability), runner, timeout_s

    def profile(self, sig) -> dict:
        """{graphopt_us, chosen, chosen_provider, best_by_provider: {provider: {us, key}}, candidates:
        {key: us|None}, provider: {key: provider}, failures: {key: reason}, pruned: {key: reason} (first 20)}."""
        from graphopt.tune.profiler import profile_node

        cands = [c for c in self.backend.candidates_for(sig) if not self.providers or provider_of(c) in self.providers]
        prov = {c.key(): provider_of(c) for c in cands}
        res = profile_node(sig, cands, timer=self.backend.timer, checker=self.backend.checker,
                           buffers=self.backend.buffers, compute_capability=self.cc, arch=self.arch,
                           timeout_s=self.timeout_s, runner=self.runner)
        best: dict[str, dict] = {}
        for r in res.results:
            p = prov.get(r.candidate, "own")
            if r.ok and (p not in best or r.ms * 1e3 < best[p]["us"]):
                best[p] = {"us": us(r.ms), "key": r.candidate}
        win = res.winner
        return {"graphopt_us": us(win.ms) if win else None, "chosen": win.candidate if win else None,
                "chosen_provider": prov.get(win.candidate) if win else None, "best_by_provider": best,
                "candidates": {r.candidate: us(r.ms) for r in res.results if r.status != "pruned"},
                "provider": {r.candidate: prov.get(r.candidate, "own") for r in res.results if r.status != "pruned"},
                "failures": {r.candidate: r.reason for r in res.results if r.status not in ("ok", "pruned")},
                "pruned": dict(list({r.candidate: r.reason for r in res.results if r.status == "pruned"}.items())[:20])}

    def close(self) -> None:
        self.runner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def torch_us(fn, ins, out, reps: int = 20) -> float:
    """Device time of torch ``fn(*ins)`` in us with the kernels' timer (eager, no graph). The timer records
    its events on CuPy's current stream, so torch runs on that very stream (an ExternalStream of it)."""
    import cupy
    import torch

    from graphopt.kernels.timing import cuda_event_timer, median

    torch.cuda.synchronize()
    stream = cupy.cuda.Stream(non_blocking=False)
    tstream = torch.cuda.ExternalStream(stream.ptr)

    def launch(i, o):
        with torch.cuda.stream(tstream):
            fn(*i)

    with stream:
        ms = median(cuda_event_timer(launch, ins, [out], warmup=5, reps=reps))
        stream.synchronize()
    return round(ms * 1e3, 2)


def torch_graph_ms(run, reps: int = 20, replays: int = 7, keep_outputs: bool = True) -> float:
    """Device time in ms of one torch call inside a CUDA graph, as graphopt's capturable lowerings are
    timed (``graphopt.kernels.timing.graph_timer``): ``run(i)`` makes call ``i`` (over the caller's
    rotated operand sets); three calls warm up on a side stream (library plan choice, workspace, lazy
    loading), ``reps`` calls are captured once with torch's own ``torch.cuda.graph`` (its allocator gives
    the outputs and any workspace a private pool), the graph is replayed ``replays`` times between CUDA
    events; returns the median replay divided by ``reps``. Eager timing carries a launch gap of about
    2.5 us a call on the H100 that neither this nor graphopt's timing has (bench/NOTES_kernels.md,
    2026-12-06); torch.compile(mode="reduce-overhead") runs this way. Raises what the capture raises.

    ``keep_outputs`` (default): what each captured call returns is held until the replays are done,
    so every call writes its own buffer, as graphopt's timing writes the rotated sets' outputs; a
    result dropped at once lets the allocator hand the next call the same block, whose lines the
    previous call may have left in L2 (False: that, the timing before 2026-12-06's eighth session)."""
    import torch

    from graphopt.kernels.timing import median

    graph, held = torch_graph(run, reps, keep_outputs)
    times = [torch_replay_ms(graph) / reps for _ in range(replays)]
    del graph, held
    torch.cuda.empty_cache()
    return median(times)


def torch_graph(run, reps: int, keep_outputs: bool = True):
    """``(graph, held)``: ``reps`` calls ``run(i)`` captured in one ``torch.cuda.CUDAGraph`` after three
    warm-up calls on a side stream, replayed once; ``held``: what the calls returned (kept alive while
    the graph is: see ``torch_graph_ms``)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            run(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    held = []
    with torch.cuda.graph(graph):
        for i in range(reps):
            out = run(i)
            if keep_outputs:
                held.append(out)
            del out
    graph.replay()
    torch.cuda.synchronize()
    return graph, held


def torch_replay_ms(graph) -> float:
    """One replay of ``graph`` between CUDA events on torch's current stream, in ms."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def torch_graph_us(fn, ins, reps: int = 20, rotate_bytes: int = 128 << 20, max_sets: int = 16,
                   keep_outputs: bool = True) -> float:
    """``torch_graph_ms`` of ``fn(*ins)`` in us, the inputs rotated over copies covering ``rotate_bytes``
    (at most ``max_sets`` sets) like the kernels' operands, so no call finds them in L2 from the one before."""
    per_set = max(1, sum(t.numel() * t.element_size() for t in ins if t is not None))
    n_sets = max(1, min(max_sets, -(-rotate_bytes // per_set)))
    sets = [list(ins)] + [[None if t is None else t.clone() for t in ins] for _ in range(n_sets - 1)]
    return round(torch_graph_ms(lambda i: fn(*sets[i % n_sets]), reps=reps, keep_outputs=keep_outputs) * 1e3, 2)


def torch_graph_or_reason(fn, ins, reps: int = 20, keep_outputs: bool = True) -> tuple[float | None, str | None]:
    """``(torch_graph_us(fn, ins), None)``, or ``(None, why)`` where torch refuses the capture (a row keeps
    its eager time and says why it has no graph-timed one)."""
    try:
        return torch_graph_us(fn, ins, reps=reps, keep_outputs=keep_outputs), None
    except Exception as exc:  # noqa: BLE001 - reported in the row
        return None, f"graph capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def prebuild_all() -> dict:
    """Compile every own kernel instance in parallel first (the worker then loads cubins)."""
    from graphopt.kernels.registry import all_kernel_instances
    from graphopt.kernels.source import prebuild

    t0 = time.perf_counter()
    errors = prebuild(all_kernel_instances())
    return {"prebuild_s": round(time.perf_counter() - t0, 1), "prebuild_errors": {f"{k[0]}:{k[1]}": v for k, v in errors.items()}}


def geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return round(math.exp(sum(math.log(x) for x in xs) / len(xs)), 3) if xs else None


class Budget:
    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


@contextlib.contextmanager
def barrier_left_out():
    """Within it, a lowering's launch enqueues no stream barrier (``graphopt.lowering.barrier`` made a
    no-op; restored after): its launch as it runs where nothing needs ordering (the attention table's
    barrier-off column, probe_early_start's captures)."""
    from graphopt.lowering import barrier as barrier_mod

    orig = barrier_mod.barrier
    barrier_mod.barrier = lambda: None
    try:
        yield
    finally:
        barrier_mod.barrier = orig


def gpu_tag(device_name: str | None = None) -> str:
    """The suffix of result files: the normalized name of ``device_name`` (a run header's GPU), or else of
    this machine's first GPU, as ``--gpu auto`` reads it (``graphopt.tune.gpus``: "NVIDIA H100 80GB HBM3"
    -> h100); ``cpu`` without a GPU. A fixed default (it was h200) merged another GPU's rows, or a dry
    run's, into the H200's committed files."""
    from graphopt.tune.gpus import detect_devices, try_normalize_gpu_name

    if device_name is not None:
        return try_normalize_gpu_name(device_name) or "unknown"
    devices = detect_devices()
    return devices[0].normalized if devices else "cpu"


GPU_NAME_HELP = ("suffix of the output files (default: this machine's GPU as --gpu auto names it, e.g. h200; "
                 "cpu without one): one GPU's rows never merge with another's")


def write_atomic(path, text: str) -> None:
    """``text`` to ``path`` atomically with normal permissions (graphopt's own writer), its folder made."""
    from graphopt.files import atomic_write

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(Path(path), [text.encode()])


def write_json(path: str, doc: dict) -> None:
    write_atomic(path, json.dumps(doc, indent=1) + "\n")
