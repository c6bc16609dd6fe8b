"""Host time of the runtime without CUDA graphs: what an eager ``Session.run`` costs the CPU.

The one method ``graphopt bench``, ``bench/e2e.py`` (``host_us_per_node``) and
``bench/host_overhead.py`` share (issue 15: at most 15 us per node).

What is timed: the wall time of one ``sess.run`` (feed checks, the compiled loop, every launch),
with the device synchronised *before* the timed region and *after* it, never inside it. Before
each timed run a *hold kernel* is enqueued on the session's stream: it spins on the GPU for longer
than the run takes on the host, so none of the run's work can start, finish or be waited for while
the host enqueues it, whatever the batch size. Without it, at batch 32 the GPU needs longer per
step than the host (ResNet-50: ~26 us against ~11), so the run's tail could meet anything that
waits on device progress (a full launch queue, a pool that synchronises) and count device time as
host time; with it the figure is the same at every batch size unless the host itself blocks.
Whether the hold lasted is checked (an event recorded after the hold kernel must still be pending
when the timed run returns); a hold that ended early is doubled and the run timed again.

When the hold cannot outlast a run (``held`` false: some step waited for the device, so the run's
wall time includes the hold), :func:`blocking_steps` names the steps that wait: each step is timed on
the host with the GPU held, and a step that takes most of the hold waited for it (a synchronous
copy, a pageable-memory upload, an allocation that frees, a library call that synchronises). After
each such step the device is drained and held again (the drain is not host time: it is left out of
the run's figure), so every blocking step of the run is found, not just the first, and the steps
after it are not paced by a queue the first hold filled.
A second held run tells the causes apart: the device is synchronised and held afresh right before each
such step, so it runs first behind an empty queue. One that waits again waits for the device itself
(``SYNC``: host time, the wall figure stands); one that does not waited for room in the launch queue
that the work enqueued behind the hold had filled (``QUEUE``; on the H200 GPT-2 bs1's 66th replayed
step graph, whatever the hold's length, 2026-12-05). The queue wait is device time: for such a run
(``queue_limited``) the headline is a held plan execution's host time (its loop and a ~0.2 us timing
hook per step included) less the queue waits, each waiting step counted at the median step's time;
``host_us_per_node_wall`` keeps the plain figure. Where no queue wait is found, or some step waits
for the device itself, the wall figure stands.

Reported per run (``HostTime``): the best and the median wall time, and the thread's CPU time
(``time.thread_time``) of the same run: wall well above CPU time means the thread waited (blocked
in the driver, or descheduled), which the wall figure keeps: nothing is subtracted. The headline
``us_per_step`` is the best run's wall time divided by the plan's steps (as before this module).
The ``idle_*`` fields time the same runs without the hold (the method before 2026-12-05), for
comparison only.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

HOLD_SOURCE = r'''
extern "C" __global__ void graphopt_hold(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
'''
_HOLD: list = []
MIN_HOLD_US = 2000.0
MAX_HOLD_US = 500_000.0


def cuda_hold(cupy) -> Callable[[Any, float], Any]:
    """``hold(stream, us) -> event``: a kernel that keeps ``stream`` busy for ``us`` microseconds of
    GPU time, and an event recorded after it (pending while the hold lasts)."""
    if not _HOLD:
        _HOLD.append(cupy.RawKernel(HOLD_SOURCE, "graphopt_hold"))
    kernel = _HOLD[0]

    def hold(stream, us: float):
        with stream:
            kernel((1,), (1,), (cupy.uint64(int(us * 1000)),))
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(stream)
        return ev

    return hold


@dataclass
class HostTime:
    steps: int
    wall_us: list = field(default_factory=list)      # per timed run (GPU held)
    cpu_us: list = field(default_factory=list)       # thread CPU time of the same runs
    idle_wall_us: list = field(default_factory=list)  # the same run with the GPU idle at its start (no hold)
    held: bool = False                               # every timed run had the GPU held throughout
    hold_us: float = 0.0
    blocking: list = field(default_factory=list)     # steps that waited for the device (when not held)
    queue_excluded_us: float | None = None           # a run's host time less full-queue waits (when not held)

    @property
    def queue_limited(self) -> bool:
        """The run filled the launch queue behind the hold and no step waits for the device itself."""
        return not self.held and self.queue_excluded_us is not None

    @property
    def us_per_step(self) -> float:
        if self.queue_limited:
            return self.queue_excluded_us / self.steps
        return min(self.wall_us) / self.steps

    def to_dict(self) -> dict:
        per = self.steps

        def r(x):
            return None if x is None else round(x, 2)

        method = "wall time of one Session.run, GPU held by a spin kernel, synchronised outside the timed region"
        if self.queue_limited:
            method = (f"the run filled the launch queue behind the hold ({QUEUE}: blocking_steps), so: a held "
                      "plan execution's host time less those waits, each waiting step counted at the median "
                      "step's time; the plain wall time is host_us_per_node_wall")
        return {"steps": self.steps, "host_us_per_node": r(self.us_per_step),
                **({"host_us_per_node_wall": r(min(self.wall_us) / per)} if self.queue_limited else {}),
                "host_us_per_node_median": r(statistics.median(self.wall_us) / per),
                "host_cpu_us_per_node": r(min(self.cpu_us) / per) if self.cpu_us else None,
                "host_idle_gpu_us_per_node": r(min(self.idle_wall_us) / per) if self.idle_wall_us else None,
                "gpu_held": self.held, "hold_us": r(self.hold_us), "runs": len(self.wall_us),
                **({"blocking_steps": self.blocking} if self.blocking else {}),
                "method": method}


def _device_feeds(sess, feeds: Mapping[str, Any]) -> dict:
    """The feeds on the session's device once, outside every timed region."""
    if sess.device == "cuda":
        cupy = sess.backend.cupy
        return {k: cupy.asarray(v) for k, v in feeds.items()}
    return dict(feeds)


def measure(sess, feeds: Mapping[str, Any], repeats: int = 20, *, hold: Callable | None = None,
            warmup: int = 3, idle: bool = True, block_hold_us: float = 100_000.0) -> HostTime:
    """Time ``repeats`` eager runs of ``sess`` (built with ``cuda_graphs=False``) as the module docstring says.

    ``warmup`` runs first (trace, then each step's CUDA graph recorded on its second run); ``hold``
    defaults to :func:`cuda_hold` on cuda and to nothing elsewhere (no device to wait for)."""
    dev = _device_feeds(sess, feeds)
    cuda = sess.device == "cuda"
    if hold is None and cuda:
        hold = cuda_hold(sess.backend.cupy)
    for _ in range(max(1, warmup)):
        sess.run(dev)
        sess.synchronize()
    res = HostTime(steps=max(1, len(sess.last_plan.steps)))
    hold_us = MIN_HOLD_US
    held_all = hold is not None
    runs = max(1, repeats)
    k = 0
    while k < runs:
        k += 1
        ev, waited = None, False
        for _attempt in range(8):
            sess.synchronize()
            ev = hold(sess.backend.stream, hold_us) if hold is not None else None
            c0 = time.thread_time()
            t0 = time.perf_counter()
            sess.run(dev)
            t1 = time.perf_counter()
            c1 = time.thread_time()
            if ev is None or not ev.done:
                break
            if hold_us >= MAX_HOLD_US:  # even the longest hold ended: some step waits for the device
                waited = True
                break
            hold_us = min(MAX_HOLD_US, max(hold_us * 2, 3 * (t1 - t0) * 1e6))  # the hold ended early: longer
        else:
            waited = True
        if waited:
            # a run that waits for the device waits out any hold: no retries, and 3 runs in all
            # (each costs the hold), so that the measurement stays short; blocking_steps says why
            held_all = False
            runs = min(runs, max(k, 3))
        sess.synchronize()
        res.wall_us.append((t1 - t0) * 1e6)
        res.cpu_us.append((c1 - c0) * 1e6)
        if idle and hold is not None:
            sess.synchronize()
            t0 = time.perf_counter()
            sess.run(dev)
            res.idle_wall_us.append((time.perf_counter() - t0) * 1e6)
            sess.synchronize()
    res.held, res.hold_us = held_all, hold_us if hold is not None else 0.0
    if hold is not None and not held_all:
        res.queue_excluded_us, res.blocking = queue_excluded_us(sess, feeds, hold=hold, hold_us=block_hold_us)
    return res


BLOCK_HOLD_US = 100_000.0
QUEUE = "launch queue full"  # a step that waits only where the queue behind the hold is full
SYNC = "waits for the device"  # a step that waits even when it is the first behind a fresh hold


def _warm(sess, feeds: Mapping[str, Any], hold: Callable | None) -> tuple[dict, Callable]:
    """(the feeds on the device, the hold: ``cuda_hold`` unless given) after one synchronised run,
    so ``sess.last_plan`` is the compiled plan the held step-by-step runs execute."""
    dev = _device_feeds(sess, feeds)
    sess.run(dev)
    sess.synchronize()
    return dev, hold if hold is not None else cuda_hold(sess.backend.cupy)


def _held_step_times(sess, dev: dict, hold: Callable, hold_us: float, drain_before: frozenset = frozenset()):
    """One eager run behind a ``hold_us`` hold, each ``step.run`` timed on the host: ``[(label,
    lowering, us)]``, the indices of the steps that waited (over half the hold; the GPU is held
    again after each) and the whole plan execution's host us (its loop and the hook included).
    Before the steps in ``drain_before`` the device is synchronised and held afresh, so such a step
    is the first work behind an empty queue."""
    plan = sess.last_plan
    stream = sess.backend.stream
    clock = time.perf_counter
    times: list = []
    waited: list[int] = []
    drained = [0.0]  # us spent draining the device inside the run: not the run's host time

    def timed(step, ins):
        k = len(times)
        if k in drain_before:
            d0 = clock()
            sess.synchronize()
            hold(stream, hold_us)
            drained[0] += (clock() - d0) * 1e6
        t0 = clock()
        outs = step.run(ins)
        us = (clock() - t0) * 1e6
        times.append((step.label, step.lowering, us))
        if us > hold_us / 2:
            waited.append(k)
            # The hold ended, but the work it held back may still fill the launch queue: a hold enqueued
            # behind it would start only after it, and until then every launch waits for a free slot,
            # each wait under the detection threshold (BERT fp32 bs32 on the H100, 2026-12-06: 25 us a
            # step against 11 of CPU time). Drain the device first, then hold it again for the next one.
            d0 = clock()
            sess.synchronize()
            hold(stream, hold_us)
            drained[0] += (clock() - d0) * 1e6
        return outs

    hold(stream, hold_us)
    with stream:
        t0 = clock()
        plan.execute(sess._convert_feeds(dev), timed)
        run_us = (clock() - t0) * 1e6 - drained[0]
    sess.synchronize()
    return times, waited, run_us


def _classified_waits(sess, dev: dict, hold: Callable, hold_us: float) -> tuple[list, list[int], list[dict], float]:
    """(step times of a held run, the indices of the steps that waited in it, those steps each with
    its cause, the run's host us): a step that waits again when it runs first behind a fresh hold
    waits for the device itself (``SYNC``: a
    synchronous copy or call); one that does not waited only because the work enqueued before it
    filled the launch queue behind the hold (``QUEUE``: device time, not host time; measured on
    the H200, 2026-12-05: GPT-2 bs1's 66th replayed step graph, whatever the hold's length)."""
    times, waited, run_us = _held_step_times(sess, dev, hold, hold_us)
    found: list[dict] = []
    if waited:
        _, waited2, _ = _held_step_times(sess, dev, hold, hold_us, frozenset(waited))
        for k in waited:
            label, lowering, us = times[k]
            found.append({"step": label, "lowering": lowering, "us": round(us, 1),
                          "cause": SYNC if k in waited2 else QUEUE})
    return times, waited, found, run_us


def blocking_steps(sess, feeds: Mapping[str, Any], *, hold: Callable | None = None,
                   hold_us: float = BLOCK_HOLD_US) -> list[dict]:
    """The steps of one eager run that wait for the device: ``[{"step", "lowering", "us", "cause"}]``
    in run order. The GPU is held for ``hold_us`` before the run and again after every step found
    waiting; a step whose host time exceeds half the hold waited for it (no step's own host work
    comes near 50 ms); ``cause`` says whether it waits for the device itself or for room in the
    launch queue (``_classified_waits``). Empty off cuda or when nothing waits."""
    if sess.device != "cuda":
        return []
    dev, hold = _warm(sess, feeds, hold)
    return _classified_waits(sess, dev, hold, hold_us)[2]


def queue_excluded_us(sess, feeds: Mapping[str, Any], *, hold: Callable | None = None, runs: int = 3,
                      hold_us: float = BLOCK_HOLD_US) -> tuple[float | None, list[dict]]:
    """(host us of one run without the waits for a full launch queue, the waiting steps): the best of
    ``runs`` held plan executions (the loop and a ~0.2 us timing hook per step included), less each
    ``QUEUE`` step's time, which counts at the median step's instead (its own launch, not the
    device's backlog). ``Session.run``'s per-run work outside the plan (feed checks: a few us a run)
    is not in it, and a step that waits less than half the hold for a queue slot to free stays in as
    host time. None when some step waits for the device itself (that wait is host time) or when no
    run finds a queue wait (nothing explains the wall figure): the run's wall time stands."""
    dev, hold = _warm(sess, feeds, hold)
    best, found = None, []
    for _ in range(max(1, runs)):
        times, waited, waits, run_us = _classified_waits(sess, dev, hold, hold_us)
        found = found or waits
        if not waited or any(w["cause"] == SYNC for w in waits):
            return None, waits or found
        queued = set(waited)
        rest = [t[2] for i, t in enumerate(times) if i not in queued]
        total = run_us - sum(times[i][2] for i in queued) + len(queued) * (statistics.median(rest) if rest else 0.0)
        best = total if best is None else min(best, total)
    return best, found


def per_op(sess, feeds: Mapping[str, Any], repeats: int = 5, *, hold: Callable | None = None) -> list:
    """``[op, steps, host us per run]`` by op type, costliest first: each ``step.run`` timed on the
    host inside a compiled run whose GPU is held as in :func:`measure` (no synchronisation inside
    the run; the timing hook's own ~0.2 us per step is included)."""
    from collections import defaultdict

    dev = _device_feeds(sess, feeds)
    cuda = sess.device == "cuda"
    if hold is None and cuda:
        hold = cuda_hold(sess.backend.cupy)
    sess.run(dev)
    sess.synchronize()
    t0 = time.perf_counter()
    sess.run(dev)
    hold_us = max(4 * MIN_HOLD_US, 3 * (time.perf_counter() - t0) * 1e6)  # longer than a timed run
    sess.synchronize()
    plan = sess.last_plan
    tot: dict[str, float] = defaultdict(float)
    clock = time.perf_counter

    def timed(step, ins):
        t0 = clock()
        outs = step.run(ins)
        tot[step.op] += clock() - t0
        return outs

    for _ in range(max(1, repeats)):
        sess.synchronize()
        if hold is not None:
            hold(sess.backend.stream, hold_us)
        if cuda:
            with sess.backend.stream:
                plan.execute(sess._convert_feeds(dev), timed)
        else:
            plan.execute(sess._convert_feeds(dev), timed)
        sess.synchronize()
    cnt: dict[str, int] = defaultdict(int)
    for s in plan.steps:
        cnt[s.op] += 1
    return sorted(([op, cnt[op], tot[op] / repeats * 1e6] for op in tot), key=lambda r: -r[2])
