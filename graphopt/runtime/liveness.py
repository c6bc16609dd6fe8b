"""Liveness of a traced plan's slots: each step drops the slots it read last, and ``peak_bytes`` is
that schedule's peak of live activation bytes (views share their base's block), computed by
replaying the liveness over the recorded sizes."""

from __future__ import annotations

from typing import Any

ALIGN = 512  # CuPy's pool rounds every block to 512 bytes; the peak estimate does too


def liveness(plan, blocks: list, block_bytes: list) -> None:
    """Free each slot after its last use, and compute the peak of live activation bytes (``blocks``:
    each slot's memory-block token, views sharing their base's; ``block_bytes``: that block's size)."""
    n = plan.n_slots
    last = [-1] * n
    for k, step in enumerate(plan.steps):
        for s in step.inputs:
            if s is not None:
                last[s] = k
    for k, step in enumerate(plan.steps):
        for s in step.outputs:
            if s is not None and last[s] < k:
                last[s] = k  # an output nothing reads dies right after its step
    keep = {slot for _, slot in plan.outputs} | {slot for slot, _ in plan.constants}
    frees: list[list[int]] = [[] for _ in plan.steps]
    for s in range(n):
        if s in keep or last[s] < 0:
            continue
        frees[last[s]].append(s)
    for k, step in enumerate(plan.steps):
        step.free = tuple(frees[k])
    # peak estimate: blocks are shared by views; a block is live while any slot on it is live
    block_of = blocks
    size_of: dict[Any, int] = {}
    for nbytes, b in zip(block_bytes, block_of):
        size_of[b] = max(size_of.get(b, 0), -(-int(nbytes) // ALIGN) * ALIGN)
    const_blocks = {block_of[s] for s, _ in plan.constants}
    plan.constant_bytes = sum(size_of[b] for b in const_blocks)
    live_slots: dict[Any, int] = {}
    live = peak = 0
    for _, s in plan.inputs:
        b = block_of[s]
        if b not in live_slots:
            live += size_of[b]
        live_slots[b] = live_slots.get(b, 0) + 1
    peak = live
    for k, step in enumerate(plan.steps):
        for s in step.outputs:
            if s is None:
                continue
            b = block_of[s]
            if b in const_blocks:
                continue
            if b not in live_slots:
                live += size_of[b]
            live_slots[b] = live_slots.get(b, 0) + 1
        peak = max(peak, live)
        for s in step.free:
            b = block_of[s]
            if b in live_slots:
                live_slots[b] -= 1
                if live_slots[b] == 0:
                    del live_slots[b]
                    live -= size_of[b]
    plan.peak_bytes = peak
