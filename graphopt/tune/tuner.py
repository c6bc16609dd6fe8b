"""``tune_graph``: lowering selection wired to the real pieces (devices, kernels, profiler, cache).

``select_lowerings`` takes its collaborators as arguments so it can be tested with fakes; this
module supplies the real ones, for the pipeline and the CLI:

- the devices from ``detect_devices()``;
- the default ``TuningCache`` (a cache that cannot be opened is reported, never fatal);
- the kernels' backend (``kernels_backend``): candidates from ``graphopt.kernels.candidates_for``,
  the CUDA-event timer ``graphopt.kernels.timing.tuning_timer`` (``cuda_event_timer`` with a time budget), and a checker and buffer
  factory from ``graphopt.kernels.check`` (``checker(sig, launch) -> str | None`` and
  ``buffers(sig) -> (inputs, outputs)``). While any of them is missing, a present GPU is not
  profiled and the summary says so.
"""

from __future__ import annotations

import os

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from graphopt.errors import TuningError
from graphopt.lowering.contract import Candidate, Signature
from graphopt.tune.gpus import DeviceInfo, detect_devices, normalize_gpu_name, resolve_target
from graphopt.tune.profiler import DEFAULT_TIMEOUT_S, Profiler
from graphopt.tune.select import SelectionReport, select_lowerings


@dataclass(frozen=True)
class TuningBackend:
    """What the profiler needs from the kernels. All four must be picklable (module-level).
    ``precompile(jobs, arch)`` (optional, runs here) compiles the pending candidates' kernels in parallel."""

    candidates_for: Callable[[Signature], Sequence[Candidate]]
    timer: Callable
    checker: Callable
    buffers: Callable
    precompile: Callable | None = None


def kernel_candidates() -> Callable[[Signature], Sequence[Candidate]] | None:
    """``graphopt.kernels.candidates_for`` (importable without CuPy), or ``None``."""
    try:
        from graphopt.kernels import candidates_for
    except Exception:  # noqa: BLE001 - kernels missing or broken: no candidates
        return None
    return candidates_for


WORKER_GPU_BYTES = 8 << 30  # what one tuning worker may hold on its GPU (context, libraries, operands)


def default_workers_per_gpu(devices=()) -> int:
    """Tuning workers per GPU: one per four CPU cores, at most 4 (builds overlap; the GPU is taken in
    turns), and no more than the smallest GPU holds at ``WORKER_GPU_BYTES`` each (when its memory is
    known). ``GRAPHOPT_TUNE_WORKERS`` overrides it. Eight on the H100's 16 cores were slower on a
    fresh machine (cold ResNet-50 64.7 s against 55.1 with 4, GPT-2 61.6 against 49.3: the cuDNN plan
    builds are CPU work and 8 of them at once took twice the CPU seconds; bench/NOTES_e2e.md; fresh
    machines alone differed by up to 24 s later, so the machine's share is not separated)."""
    env = os.environ.get("GRAPHOPT_TUNE_WORKERS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    n = max(1, min(4, (os.cpu_count() or 1) // 4))
    memory = [int(getattr(d, "total_memory", 0) or 0) for d in devices]
    if memory and min(memory) > 0:
        n = max(1, min(n, min(memory) // WORKER_GPU_BYTES))
    return n


def kernels_backend() -> tuple[TuningBackend | None, str]:
    """The real backend, or ``None`` and the reason it is not available."""
    candidates_for = kernel_candidates()
    if candidates_for is None:
        return None, "graphopt.kernels.candidates_for is not importable"
    try:
        from graphopt.kernels.timing import tuning_timer
    except Exception as exc:  # noqa: BLE001
        return None, f"graphopt.kernels.timing.tuning_timer is not importable ({exc})"
    try:
        from graphopt.kernels.check import buffers, checker
    except Exception as exc:  # noqa: BLE001
        return None, f"graphopt.kernels.check (checker, buffers) is not importable ({exc})"
    try:
        from graphopt.kernels.source import compile_to_cache
    except Exception:  # noqa: BLE001 - only a speed-up
        compile_to_cache = None
    return TuningBackend(candidates_for, tuning_timer, checker, buffers, compile_to_cache), ""


def tune_graph(
    graph,
    gpu: str = "auto",
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    cache: Any = True,
    backend: TuningBackend | None | str = "kernels",
    devices: list[DeviceInfo] | None = None,
    isolate: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: bool | None = None,
    shape_profile: Any = None,
    budget_s: float | None = None,
    shapes_ahead: Any = None,
) -> SelectionReport:
    """Choose every custom-op node's lowering for ``gpu``, profiling when that GPU is present.

    ``cache``: ``True`` opens the default tuning cache, ``False``/``None`` uses none, or pass a
    ``TuningCache``. ``backend``: ``"kernels"`` loads ``kernels_backend()``; ``None`` never
    profiles; or pass a ``TuningBackend`` (tests). ``devices`` overrides detection (tests).
    ``shape_profile`` tunes each bucket of the profiled dims (``graphopt.tune.buckets``).
    ``budget_s`` caps the profiling time; a run that hits it is reported as cut short (mode
    ``partial``), never as tuned. ``shapes_ahead``: a started ``graphopt.tune.shapes_ahead.ShapesAhead``.
    """
    from graphopt.tune.buckets import resolve_profile

    norm = normalize_gpu_name(gpu)  # TuningError for an unknown name, before any work
    shape_profile = resolve_profile(graph, shape_profile, shapes)  # UsageError, before any work
    notes: list[str] = []
    own_cache = False
    if cache is True:
        from graphopt.tune.cache import TuningCache

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # collected in cache.messages and reported below
                cache = TuningCache(warn=False)
            own_cache = True
        except TuningError as exc:
            notes.append(f"tuning cache not used: {exc}")
            cache = None
    elif cache is False:
        cache = None
    try:
        if norm == "none":
            return select_lowerings(graph, "none", cache=None, shapes=shapes, devices=[], shape_profile=shape_profile)
        if devices is None:
            devices = detect_devices()
        target = resolve_target(norm, devices)
        if backend == "kernels":
            backend, why = kernels_backend() if target.present else (None, "")
            if target.present and backend is None:
                notes.append(f"no profiling: {why}")
        candidates_for = backend.candidates_for if backend is not None else kernel_candidates()
        if target.present and backend is not None:
            with Profiler(backend.candidates_for, timer=backend.timer, checker=backend.checker,
                          buffers=backend.buffers, devices=list(target.devices), cache=cache, isolate=isolate,
                          timeout_s=timeout_s, budget_s=budget_s,
                          precompile=getattr(backend, "precompile", None),
                          workers_per_gpu=default_workers_per_gpu(target.devices)) as prof:
                report = select_lowerings(graph, norm, cache=cache, profile=prof, shapes=shapes, devices=devices,
                                          candidates_for=candidates_for, progress=progress,
                                          shape_profile=shape_profile, shapes_ahead=shapes_ahead)
        else:
            report = select_lowerings(graph, norm, cache=cache, shapes=shapes, devices=devices,
                                      candidates_for=candidates_for, progress=progress,
                                      shape_profile=shape_profile, shapes_ahead=shapes_ahead)
        report.messages = notes + report.messages
        return report
    finally:
        if own_cache and cache is not None:
            cache.close()


__all__ = ["TuningBackend", "kernel_candidates", "kernels_backend", "tune_graph"]
