"""One candidate's run: build it, check its answer, time it (in the worker process, or inline).

:func:`run_one` never raises: every failure becomes a reply with a status of
:mod:`graphopt.tune.results` and the reason. The reply's ``phases`` say where the seconds went.

What it needs from the kernels (the real implementations live there, in ``graphopt/kernels``):

- ``Timer``:   ``timer(launch, inputs, outputs) -> list[float]`` (ms per timed run; warm-up,
  repetitions and L2-rotation are the timer's business). A timer with ``takes_bound = True`` also
  takes ``bound_ms``: a time above which the candidate cannot be chosen (:data:`CANNOT_WIN` times
  the best median this process measured for the signature and the candidate's layouts so far); it
  may time a candidate that shows itself slower than that with a few repetitions only.
  ``FakeTimer`` is the test double.
- ``Checker``: ``checker(sig, launch) -> str | None``: run on fresh random inputs, compare with
  the op's reference, return the reason when wrong.
- ``Buffers``: ``buffers(sig) -> (inputs, outputs)`` for timing (default: two empty lists).

Workers sharing one GPU take turns on it (``GPU_LOCK_ENV``, :func:`_gpu_turn`).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

from graphopt.lowering.contract import Signature, build_lowering
from graphopt.tune.results import BUILD_FAILED, ERROR, OK, OOM, WRONG


class Timer(Protocol):
    def __call__(self, launch: Callable, inputs: Sequence[Any], outputs: Sequence[Any]) -> list[float]: ...


# A candidate whose first timed launch takes more than this times the best median measured so far for
# its signature and layouts (in this process) cannot be chosen: a bound-taking timer times it briefly.
# Per layouts, because the selection keeps the fastest candidate of each layout group and may choose a
# slower group to save conversions (graphopt.tune.layout_choice). On a cold ResNet-50 on the H100, four
# candidates in five were such, and each had taken the full 10 ms timing budget.
CANNOT_WIN = 1.5
BRIEFLY = "timed briefly: slower than"  # the reason such a candidate's result carries
_BEST_MS: dict[tuple[str, tuple[str, ...]], float] = {}  # (signature key, layouts) -> best median timed here


def _group(sig: Signature, layouts=()) -> tuple[str, tuple[str, ...]]:
    return sig.key(), tuple(str(x) for x in (layouts or ()))


def bound_for(sig: Signature, layouts=()) -> float | None:
    """The time above which a candidate of ``sig`` declaring ``layouts`` (``Lowering.layouts``)
    cannot win, or None before any of that group was timed."""
    best = _BEST_MS.get(_group(sig, layouts))
    return None if best is None else CANNOT_WIN * best


def _record_best(sig: Signature, layouts, ms: float) -> None:
    key = _group(sig, layouts)
    if ms < _BEST_MS.get(key, math.inf):
        _BEST_MS[key] = ms


class Checker(Protocol):
    def __call__(self, sig: Signature, launch: Callable) -> str | None: ...


def no_buffers(sig: Signature) -> tuple[list, list]:
    """Default ``buffers``: nothing (fake launches need no memory)."""
    return [], []


@dataclass(frozen=True)
class FakeTimer:
    """Test double for the CUDA-event timer: calls ``launch`` ``reps`` times and uses what it returns.

    A fake candidate's launch returns its simulated run time in ms; a launch returning ``None`` (a
    real kernel) is an error, so a fake timer is never mistaken for a measurement.
    """

    reps: int = 5
    bounded_reps: int = 0  # > 0: takes ``bound_ms`` and times a launch slower than it this many times

    @property
    def takes_bound(self) -> bool:
        return self.bounded_reps > 0

    def __call__(self, launch, inputs, outputs, bound_ms: float | None = None) -> list[float]:
        times = []
        for i in range(self.reps):
            if bound_ms is not None and self.bounded_reps and i == self.bounded_reps and min(times) > bound_ms:
                break
            t = launch(inputs, outputs)
            if t is None:
                raise TypeError("FakeTimer needs launches that return their simulated time in ms")
            times.append(float(t))
        return times


def describe_exc(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_oom(exc: BaseException) -> bool:
    # cupy.cuda.memory.OutOfMemoryError, MemoryError, cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY
    text = f"{type(exc).__name__} {exc}".lower()
    return isinstance(exc, MemoryError) or "outofmemory" in text or "out of memory" in text or "memoryallocation" in text


GPU_LOCK_ENV = "GRAPHOPT_TUNE_GPU_LOCK"  # a worker sharing its GPU with others: the lock file they share


@contextmanager
def _gpu_turn(phases: dict, shared: bool = False) -> Iterator[None]:
    """Take the GPU when workers share it (``GPU_LOCK_ENV``: an ``flock`` on one file per GPU).
    A timing holds it alone (``LOCK_EX``), so no timing sees another worker's kernels; checks hold
    it together (``LOCK_SH``): they overlap one another, never a timing. Builds (cuDNN plan builds,
    module loads) take no lock. Why checks share: on the H200 a cold ResNet-50 with four workers
    spent 45.8 s in checks inside an exclusive turn, mostly each cuDNN plan's first execution (its
    kernels' lazy module load), while the other workers waited (159 s of waits in all)."""
    path = os.environ.get(GPU_LOCK_ENV)
    if not path:
        yield
        return
    import fcntl

    t0 = time.perf_counter()
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        phases["wait"] = phases.get("wait", 0.0) + time.perf_counter() - t0
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class _Laps:
    """Seconds per phase of one candidate's run: ``lap(name)`` adds the time since the last lap (or
    ``restart``) to ``phases[name]``."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def restart(self) -> None:
        self.t0 = time.perf_counter()

    def lap(self, name: str) -> None:
        t = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + (t - self.t0)
        self.t0 = t


def run_one(sig, cand, timer, checker, buffers, arch) -> dict:
    """Build, check and time one candidate; never raises (runs in the worker or inline). The reply's
    ``phases`` gives the seconds each step took (build, check, time, wait), for :class:`TuningTime`."""
    laps, reply, launch, prepared = _build_and_check(sig, cand, checker, buffers, arch)
    if reply is None:
        with _gpu_turn(laps.phases):  # the GPU alone
            laps.restart()
            reply = _time(sig, launch, timer, prepared, laps.lap)
    reply["phases"] = laps.phases
    return reply


BATCH_BYTES = 1 << 30  # device memory a batch's checked candidates may hold (buffers, workspaces) before they are timed


def run_batch(sig, cands, timer, checker, buffers, arch, progress: Callable[[int], None]) -> dict[int, dict]:
    """Build and check ``cands`` one after another (each check in a shared GPU turn), then time the
    ones that passed in one exclusive turn: a worker sharing its GPU with others takes the GPU alone
    once per batch rather than once per candidate: a timing waits for every check in progress to end,
    and the other workers' checks seldom all end at once. Replaying the H100's cold ResNet-50 on the
    CPU (``bench/tuning_schedule_cpu.py``, 4 workers): 55.2 s one candidate a turn, 50.5 s eight a
    turn; on the H100 itself selection went from 64.4 to 53.6 s.

    ``progress(i)`` is called before candidate ``i`` is checked and before it is timed (the worker
    sends it to the parent, which then knows whom a crash or a hang belongs to). Returns the replies
    by index. After the first failure that the process does not survive (``survives``) nothing more
    runs and the candidates checked but not yet timed get no reply (the caller runs them again in a
    fresh process, as the failure may have spoiled this one's CUDA context). Checked candidates are
    timed early once they hold ``BATCH_BYTES``."""
    replies: dict[int, dict] = {}
    pending: list[tuple[int, Any, Any, tuple]] = []
    held = 0

    def flush() -> None:
        nonlocal held
        if not pending:
            return
        waited: dict[str, float] = {}
        with _gpu_turn(waited):  # the GPU alone, once for the whole batch
            for i, laps, launch, prepared in pending:
                progress(i)
                laps.restart()
                reply = _time(sig, launch, timer, prepared, laps.lap)
                reply["phases"] = laps.phases
                replies[i] = reply
        for i, laps, _, _ in pending:  # the turn's wait, shared out
            if "wait" in waited:
                laps.phases["wait"] = laps.phases.get("wait", 0.0) + waited["wait"] / len(pending)
        pending.clear()
        held = 0

    for i, cand in enumerate(cands):
        progress(i)
        laps, reply, launch, prepared = _build_and_check(sig, cand, checker, buffers, arch)
        if reply is not None:
            reply["phases"] = laps.phases
            replies[i] = reply
            if survives(reply):
                continue
            return replies
        pending.append((i, laps, launch, prepared))
        held += _device_bytes(launch, prepared)
        if held >= BATCH_BYTES:
            flush()
    flush()
    return replies


def survives(reply: dict) -> bool:
    """Whether the worker may go on after ``reply``: a pass, or a build that failed while the CUDA
    context stayed usable (cuDNN refusing a graph is a host-side answer; a cold ResNet-50 on the
    H100 restarted a worker for each of its four). Any other failure ran the candidate's kernels,
    which may have left the context unusable, so the next candidate gets a fresh process."""
    if reply["status"] == OK:
        return True
    return reply["status"] == BUILD_FAILED and _context_usable()


def _context_usable() -> bool:
    """No CUDA error is pending in this process: CUDA was never touched (CuPy not imported, or no
    device to touch), or a device sync passes."""
    import sys

    cupy = sys.modules.get("cupy")
    if cupy is None:
        return True
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return True
    except Exception:  # noqa: BLE001 - no driver or no device: no context to spoil
        return True
    try:
        cupy.cuda.runtime.deviceSynchronize()  # raises a sticky error (an illegal address, a launch failure)
    except Exception:  # noqa: BLE001 - any error: not usable
        return False
    return True


def _device_bytes(launch, prepared: tuple) -> int:
    arrays = [a for group in prepared for a in group if a is not None]
    return sum(int(getattr(a, "nbytes", 0)) for a in arrays) + int(getattr(launch, "workspace_bytes", 0) or 0)


def _build_and_check(sig, cand, checker, buffers, arch) -> tuple["_Laps", dict | None, Any, tuple]:
    """(laps, a failure reply or None, the built lowering, its timing buffers)."""
    laps = _Laps()
    try:
        launch = build_lowering(cand, sig, arch)
    except BaseException as exc:  # noqa: BLE001 - any failure of a candidate scores inf
        if isinstance(exc, KeyboardInterrupt):
            raise
        laps.lap("build")
        return laps, {"status": OOM if _is_oom(exc) else BUILD_FAILED, "reason": f"build failed: {describe_exc(exc)}"}, None, ()
    laps.lap("build")
    with _gpu_turn(laps.phases, shared=True):  # checks overlap one another, never a timing
        laps.restart()  # the wait for the GPU is its own phase
        reply, prepared = _check(sig, launch, checker, buffers, laps.lap)
    return laps, reply, launch, prepared


def _check(sig, launch, checker, buffers, lap) -> tuple[dict | None, tuple]:
    """(a failure reply, or None) and the timing buffers, in the layouts ``launch`` declares."""
    try:
        wrong = checker(sig, launch)
        lap("check")
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"status": OOM if _is_oom(exc) else ERROR, "reason": f"check raised {describe_exc(exc)}"}, ()
    if wrong:
        return {"status": WRONG, "reason": f"wrong answer: {wrong}"}, ()
    try:
        inputs, outputs = buffers(sig)
        if getattr(launch, "layouts", ()):  # a GPU lowering that declares layouts: time it in them
            import cupy

            inputs = launch.conform(inputs, cupy)
            outputs = launch.empty_outputs(len(inputs), [o.shape for o in outputs], outputs[0].dtype, cupy)
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"status": OOM if _is_oom(exc) else ERROR, "reason": f"timing raised {describe_exc(exc)}"}, ()
    return None, (inputs, outputs)


def _time(sig, launch, timer, prepared: tuple, lap) -> dict:
    inputs, outputs = prepared
    bounded = getattr(timer, "takes_bound", False)
    layouts = getattr(launch, "layouts", ())
    bound = bound_for(sig, layouts) if bounded else None
    try:
        raw = timer(launch, inputs, outputs) if bound is None else timer(launch, inputs, outputs, bound_ms=bound)
        samples = [float(t) for t in raw]
        lap("time")
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"status": OOM if _is_oom(exc) else ERROR, "reason": f"timing raised {describe_exc(exc)}"}
    if not samples or not all(math.isfinite(t) and t >= 0 for t in samples):
        return {"status": ERROR, "reason": f"timer returned no valid times ({samples[:5]})"}
    reply = {"status": OK, "samples": samples, "reason": ""}
    if bounded:
        ms = statistics.median(samples)  # the profiler's score
        if bound is not None and ms > bound:
            reply["reason"] = f"{BRIEFLY} {CANNOT_WIN:g}x the best so far in its layouts ({bound / CANNOT_WIN:.4g} ms)"
        _record_best(sig, layouts, ms)
    return reply


__all__ = ["BATCH_BYTES", "CANNOT_WIN", "GPU_LOCK_ENV", "Checker", "FakeTimer", "Timer", "describe_exc", "no_buffers", "run_batch",
           "run_one", "survives"]
