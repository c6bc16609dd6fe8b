"""The profiler: for one signature, prune, build, check and time every lowering candidate.

For each candidate, in the order given:

1. ``candidate.applies(sig, cc)``: a returned reason prunes it (recorded, never built).
2. ``launch = candidate.build(sig, arch)``, then ``checker(sig, launch)``: any exception (compile
   failure, out of memory, a fault) or a returned reason (wrong answer) scores ``inf`` with the
   reason. With ``isolate=True`` (the default) this and step 3 run in a worker subprocess, so a
   candidate that segfaults or hangs costs only that worker (it is replaced) and a timeout.
3. ``timer(launch, inputs, outputs)`` with ``inputs, outputs = buffers(sig)`` returns the times of
   the individual runs in ms; the candidate's score is their median.

Every result is kept; the fastest passing candidate wins (ties: the earlier candidate).

The protocols (the real implementations live with the kernels, in ``graphopt/kernels``):

- ``Timer``:   ``timer(launch, inputs, outputs) -> list[float]`` (ms per timed run; warm-up,
  repetitions and L2-rotation are the timer's business). ``FakeTimer`` is the test double.
- ``Checker``: ``checker(sig, launch) -> str | None``: run on fresh random inputs, compare with
  the op's reference, return the reason when wrong.
- ``Buffers``: ``buffers(sig) -> (inputs, outputs)`` for timing (default: two empty lists).

With ``isolate=True`` the candidates, timer, checker and buffers are sent to the worker process
(``python -m graphopt.tune._worker``) as pickles over a pipe, so they must be picklable:
module-level classes and functions. This is messaging with our own child process, not storage;
the tuning cache never uses pickle.
"""

from __future__ import annotations

import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from graphopt.lowering.contract import Candidate, Signature, as_lowering

DEFAULT_TIMEOUT_S = 120.0

# Result statuses.
OK = "ok"
PRUNED = "pruned"
BUILD_FAILED = "build_failed"
OOM = "out_of_memory"
WRONG = "wrong_answer"
ERROR = "error"
CRASHED = "crashed"
TIMEOUT = "timeout"
WORKER_FAILED = "worker_failed"  # the worker process could not start: an environment problem
SKIPPED = "skipped"  # never run: the tuning budget was spent first
# A result that leaves the signature's tuning unfinished: the run was cut short, not completed. A
# candidate killed after its own timeout (a hang) is a failed candidate, not an unfinished run.
CUT_SHORT = (SKIPPED,)

# Failures that say something about the candidate and are worth caching. A timeout (the GPU may
# have been busy) or a worker that could not start is not: those are measured again next time.
CACHEABLE_FAILURES = (BUILD_FAILED, OOM, WRONG, ERROR, CRASHED)


class Timer(Protocol):
    def __call__(self, launch: Callable, inputs: Sequence[Any], outputs: Sequence[Any]) -> list[float]: ...


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

    def __call__(self, launch, inputs, outputs) -> list[float]:
        times = []
        for _ in range(self.reps):
            t = launch(inputs, outputs)
            if t is None:
                raise TypeError("FakeTimer needs launches that return their simulated time in ms")
            times.append(float(t))
        return times


@dataclass(frozen=True)
class CandidateResult:
    """What happened to one candidate: ``ms`` is the median time, ``inf`` unless status is ``ok``."""

    candidate: str
    lowering: str
    params: str
    source_hash: str
    status: str
    ms: float = math.inf
    samples: tuple[float, ...] = ()
    reason: str = ""
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.status == OK and math.isfinite(self.ms)

    def to_dict(self) -> dict:
        return {
            "candidate": self.candidate, "lowering": self.lowering, "params": self.params,
            "status": self.status, "ms": self.ms if math.isfinite(self.ms) else None,
            "samples": list(self.samples), "reason": self.reason, "cached": self.cached,
        }


@dataclass
class ProfileResult:
    """All candidates' results for one signature, and the winner (``None`` when all failed)."""

    signature: str
    op: str
    results: list[CandidateResult] = field(default_factory=list)
    winner: CandidateResult | None = None

    @property
    def from_cache(self) -> bool:
        """True when nothing was measured now: every non-pruned result came from the cache."""
        measured = [r for r in self.results if r.status != PRUNED]
        return bool(measured) and all(r.cached for r in measured)

    @property
    def cut_short(self) -> int:
        """How many candidates were never run (the tuning budget was spent first): when
        non-zero, this signature's tuning is incomplete and must not be reported as tuned."""
        return sum(r.status in CUT_SHORT for r in self.results)

    def failure_summary(self) -> str:
        bad = [f"{r.candidate}: {r.status} ({r.reason})" for r in self.results if not r.ok]
        return "; ".join(bad) if bad else "no candidates"


def _describe_exc(exc: BaseException) -> str:
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


def _run_one(sig, cand, timer, checker, buffers, arch) -> dict:
    """Build, check and time one candidate; never raises (runs in the worker or inline). The reply's
    ``phases`` gives the seconds each step took (build, check, time, wait), for :class:`TuningTime`."""
    laps = _Laps()
    try:
        launch = as_lowering(cand.build(sig, arch))
    except BaseException as exc:  # noqa: BLE001 - any failure of a candidate scores inf
        if isinstance(exc, KeyboardInterrupt):
            raise
        laps.lap("build")
        reply = {"status": OOM if _is_oom(exc) else BUILD_FAILED, "reason": f"build failed: {_describe_exc(exc)}"}
    else:
        laps.lap("build")
        with _gpu_turn(laps.phases, shared=True):  # checks overlap one another, never a timing
            laps.restart()  # the wait for the GPU is its own phase
            reply, prepared = _check(sig, launch, checker, buffers, laps.lap)
        if reply is None:
            with _gpu_turn(laps.phases):  # the GPU alone
                laps.restart()
                reply = _time(launch, timer, prepared, laps.lap)
    reply["phases"] = laps.phases
    return reply


def _check(sig, launch, checker, buffers, lap) -> tuple[dict | None, tuple]:
    """(a failure reply, or None) and the timing buffers, in the layouts ``launch`` declares."""
    try:
        wrong = checker(sig, launch)
        lap("check")
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"status": OOM if _is_oom(exc) else ERROR, "reason": f"check raised {_describe_exc(exc)}"}, ()
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
        return {"status": OOM if _is_oom(exc) else ERROR, "reason": f"timing raised {_describe_exc(exc)}"}, ()
    return None, (inputs, outputs)


def _time(launch, timer, prepared: tuple, lap) -> dict:
    inputs, outputs = prepared
    try:
        samples = [float(t) for t in timer(launch, inputs, outputs)]
        lap("time")
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"status": OOM if _is_oom(exc) else ERROR, "reason": f"timing raised {_describe_exc(exc)}"}
    if not samples or not all(math.isfinite(t) and t >= 0 for t in samples):
        return {"status": ERROR, "reason": f"timer returned no valid times ({samples[:5]})"}
    return {"status": OK, "samples": samples, "reason": ""}


def worker_loop(recv, send, timer, checker, buffers, arch) -> None:
    """Worker loop (in ``graphopt.tune._worker``): one (sig, candidate) task at a time.

    The worker exits after any failure: on the GPU a fault leaves the CUDA context unusable, so
    the next candidate gets a fresh process.
    """
    while True:
        try:
            task = recv.recv()
        except (EOFError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 - the candidate's class is not importable here
            send.send({"status": WORKER_FAILED, "reason": f"the worker could not load the candidate: {_describe_exc(exc)} "
                       "(candidates must be module-level classes in importable modules)"})
            return
        if task is None:
            return
        sig, cand = task
        try:
            reply = _run_one(sig, cand, timer, checker, buffers, arch)
        except BaseException as exc:  # noqa: BLE001 - report, then die
            reply = {"status": ERROR, "reason": f"worker error {_describe_exc(exc)}"}
        try:
            send.send(reply)
        except Exception:  # noqa: BLE001 - e.g. an unpicklable sample; report it plainly
            send.send({"status": ERROR, "reason": "worker could not send its result: " + traceback.format_exc(limit=1)})
            return
        if reply["status"] != OK:
            return


def _visible_device(index: int | None) -> str | None:
    """The CUDA_VISIBLE_DEVICES value that shows a worker only device ``index`` of this process."""
    if index is None:
        return None
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    if parent:
        visible = [v.strip() for v in parent.split(",") if v.strip()]
        if index < len(visible):
            return visible[index]
    return str(index)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _last_line(f) -> str:
    try:
        f.flush()
        f.seek(max(0, f.seek(0, 2) - 4096))
        lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""
    except (OSError, ValueError):
        return ""


class TuningTime:
    """Where a tuning run's seconds went, summed over candidates (thread-safe: ``profile_many`` adds
    from one thread per GPU). Phases: ``list`` (candidates and cuDNN plan lists made, cache looked
    up), ``compile`` (the parallel precompile), ``worker_start`` (isolated workers started, again
    after each failure), ``build`` / ``check`` / ``time`` (in the worker, per candidate), ``other``
    (messaging and bookkeeping: a candidate's wall time less its phases). ``by_lowering`` splits the
    per-candidate seconds by lowering name, ``runs`` counts candidates run, ``workers`` workers
    started. Reported as ``tuning_time`` in the report, so a slow tuning says why."""

    def __init__(self):
        self._lock = threading.Lock()
        self.phases: dict[str, float] = {}
        self.by_lowering: dict[str, float] = {}
        self.runs_by_lowering: dict[str, int] = {}
        self.lowering_phases: dict[str, dict[str, float]] = {}
        self.runs = 0
        self.workers = 0

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def add_run(self, lowering: str, wall: float, phases: Mapping[str, float]) -> None:
        with self._lock:
            self.runs += 1
            self.by_lowering[lowering] = self.by_lowering.get(lowering, 0.0) + wall
            self.runs_by_lowering[lowering] = self.runs_by_lowering.get(lowering, 0) + 1
            split = self.lowering_phases.setdefault(lowering, {})
            for k, v in phases.items():
                self.phases[k] = self.phases.get(k, 0.0) + float(v)
                split[k] = split.get(k, 0.0) + float(v)
            self.phases["other"] = self.phases.get("other", 0.0) + max(0.0, wall - sum(float(v) for v in phases.values()))

    def to_dict(self) -> dict:
        with self._lock:
            return {"phases_s": {k: round(v, 3) for k, v in sorted(self.phases.items())},
                    "by_lowering_s": {k: round(v, 3) for k, v in sorted(self.by_lowering.items())},
                    "runs_by_lowering": dict(sorted(self.runs_by_lowering.items())),
                    "lowering_phases_s": {k: {p: round(v, 3) for p, v in sorted(d.items())}
                                          for k, d in sorted(self.lowering_phases.items())},
                    "candidates_run": self.runs, "workers_started": self.workers}


class IsolatedRunner:
    """Runs candidates in a worker subprocess, replacing it after a crash, timeout or failure.

    The worker is ``python -m graphopt.tune._worker`` (not ``multiprocessing``: its spawn mode
    re-imports the caller's ``__main__``, which breaks scripts without an ``if __name__ ==
    "__main__"`` guard, and fork does not work with CUDA). Tasks and results travel over two pipes
    as ``multiprocessing.connection`` messages; the worker sees this process's ``sys.path``, and
    its stdout and stderr go to a temporary file whose last line explains a crash. A worker that
    cannot start is an environment problem, not the candidate's: it is reported as
    ``worker_failed`` (never cached) and not retried for every candidate.
    """

    def __init__(self, timer, checker, buffers=no_buffers, arch: str = "", *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 startup_timeout_s: float = 120.0, device_index: int | None = None, gpu_lock: str | None = None):
        self._init = (timer, checker, buffers, arch)
        self.gpu_lock = gpu_lock  # the lock file of workers sharing this GPU (None: the GPU is this worker's)
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._visible = _visible_device(device_index)
        self._proc = None
        self._send = self._recv = None
        self._log = None
        self._broken: str | None = None
        self.workers_started = 0

    def _start(self) -> str | None:
        """Start a worker; returns the reason when it could not start."""
        from multiprocessing.connection import Connection

        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else os.getcwd() for p in sys.path)
        if self._visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = self._visible
        env.pop(GPU_LOCK_ENV, None)
        if self.gpu_lock:
            env[GPU_LOCK_ENV] = self.gpu_lock
        self._log = tempfile.TemporaryFile(prefix="graphopt-tune-worker-")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "graphopt.tune._worker", str(p2c_r), str(c2p_w)],
                pass_fds=(p2c_r, c2p_w), env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            )
        except OSError as exc:
            for fd in (p2c_r, p2c_w, c2p_r, c2p_w):
                os.close(fd)
            return f"could not start a worker process: {exc}"
        finally:
            if self._proc is not None:
                os.close(p2c_r)
                os.close(c2p_w)
        self._send = Connection(p2c_w, readable=False)
        self._recv = Connection(c2p_r, writable=False)
        self.workers_started += 1
        try:
            self._send.send(self._init)
        except Exception as exc:  # noqa: BLE001 - an unpicklable timer/checker/buffers
            self._stop(kill=True)
            return f"the timer, checker or buffers cannot be sent to a worker ({_describe_exc(exc)}); make them module-level"
        if not self._recv.poll(self.startup_timeout_s):
            self._stop(kill=True)
            return f"the worker did not start within {self.startup_timeout_s:g} s"
        try:
            hello = self._recv.recv()
        except (EOFError, OSError):
            why = _last_line(self._log)
            code = self._stop(kill=True)
            return f"the worker died while starting (exit code {code}){': ' + why if why else ''}"
        if not hello.get("ready"):
            self._stop(kill=True)
            return f"the worker could not load the timer/checker: {hello.get('reason', '?')}"
        return None

    def _stop(self, kill: bool = False) -> int | None:
        proc = self._proc
        self._proc = None
        code = None
        if proc is not None:
            if kill:
                proc.kill()
            else:
                try:
                    self._send.send(None)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            try:
                code = proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(10)
        for conn in (self._send, self._recv):
            if conn is not None:
                conn.close()
        self._send = self._recv = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    @property
    def broken(self) -> str | None:
        """Why this runner's worker cannot start (then every run answers ``worker_failed``), else ``None``."""
        return self._broken

    def run(self, sig: Signature, cand: Candidate) -> dict:
        if self._broken:
            return {"status": WORKER_FAILED, "reason": self._broken}
        started = 0.0
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            t0 = time.perf_counter()
            why = self._start()
            started = time.perf_counter() - t0
            if why:
                self._broken = why
                return {"status": WORKER_FAILED, "reason": why, "phases": {"worker_start": started}}
        try:
            self._send.send((sig, cand))
        except Exception as exc:  # noqa: BLE001 - unpicklable candidate, or a dead pipe
            self._stop(kill=True)
            return {"status": ERROR, "reason": f"could not send the candidate to the worker: {_describe_exc(exc)}"}
        if not self._recv.poll(self.timeout_s):
            self._stop(kill=True)
            return {"status": TIMEOUT, "reason": f"timed out after {self.timeout_s:g} s (killed)"}
        try:
            reply = self._recv.recv()
        except (EOFError, OSError):
            why = _last_line(self._log)
            code = self._stop(kill=True) if self._proc is not None else None
            if code is not None and code < 0:
                how = _signal_name(code)
            else:
                how = f"exit code {code}"
            return {"status": CRASHED, "reason": f"worker process died ({how}){': ' + why if why else ''}"}
        if reply.get("status") != OK:
            self._stop()
        if started:
            reply.setdefault("phases", {})["worker_start"] = started
        return reply

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> "IsolatedRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class InlineRunner:
    """Runs candidates in this process (``isolate=False``): no protection from faults or hangs.

    With a non-zero ``device_index`` each run happens inside ``cupy.cuda.Device(device_index)``, so
    the target GPU is measured even when it is not this process's current device (0).
    """

    broken = None  # an inline runner has no worker that could fail to start

    def __init__(self, timer, checker, buffers=no_buffers, arch: str = "", *, device_index: int | None = None):
        self._args = (timer, checker, buffers, arch)
        self.device_index = device_index

    def run(self, sig: Signature, cand: Candidate) -> dict:
        if not self.device_index:
            return _run_one(sig, cand, *self._args)
        import cupy  # noqa: PLC0415 - only with a real device other than 0

        with cupy.cuda.Device(self.device_index):
            return _run_one(sig, cand, *self._args)

    def close(self) -> None:
        pass


def profile_node(
    sig: Signature,
    candidates: Sequence[Candidate],
    *,
    timer: Timer,
    checker: Checker,
    buffers: Callable[[Signature], tuple[list, list]] = no_buffers,
    isolate: bool = True,
    compute_capability: tuple[int, int] = (8, 0),
    arch: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    known: Mapping[str, CandidateResult] | None = None,
    runner: IsolatedRunner | InlineRunner | None = None,
    memo: dict[str, ProfileResult] | None = None,
    deadline: Callable[[], str | None] | None = None,
    clock: TuningTime | None = None,
) -> ProfileResult:
    """Profile one signature over ``candidates``; see the module docstring.

    ``known`` maps candidate keys to results already measured (from the tuning cache): those are
    not run again. ``memo`` (sig key -> result) makes repeated signatures free. ``runner`` reuses a
    worker across calls; otherwise one is made (and closed) here. ``deadline()`` (a ``Budget``) is
    asked before each candidate: once it returns a reason, the remaining candidates are ``skipped``.
    """
    key = sig.key()
    if memo is not None and key in memo:
        return memo[key]
    arch = arch or f"sm_{compute_capability[0]}{compute_capability[1]}"
    known = known or {}
    result = ProfileResult(signature=key, op=sig.op)
    seen: set[str] = set()  # only membership tests, never iterated
    todo: list[tuple[int, Candidate]] = []
    slots: list[CandidateResult | None] = []
    for cand in candidates:
        ckey = cand.key()
        if ckey in seen:
            continue
        seen.add(ckey)
        base = dict(candidate=ckey, lowering=cand.name, params=cand.params_str(), source_hash=cand.source_hash())
        try:
            why_not = cand.applies(sig, compute_capability)
        except Exception as exc:  # noqa: BLE001 - a buggy applies() prunes, it does not crash
            why_not = f"applies() raised {_describe_exc(exc)}"
        if why_not:
            slots.append(CandidateResult(**base, status=PRUNED, reason=str(why_not)))
        elif ckey in known:
            slots.append(known[ckey])
        else:
            slots.append(None)
            todo.append((len(slots) - 1, cand))
    # Candidates without kernels to compile (vendor plans) run first, so that the precompile of our
    # own kernels, running beside (Profiler.profile_many), is ahead of them; results keep their order.
    todo.sort(key=lambda item: getattr(item[1], "kernels", None) is not None)
    own_runner = runner is None and bool(todo)
    if own_runner:
        runner = IsolatedRunner(timer, checker, buffers, arch, timeout_s=timeout_s) if isolate else InlineRunner(timer, checker, buffers, arch)
    try:
        for idx, cand in todo:
            spent = deadline() if deadline is not None else None
            t0 = time.perf_counter()
            reply = {"status": SKIPPED, "reason": spent} if spent else runner.run(sig, cand)
            if clock is not None and not spent:
                clock.add_run(cand.name, time.perf_counter() - t0, reply.get("phases", {}))
            samples = tuple(reply.get("samples", ()))
            status = reply["status"]
            slots[idx] = CandidateResult(
                candidate=cand.key(), lowering=cand.name, params=cand.params_str(), source_hash=cand.source_hash(),
                status=status, ms=statistics.median(samples) if status == OK else math.inf,
                samples=samples, reason=reply.get("reason", ""),
            )
    finally:
        if own_runner:
            runner.close()
    result.results = [r for r in slots if r is not None]
    ok = [(r.ms, i, r) for i, r in enumerate(result.results) if r.ok]
    result.winner = min(ok)[2] if ok else None
    if memo is not None:
        memo[key] = result
    return result


@contextmanager
def node_progress(total: int, *, enabled: bool | None = None, description: str = "profiling") -> Iterator[Callable[[str], None]]:
    """A rich progress bar over nodes; yields ``advance(label)``. Off when stderr is not a terminal."""
    if enabled is False:
        yield lambda label: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = Console(stderr=True)
    if enabled is None:
        enabled = console.is_terminal
    progress = Progress(
        TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[label]}", markup=False),
        console=console, disable=not enabled, transient=False,
    )
    with progress:
        task = progress.add_task(description, total=total, label="")

        def advance(label: str) -> None:
            progress.update(task, advance=1, label=label)

        yield advance


class Budget:
    """The tuning budget of one run: ``budget()`` is ``None`` while time is left, else the reason.
    The clock starts at the first call; ``seconds=None`` never runs out."""

    def __init__(self, seconds: float | None = None, clock: Callable[[], float] | None = None):
        import time

        self.seconds = seconds
        self._clock = clock or time.monotonic
        self._start: float | None = None

    def __call__(self) -> str | None:
        if self.seconds is None:
            return None
        now = self._clock()
        if self._start is None:
            self._start = now
        if now - self._start >= self.seconds:
            return f"not run: the tuning budget of {self.seconds:g} s was spent"
        return None


class Profiler:
    """Profiles signatures on the present GPUs, through the tuning cache, once per signature.

    ``candidates_for(sig) -> list[Candidate]`` supplies the candidates (the kernels' registry).
    Results already in ``cache`` for this exact device fingerprint and kernel source are reused;
    new results (failures included) are written back. With several ``devices`` (all of one model)
    and ``isolate=True``, ``profile_many`` spreads signatures over one worker per GPU, each worker
    pinned to its device (``CUDA_VISIBLE_DEVICES``; with one device too, so that a target GPU at
    index 1 is the one measured). Use as a context manager (or ``close()``) so the workers are shut
    down.

    ``workers_per_gpu`` (isolated only) starts that many workers on each GPU: signatures are spread
    over all of them, each worker builds its candidates (cuDNN plan builds took 36 of the 83 s of a
    cold ResNet-50 tuning on the H200, one at a time) while another holds the GPU, and the checks and
    timings take turns on one lock per GPU (``_gpu_turn``), so no measurement overlaps another's.

    ``budget_s`` caps the whole run's tuning time (``Budget``): candidates not reached by then are
    ``skipped`` and their signatures' results say ``cut_short``. ``precompile(jobs, arch)`` (optional)
    compiles every kernel the pending candidates will build, in parallel, before any is timed: jobs
    are the ``(source, instance)`` pairs of each candidate's ``kernels(sig)``.
    """

    def __init__(self, candidates_for: Callable[[Signature], Sequence[Candidate]], *, timer: Timer, checker: Checker,
                 device=None, devices=None, buffers: Callable[[Signature], tuple[list, list]] = no_buffers,
                 cache=None, isolate: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S,
                 budget_s: float | None = None, precompile: Callable[[list, str], Any] | None = None,
                 workers_per_gpu: int = 1):
        devs = list(devices) if devices else ([device] if device is not None else [])
        if not devs:
            raise ValueError("Profiler needs the device (or devices) to profile on")
        self.candidates_for = candidates_for
        self.devices = devs
        self.device = devs[0]
        self.cache = cache
        self.memo: dict[str, ProfileResult] = {}
        self._profile_kw = dict(timer=timer, checker=checker, buffers=buffers, isolate=isolate,
                                compute_capability=self.device.compute_capability, arch=self.device.arch,
                                timeout_s=timeout_s, deadline=Budget(budget_s))
        self.precompile = precompile
        self.clock = TuningTime()
        self._profile_kw["clock"] = self.clock
        self._lock_dir = None
        if isolate:
            per = max(1, int(workers_per_gpu))
            if per > 1:  # workers sharing a GPU take turns on it (_gpu_turn) through one lock file per GPU
                self._lock_dir = tempfile.mkdtemp(prefix="graphopt-tune-locks-")
            self._runners = [
                IsolatedRunner(timer, checker, buffers, d.arch, timeout_s=timeout_s, device_index=d.index,
                               gpu_lock=os.path.join(self._lock_dir, f"gpu{d.index}.lock") if self._lock_dir else None)
                for d in devs for _ in range(per)
            ]
        else:  # one process, one device at a time: no spreading without isolation
            self._runners = [InlineRunner(timer, checker, buffers, self.device.arch, device_index=self.device.index)]

    def source_hashes(self, sig: Signature) -> dict[str, str]:
        return {c.key(): c.source_hash() for c in self.candidates_for(sig)}

    def tuning_time(self) -> dict:
        """The :class:`TuningTime` breakdown of everything this profiler ran."""
        self.clock.workers = sum(getattr(r, "workers_started", 0) for r in self._runners)
        return self.clock.to_dict()

    def _prepare(self, sig: Signature) -> tuple[list[Candidate], dict[str, CandidateResult]]:
        t0 = time.perf_counter()
        try:
            return self._prepare_timed(sig)
        finally:
            self.clock.add("list", time.perf_counter() - t0)

    def _prepare_timed(self, sig: Signature) -> tuple[list[Candidate], dict[str, CandidateResult]]:
        candidates = list(self.candidates_for(sig))
        known: dict[str, CandidateResult] = {}
        if self.cache is not None:
            hashes = {c.key(): c.source_hash() for c in candidates}
            for ckey, rec in self.cache.lookup(self.device.fingerprint(), sig.key(), hashes).items():
                known[ckey] = CandidateResult(
                    candidate=ckey, lowering=rec.lowering, params=rec.params, source_hash=rec.source_hash,
                    status=OK if rec.ok else rec.status, ms=rec.ms, samples=rec.samples, reason=rec.reason,
                    cached=True,
                )
        return candidates, known

    def _store(self, sig: Signature, result: ProfileResult) -> None:
        if self.cache is not None:
            from graphopt.tune.cache import records_for

            fresh = [r for r in result.results if not r.cached and (r.ok or r.status in CACHEABLE_FAILURES)]
            self.cache.put_many(records_for(self.device.fingerprint(), sig.key(), sig.op, fresh))
        self.memo[sig.key()] = result

    def __call__(self, sig: Signature) -> ProfileResult:
        key = sig.key()
        if key not in self.memo:
            candidates, known = self._prepare(sig)
            runner = next((r for r in self._runners if not r.broken), self._runners[0])  # skip a retired GPU
            result = profile_node(sig, candidates, known=known, runner=runner, **self._profile_kw)
            self._store(sig, result)
        return self.memo[key]

    def profile_many(self, sigs: Sequence[Signature], advance: Callable[[str], None] | None = None) -> None:
        """Profile every distinct signature not yet done, one worker per GPU; fills the memo.

        Partitioning is dynamic: each signature goes to exactly one worker, whichever GPU is free
        next (signatures differ a lot in cost, so a fixed split would leave GPUs idle). A worker
        that cannot start is retired and its signature is profiled on another GPU; only when every
        worker is broken do the results say ``worker_failed``. The merge is deterministic: results
        enter the memo and the cache in the order of ``sigs`` (each as soon as all earlier ones are
        in), whichever GPU finished first; the progress bar advances as signatures complete. The
        cache is read and written on this thread only; worker threads just wait on their worker
        process.
        """
        todo: list[Signature] = []
        keys: set[str] = set()  # membership only
        for sig in sigs:
            k = sig.key()
            if k not in self.memo and k not in keys:
                keys.add(k)
                todo.append(sig)
        prepared = [self._prepare(sig) for sig in todo]
        # our kernels compile in parallel processes while the vendor candidates are timed
        compiling = threading.Thread(target=self._precompile, args=(todo, prepared), name="graphopt-precompile")
        compiling.start()
        try:
            self._profile_all(todo, prepared, advance)
        finally:
            compiling.join()

    def _profile_all(self, todo, prepared, advance) -> None:
        if len(self._runners) == 1 or len(todo) < 2:
            for sig, (candidates, known) in zip(todo, prepared):
                runner = next((r for r in self._runners if not r.broken), self._runners[0])
                self._store(sig, profile_node(sig, candidates, known=known, runner=runner, **self._profile_kw))
                if advance:
                    advance(sig.op)
            return
        from concurrent.futures import ThreadPoolExecutor, as_completed

        free: "queue.Queue" = queue.Queue()
        for r in self._runners:
            free.put(r)
        lock = threading.Lock()
        alive = [len(self._runners)]

        def work(sig, candidates, known):
            while True:
                runner = free.get()
                try:
                    result = profile_node(sig, candidates, known=known, runner=runner, **self._profile_kw)
                except BaseException:
                    free.put(runner)  # a bug, not a candidate's failure: let the other threads finish
                    raise
                if runner.broken:
                    with lock:
                        retire = alive[0] > 1
                        if retire:
                            alive[0] -= 1
                    if retire:
                        continue  # this GPU's worker cannot start: profile the signature on another
                free.put(runner)  # (the last runner stays, broken or not, so no thread waits forever)
                return result

        done: dict[int, ProfileResult] = {}
        merged = 0
        with ThreadPoolExecutor(max_workers=len(self._runners), thread_name_prefix="graphopt-tune") as pool:
            futures = {}
            for i, (sig, (candidates, known)) in enumerate(zip(todo, prepared)):
                futures[pool.submit(work, sig, candidates, known)] = i
            for fut in as_completed(futures):
                i = futures[fut]
                done[i] = fut.result()
                while merged in done:
                    self._store(todo[merged], done.pop(merged))
                    merged += 1
                if advance:
                    advance(todo[i].op)

    def kernel_jobs(self, sigs: Sequence[Signature], prepared) -> list[tuple[str, str]]:
        """The distinct ``(source, instance)`` kernels the candidates still to be timed will build."""
        cc = self.device.compute_capability
        jobs: dict[tuple[str, str], None] = {}
        for sig, (candidates, known) in zip(sigs, prepared):
            for cand in candidates:
                kernels = getattr(cand, "kernels", None)
                if kernels is None or cand.key() in known:
                    continue
                try:
                    if cand.applies(sig, cc):
                        continue
                    jobs.update(dict.fromkeys(tuple(j) for j in kernels(sig)))
                except Exception:  # noqa: BLE001 - the build reports it, in the worker
                    continue
        return list(jobs)

    def _precompile(self, sigs, prepared) -> None:
        if self.precompile is None or not sigs:
            return
        t0 = time.perf_counter()
        jobs = self.kernel_jobs(sigs, prepared)
        if jobs:
            try:
                self.precompile(jobs, self.device.arch)
            except Exception:  # noqa: BLE001 - only a speed-up: each build compiles what is missing
                pass
        self.clock.add("compile", time.perf_counter() - t0)

    def close(self) -> None:
        for r in self._runners:
            r.close()
        if self._lock_dir:
            import shutil

            shutil.rmtree(self._lock_dir, ignore_errors=True)
            self._lock_dir = None

    def __enter__(self) -> "Profiler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = [
    "BUILD_FAILED", "CACHEABLE_FAILURES", "CRASHED", "CUT_SHORT", "ERROR", "OK", "OOM", "PRUNED", "SKIPPED", "TIMEOUT",
    "WORKER_FAILED", "WRONG", "Budget", "CandidateResult", "Checker", "FakeTimer", "Profiler", "TuningTime", "InlineRunner", "IsolatedRunner", "ProfileResult", "Timer",
    "no_buffers", "node_progress", "profile_node",
]
