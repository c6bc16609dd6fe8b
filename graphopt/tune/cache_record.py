"""One tuning-cache entry: :class:`TimingRecord`, its key, and its forms (a database row, profiler results)."""

from __future__ import annotations

import json
import math
import sqlite3
import time
from dataclasses import asdict, dataclass
from typing import Iterable

from graphopt.tune.gpus import DeviceFingerprint

KEY_COLUMNS = ("gpu", "compute_capability", "driver", "cuda", "cupy", "source_hash", "candidate", "signature")
ALL_COLUMNS = KEY_COLUMNS + ("op", "lowering", "params", "ms", "status", "reason", "samples", "origin", "created")


@dataclass(frozen=True)
class TimingRecord:
    """One cached measurement (or failure) of one candidate on one signature on one device."""

    gpu: str
    compute_capability: str
    driver: str
    cuda: str
    cupy: str
    source_hash: str
    candidate: str
    signature: str
    op: str
    lowering: str
    params: str
    ms: float  # math.inf for a failure
    status: str = "ok"
    reason: str = ""
    samples: tuple[float, ...] = ()
    origin: str = "local"
    created: float = 0.0

    @property
    def ok(self) -> bool:
        return math.isfinite(self.ms)

    @property
    def fingerprint(self) -> DeviceFingerprint:
        return DeviceFingerprint(self.gpu, self.compute_capability, self.driver, self.cuda, self.cupy)

    def key(self) -> tuple[str, ...]:
        return tuple(getattr(self, c) for c in KEY_COLUMNS)

    def to_json(self) -> dict:
        d = asdict(self)
        d["ms"] = self.ms if self.ok else None
        d["samples"] = list(self.samples)
        return d


def record_from_row(row: sqlite3.Row) -> TimingRecord:
    return TimingRecord(
        gpu=row["gpu"], compute_capability=row["compute_capability"], driver=row["driver"],
        cuda=row["cuda"], cupy=row["cupy"], source_hash=row["source_hash"], candidate=row["candidate"],
        signature=row["signature"], op=row["op"], lowering=row["lowering"], params=row["params"],
        ms=math.inf if row["ms"] is None else float(row["ms"]), status=row["status"], reason=row["reason"],
        samples=tuple(float(x) for x in json.loads(row["samples"])), origin=row["origin"],
        created=float(row["created"]),
    )


def record_row(r: TimingRecord) -> tuple:
    """The database row of ``r``, in ``ALL_COLUMNS`` order."""
    created = r.created or time.time()
    return (
        r.gpu, r.compute_capability, r.driver, r.cuda, r.cupy, r.source_hash, r.candidate,
        r.signature, r.op, r.lowering, r.params, r.ms if r.ok else None, "ok" if r.ok else (r.status if r.status != "ok" else "error"), r.reason,
        json.dumps([float(x) for x in r.samples]), r.origin, created,
    )


def records_for(
    fingerprint: DeviceFingerprint, signature: str, op: str, results: Iterable, *, now: float | None = None
) -> list[TimingRecord]:
    """Build cache records from profiler ``CandidateResult``s (pruned candidates are not stored)."""
    now = time.time() if now is None else now
    out = []
    for r in results:
        if r.status == "pruned":
            continue
        out.append(
            TimingRecord(
                gpu=fingerprint.gpu, compute_capability=fingerprint.compute_capability,
                driver=fingerprint.driver, cuda=fingerprint.cuda, cupy=fingerprint.cupy,
                source_hash=r.source_hash, candidate=r.candidate, signature=signature, op=op,
                lowering=r.lowering, params=r.params, ms=r.ms, status=r.status, reason=r.reason,
                samples=tuple(r.samples), origin="local", created=now,
            )
        )
    return out


__all__ = ["ALL_COLUMNS", "KEY_COLUMNS", "TimingRecord", "record_from_row", "record_row", "records_for"]
