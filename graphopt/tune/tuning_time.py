"""A tuning run's time: where its seconds went (:class:`TuningTime`) and its limit (:class:`Budget`)."""

from __future__ import annotations

import threading
import time
from typing import Callable, Mapping


class TuningTime:
    """Where a tuning run's seconds went, summed over candidates (thread-safe: ``profile_many`` adds
    from one thread per GPU). Phases: ``list`` (candidates and cuDNN plan lists made, cache looked
    up), ``compile`` (the parallel precompile), ``worker_start`` (isolated workers started, again
    after each failure), ``build`` / ``check`` / ``time`` (in the worker, per candidate), ``other``
    (messaging and bookkeeping: a candidate's wall time less its phases). ``by_lowering`` splits the
    per-candidate seconds by lowering name, ``runs`` counts candidates run, ``workers`` workers
    started. ``signature`` records each signature's wall time on its worker (start from the first,
    seconds, candidates), so the slowest signatures and the tail of a parallel tuning show. Reported as
    ``tuning_time`` in the report, so a slow tuning says why."""

    SLOWEST = 8  # signatures listed in the report

    def __init__(self):
        self._lock = threading.Lock()
        self.phases: dict[str, float] = {}
        self.by_lowering: dict[str, float] = {}
        self.runs_by_lowering: dict[str, int] = {}
        self.lowering_phases: dict[str, dict[str, float]] = {}
        self.runs = 0
        self.workers = 0
        self.signatures: list[tuple[float, float, str, int, str]] = []  # (start, seconds, op, candidates, shape)

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

    def signature(self, op: str, start: float, seconds: float, candidates: int, shape: str = "") -> None:
        """One signature profiled: ``start`` in ``time.perf_counter`` seconds, its wall ``seconds``,
        ``shape`` its first input's (``32x64x56x56``: which node it is)."""
        with self._lock:
            self.signatures.append((start, seconds, op, candidates, shape))

    def _signatures_dict(self) -> dict:
        if not self.signatures:
            return {}
        t0 = min(r[0] for r in self.signatures)
        end = max(r[0] + r[1] for r in self.signatures)
        slowest = sorted(self.signatures, key=lambda r: (-r[1], r[0]))[:self.SLOWEST]
        return {"profile_wall_s": round(end - t0, 3),
                "slowest_signatures": [{"op": op, "shape": shape, "seconds": round(d, 3), "start_s": round(s - t0, 3),
                                        "candidates": n} for s, d, op, n, shape in slowest]}

    def to_dict(self) -> dict:
        with self._lock:
            return {**self._signatures_dict(), "phases_s": {k: round(v, 3) for k, v in sorted(self.phases.items())},
                    "by_lowering_s": {k: round(v, 3) for k, v in sorted(self.by_lowering.items())},
                    "runs_by_lowering": dict(sorted(self.runs_by_lowering.items())),
                    "lowering_phases_s": {k: {p: round(v, 3) for p, v in sorted(d.items())}
                                          for k, d in sorted(self.lowering_phases.items())},
                    "candidates_run": self.runs, "workers_started": self.workers}


class Budget:
    """The tuning budget of one run: ``budget()`` is ``None`` while time is left, else the reason.
    The clock starts at the first call; ``seconds=None`` never runs out."""

    def __init__(self, seconds: float | None = None, clock: Callable[[], float] | None = None):
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


__all__ = ["Budget", "TuningTime"]
