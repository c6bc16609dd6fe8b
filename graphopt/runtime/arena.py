"""One device allocation for a plan's activations and workspaces: offsets assigned by liveness.

Each buffer the compiled plan owns is an ``Interval``: its size and the steps ``[start, end]``
during which it is live (written at ``start``, last read at ``end``; a workspace lives for its own
step only). Two buffers may share bytes only when their lifetimes are disjoint.

``assign`` is a greedy best-fit: buffers in order of decreasing size (then earlier start), each
placed at the lowest-waste gap among the buffers already placed that overlap it in time. Written
by hand because no library we depend on does it: CuPy's pool is a size-keyed free list with no
notion of a schedule, and the planners that do this job (TVM's and XLA's buffer assignment,
PyTorch's static memory planning in the Inductor) are inside compilers, not reusable packages.
Best-fit by size is the classic heuristic of those planners; it reaches the lower bound (the most
bytes live at one step) on chains and usually comes within a few percent of it elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGN = 256  # bytes: every buffer starts on a 256-byte boundary (what cuBLAS and vector loads want)


@dataclass(frozen=True)
class Interval:
    key: object  # what the buffer is (a slot's block, a step's workspace)
    size: int
    start: int
    end: int

    def overlaps(self, other: "Interval") -> bool:
        return self.start <= other.end and other.start <= self.end


def aligned(n: int) -> int:
    return -(-int(n) // ALIGN) * ALIGN


def assign(intervals: list[Interval]) -> tuple[dict[object, int], int]:
    """``({key: byte offset}, arena bytes)``: no two intervals live at the same step share a byte."""
    order = sorted(intervals, key=lambda iv: (-aligned(iv.size), iv.start, iv.end))
    placed: list[tuple[int, int, Interval]] = []  # (offset, aligned size, interval)
    offsets: dict[object, int] = {}
    total = 0
    for iv in order:
        size = aligned(iv.size)
        busy = sorted((off, off + sz) for off, sz, other in placed if other.overlaps(iv))
        best, best_waste, cursor = None, None, 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= size and (best_waste is None or gap - size < best_waste):
                best, best_waste = cursor, gap - size
            cursor = max(cursor, hi)
        offset = best if best is not None else cursor
        offsets[iv.key] = offset
        placed.append((offset, size, iv))
        total = max(total, offset + size)
    return offsets, total


def live_peak(intervals: list[Interval]) -> int:
    """The most (aligned) bytes live at any one step: the lower bound of any assignment."""
    if not intervals:
        return 0
    last = max(iv.end for iv in intervals)
    delta = [0] * (last + 2)
    for iv in intervals:
        delta[iv.start] += aligned(iv.size)
        delta[iv.end + 1] -= aligned(iv.size)
    peak = live = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak


def overlapping_pairs(intervals: list[Interval], offsets: dict[object, int]) -> list[tuple[object, object]]:
    """Pairs of intervals live at the same step whose byte ranges intersect (empty when the assignment is valid)."""
    bad = []
    for i, a in enumerate(intervals):
        for b in intervals[i + 1:]:
            if a.overlaps(b):
                oa, ob = offsets[a.key], offsets[b.key]
                if oa < ob + aligned(b.size) and ob < oa + aligned(a.size):
                    bad.append((a.key, b.key))
    return bad
