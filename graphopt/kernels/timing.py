"""CUDA-event timing of one launch function, with inputs rotated beyond the L2 cache."""

from __future__ import annotations

from typing import Any, Callable, Sequence

_SPIN = None


def _spin_kernel():
    global _SPIN
    if _SPIN is None:
        from graphopt.kernels.source import get_kernel

        _SPIN = get_kernel("elementwise.cu", "spin")
    return _SPIN


def _clone(a):
    """A fresh copy of a CuPy (or NumPy) array or a torch tensor with ``a``'s strides, so every rotated
    set is in the layout the lowering declares. ``copy(order="K")`` keeps a permuted layout (NHWC) but
    packs a view with gaps: a ``rowpad`` output (rows padded to 16 bytes) came back dense, and
    ``cublaslt_rowpad`` refused every rotated set of GPT-2's bs1 lm_head on the H200 ("timing raised";
    at bs32 one set covers the 128 MiB, so nothing was copied)."""
    if hasattr(a, "clone"):
        return a.clone()
    c = a.copy(order="K")
    if c.strides == a.strides or a.size == 0 or min(a.strides) < 0:
        return c
    import numpy as np

    if isinstance(a, np.ndarray):
        xp = np
    else:
        import cupy as xp
    span = a.itemsize + sum((d - 1) * s for d, s in zip(a.shape, a.strides))  # bytes from the first to the last element
    out = xp.lib.stride_tricks.as_strided(xp.empty(-(-span // a.itemsize), dtype=a.dtype), a.shape, a.strides)
    out[...] = a
    return out


def _nbytes(arrays) -> int:
    return sum(int(a.nbytes) for a in arrays if a is not None)


def cuda_event_timer(
    launch: Callable[[Sequence[Any], Sequence[Any]], None],
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    *,
    warmup: int = 3,
    reps: int = 20,
    rotate_bytes: int = 128 << 20,
    max_sets: int = 16,
    queue_ahead: int = 8,
    spin_cycles: int = 1_000_000,
    budget_ms: float | None = None,
    bound_ms: float | None = None,
) -> list[float]:
    """Per-repetition device time in milliseconds (the median is the profiler's score).

    - Copies of ``inputs`` / ``outputs`` are made until one rotation covers ``rotate_bytes``
      (default 128 MiB, twice an H100/H200's L2), at most ``max_sets`` sets; repetition ``i`` uses
      set ``i % n_sets``, so no repetition finds its operands in L2 from the one before.
    - Each repetition is bracketed by its own CUDA events on the current stream.
    - A capturable :class:`~graphopt.lowering.Lowering` is timed inside a CUDA graph
      (:func:`graph_timer`), as the runtime runs it; otherwise:
    - Host launch overhead is kept out of the numbers: every ``queue_ahead`` repetitions, a spin
      kernel (about ``spin_cycles`` SM clocks, 0.5 ms at 2 GHz) holds the GPU while the host queues
      them, so the events measure device time with no idle gaps, as a CUDA-graph replay would see.
      (Pass ``spin_cycles=0`` to measure eager, host-bound time instead.)
    - ``budget_ms`` (the tuner's setting; None: exactly ``reps``): the repetitions are cut so that
      they take about this much device time, never fewer than a few: one launch is timed first
      (after a warm-up, behind a spin kernel), and a candidate 10x slower than the budget allows is
      timed 3-6 times instead of 160. Timing all of a conv's cuDNN plans at their full counts
      took 108 of the 224 s of a cold ResNet-50 tuning on the H200, mostly on slow plans.
    - ``bound_ms`` (with ``budget_ms``; the tuner passes 1.5x the best median so far): a candidate
      whose first launch is slower than the bound cannot be chosen, so it is timed ``BRIEF`` times
      (``BRIEF`` replays of ``BRIEF`` launches in a graph); only if that median comes in under the
      bound after all is it timed in full.
    """
    replays = 7
    if budget_ms:
        est = _estimate_ms(launch, (list(inputs), list(outputs)), spin_cycles)
        warmup = 0  # two launches already ran
        if bound_ms is not None and est > bound_ms:
            brief = _timed(launch, _rotated(inputs, outputs, rotate_bytes, min(max_sets, BRIEF)), warmup=0,
                           reps=BRIEF, graph_reps=BRIEF, replays=BRIEF, queue_ahead=queue_ahead, spin_cycles=spin_cycles)
            if median(brief) > bound_ms:
                return brief
            est = median(brief)  # the first launch was an outlier: size the full timing by the brief one
        n = int(budget_ms / max(est, 1e-4))
        if n < reps * replays:  # graph mode: reps launches per replay, 3 replays at least
            replays = 3
            graph_reps = max(1, min(reps, n // 3))
        else:
            graph_reps = reps
        reps = max(3, min(reps, n))
    else:
        graph_reps = reps
    return _timed(launch, _rotated(inputs, outputs, rotate_bytes, max_sets), warmup=warmup, reps=reps,
                  graph_reps=graph_reps, replays=replays, queue_ahead=queue_ahead, spin_cycles=spin_cycles)


BRIEF = 3  # repetitions (and graph replays) of a candidate that cannot win


def _rotated(inputs, outputs, rotate_bytes: int, max_sets: int) -> list[tuple[list, list]]:
    """The operand sets a timing cycles through: the originals, then copies until one rotation covers
    ``rotate_bytes`` (at most ``max_sets`` sets in all)."""
    per_set = max(1, _nbytes(list(inputs) + list(outputs)))
    n_sets = max(1, min(max_sets, -(-rotate_bytes // per_set)))
    sets = [(list(inputs), list(outputs))]
    for _ in range(n_sets - 1):
        sets.append(([None if a is None else _clone(a) for a in inputs], [_clone(a) for a in outputs]))
    return sets


def _timed(launch, sets, *, warmup: int, reps: int, graph_reps: int, replays: int, queue_ahead: int,
           spin_cycles: int) -> list[float]:
    """The timing itself: in a CUDA graph where ``launch`` is capturable, else eagerly behind spin kernels."""
    import cupy

    if getattr(launch, "capturable", False) and getattr(launch, "graph_timing", True):
        try:
            return graph_timer(launch, sets, warmup=warmup, reps=graph_reps, replays=replays)
        except Exception:  # noqa: BLE001 - it refused capture after all: time it eagerly below
            pass
    n_sets = len(sets)
    stream = cupy.cuda.get_current_stream()
    for i in range(warmup):
        ins, outs = sets[i % n_sets]
        launch(ins, outs)
    spin = _spin_kernel() if spin_cycles else None
    import numpy as np

    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
    for i in range(reps):
        if spin is not None and i % queue_ahead == 0:
            spin((1,), (1,), (np.int64(spin_cycles),))
        ins, outs = sets[i % n_sets]
        start, end = events[i]
        start.record(stream)
        launch(ins, outs)
        end.record(stream)
    events[-1][1].synchronize()
    return [cupy.cuda.get_elapsed_time(s, e) for s, e in events]


TUNING_BUDGET_MS = 10.0  # device time the tuner spends on one candidate's timed repetitions


def tuning_timer(launch, inputs, outputs, bound_ms: float | None = None) -> list[float]:
    """The profiler's timer: :func:`cuda_event_timer` with the tuner's ``budget_ms`` and the bound the
    profiler passes (picklable, for the isolated worker). Benchmarks call ``cuda_event_timer`` with
    fixed repetitions."""
    return cuda_event_timer(launch, inputs, outputs, budget_ms=TUNING_BUDGET_MS, bound_ms=bound_ms)


tuning_timer.takes_bound = True  # graphopt.tune.candidate_run's Timer contract


def _estimate_ms(launch, operands, spin_cycles: int) -> float:
    """Device ms of one launch: a warm-up, then one launch between events behind a spin kernel (so
    a slow host enqueue, such as a cuDNN execute's, is not counted)."""
    import cupy
    import numpy as np

    stream = cupy.cuda.get_current_stream()
    launch(*operands)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    if spin_cycles:
        _spin_kernel()((1,), (1,), (np.int64(spin_cycles),))
    start.record(stream)
    launch(*operands)
    end.record(stream)
    end.synchronize()
    return float(cupy.cuda.get_elapsed_time(start, end))


def graph_timer(launch, sets, *, warmup: int = 3, reps: int = 20, replays: int = 7) -> list[float]:
    """Device time per launch inside a CUDA graph, as the runtime runs it: ``reps`` launches (cycling
    over the rotated ``sets``) are captured once on a fresh stream, the graph is replayed ``replays``
    times, each replay bracketed by events; returns ``[replay ms / reps]``. Used for a capturable
    :class:`~graphopt.lowering.Lowering`: a library call's host cost (a cuDNN execute costs tens of
    microseconds of Python and driver time) then does not count, as it does not in a CUDA graph."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(warmup):
            launch(*sets[i % len(sets)])
        stream.synchronize()
        stream.begin_capture()
        try:
            for i in range(reps):
                launch(*sets[i % len(sets)])
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        times = []
        for _ in range(replays):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) / reps)
    return times


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
