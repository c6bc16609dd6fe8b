"""What profiling found: the result statuses, one candidate's result, one signature's results.

Every candidate gets a :class:`CandidateResult`, pruned and failed ones too (``ms`` is ``inf``, with
the reason); a :class:`ProfileResult` keeps them all for one signature, with the winner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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


__all__ = [
    "BUILD_FAILED", "CACHEABLE_FAILURES", "CRASHED", "CUT_SHORT", "ERROR", "OK", "OOM", "PRUNED", "SKIPPED", "TIMEOUT",
    "WORKER_FAILED", "WRONG", "CandidateResult", "ProfileResult",
]
