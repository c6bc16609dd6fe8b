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

The steps of one candidate live in :mod:`graphopt.tune.candidate_run`, where it runs (a worker
process or this one) in :mod:`graphopt.tune.runners`, the results in :mod:`graphopt.tune.results`.
"""

from __future__ import annotations

import math
import os
import queue
import statistics
import tempfile
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from graphopt.lowering.contract import Candidate, Signature
from graphopt.tune.candidate_run import Checker, FakeTimer, Timer, describe_exc, no_buffers
from graphopt.tune.results import CACHEABLE_FAILURES, OK, PRUNED, SKIPPED, CandidateResult, ProfileResult
from graphopt.tune.runners import DEFAULT_TIMEOUT_S, InlineRunner, IsolatedRunner
from graphopt.tune.tuning_time import Budget, TuningTime

# How a candidate measured under its twin's key (``Candidate.same_as``) is reported: the start of its reason.
TWIN_REASON = "runs what "


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
    offered = {c.key() for c in candidates}
    for cand in candidates:
        ckey = cand.key()
        if ckey in seen:
            continue
        seen.add(ckey)
        base = dict(candidate=ckey, lowering=cand.name, params=cand.params_str(), source_hash=cand.source_hash())
        try:
            why_not = cand.applies(sig, compute_capability)
        except Exception as exc:  # noqa: BLE001 - a buggy applies() prunes, it does not crash
            why_not = f"applies() raised {describe_exc(exc)}"
        if not why_not:
            try:
                twin = cand.same_as(sig)
            except Exception:  # noqa: BLE001 - only a saving: the candidate is measured itself
                twin = None
            if twin and twin != ckey and twin in offered:  # one build, check and timing for the pair
                why_not = f"{TWIN_REASON}{twin} runs (measured under that key)"
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
        _run_todo(sig, todo, slots, runner, deadline, clock)
    finally:
        if own_runner:
            runner.close()
    result.results = [r for r in slots if r is not None]
    ok = [(r.ms, i, r) for i, r in enumerate(result.results) if r.ok]
    result.winner = min(ok)[2] if ok else None
    if memo is not None:
        memo[key] = result
    return result


def _run_todo(sig, todo, slots, runner, deadline, clock) -> None:
    """Runs ``todo`` ((slot, candidate) pairs) on ``runner`` in its batches (``batch_size``), filling
    ``slots``; a candidate that a batch left unrun (another failed first) goes into the next batch.
    ``deadline()`` is asked before each batch: once it gives a reason, the rest are ``skipped``."""
    size = max(1, int(getattr(runner, "batch_size", 1)))
    queue = list(todo)
    while queue:
        spent = deadline() if deadline is not None else None
        if spent:
            batch, replies = queue, [{"status": SKIPPED, "reason": spent} for _ in queue]
            queue = []
        else:
            batch, queue = queue[:size], queue[size:]
            t0 = time.perf_counter()
            replies = runner.run_batch(sig, [c for _, c in batch]) if len(batch) > 1 else [runner.run(sig, batch[0][1])]
            wall = time.perf_counter() - t0
            ran = [r for r in replies if r is not None]
            own = [sum(r.get("phases", {}).values()) for r in ran]
            overhead = max(0.0, wall - sum(own)) / max(1, len(ran))  # the batch's messaging, shared out
            if clock is not None:
                for (_, cand), r in zip(batch, replies):
                    if r is not None:
                        clock.add_run(cand.name, sum(r.get("phases", {}).values()) + overhead, r.get("phases", {}))
            queue = [item for item, r in zip(batch, replies) if r is None] + queue
        for (idx, cand), reply in zip(batch, replies):
            if reply is None:
                continue
            samples = tuple(reply.get("samples", ()))
            status = reply["status"]
            slots[idx] = CandidateResult(
                candidate=cand.key(), lowering=cand.name, params=cand.params_str(), source_hash=cand.source_hash(),
                status=status, ms=statistics.median(samples) if status == OK else math.inf,
                samples=samples, reason=reply.get("reason", ""),
            )


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
    timings take turns on one lock per GPU (``candidate_run._gpu_turn``), so no measurement overlaps another's.

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
        # signature key -> its candidates as listed for profiling: selection reads their layouts from
        # here instead of listing again (with cuDNN present a listing is its plans' names and candidates)
        self.listed: dict[str, list[Candidate]] = {}
        self._profile_kw = dict(timer=timer, checker=checker, buffers=buffers, isolate=isolate,
                                compute_capability=self.device.compute_capability, arch=self.device.arch,
                                timeout_s=timeout_s, deadline=Budget(budget_s))
        self.precompile = precompile
        self.clock = TuningTime()
        self._profile_kw["clock"] = self.clock
        self._lock_dir = None
        if isolate:
            per = max(1, int(workers_per_gpu))
            if per > 1:  # workers sharing a GPU take turns on it (candidate_run._gpu_turn) through one lock file per GPU
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
        self.listed[sig.key()] = candidates
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
            from graphopt.tune.cache_record import records_for

            fresh = [r for r in result.results if not r.cached and (r.ok or r.status in CACHEABLE_FAILURES)]
            self.cache.put_many(records_for(self.device.fingerprint(), sig.key(), sig.op, fresh))
        self.memo[sig.key()] = result

    def _profile_one(self, sig: Signature, candidates, known, runner) -> ProfileResult:
        """``profile_node`` on ``runner``, its wall time recorded (``TuningTime.signature``)."""
        t0 = time.perf_counter()
        result = profile_node(sig, candidates, known=known, runner=runner, **self._profile_kw)
        shape = "x".join(map(str, sig.input_shapes[0] or ())) if sig.input_shapes else ""
        self.clock.signature(sig.op, t0, time.perf_counter() - t0, sum(1 for c in candidates if c.key() not in known),
                             shape)
        return result

    def __call__(self, sig: Signature) -> ProfileResult:
        key = sig.key()
        if key not in self.memo:
            candidates, known = self._prepare(sig)
            runner = next((r for r in self._runners if not r.broken), self._runners[0])  # skip a retired GPU
            self._store(sig, self._profile_one(sig, candidates, known, runner))
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
                self._store(sig, self._profile_one(sig, candidates, known, runner))
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
                    result = self._profile_one(sig, candidates, known, runner)
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
    # defined here
    "Profiler", "profile_node",
    # re-exported from their homes: FakeTimer is documented here (docs/adding_a_fused_op.md), the
    # tuner imports DEFAULT_TIMEOUT_S from here
    "DEFAULT_TIMEOUT_S", "FakeTimer",
]
