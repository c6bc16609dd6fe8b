"""Which lowered steps of a compiled plan keep their stream barrier.

A lowering that declares ``barrier`` (cuDNN's and cuBLASLt's: their kernels may start before the
previous kernel on the stream has finished) enqueues one empty kernel before every launch
(``graphopt.lowering.barrier`` says why: without it a whole-plan CUDA graph of cuDNN lowerings
raced on the H200). The barrier works because it is a kernel launched normally: it starts only when
everything before it on the stream is complete, so whatever starts after it finds all earlier work
done. Right after another such kernel, which also releases nothing early (graphopt's own kernels,
CuPy's elementwise kernels), the library kernel cannot start before that kernel has *finished*,
which already comes after everything before it: the barrier orders nothing there and costs its
launch (0.9-1.5 us a call on the H200, the attention table's whole gap to torch's SDPA;
``bench/NOTES_kernels.md``, ninth session).

CuPy launches every kernel (RawKernel, elementwise) through ``cuLaunchKernel``, which takes no launch
attributes, so those are normal launches; graphopt's own kernel sources never release dependents.

So a barrier is dropped exactly where the step that last enqueued work before it is known to end
with such a kernel; everywhere else (after a library call, a memory copy, a step whose launches are
not known, at the plan's start) it stays. Steps that enqueue nothing (a Reshape that is a view) are
looked through. ``GRAPHOPT_KEEP_BARRIERS=1`` keeps every barrier (to compare, or should a library
ever be found to need one after an ordinary launch).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterable

import numpy as np

KEEP_ENV = "GRAPHOPT_KEEP_BARRIERS"
ORDINARY, OPAQUE, NOTHING = "ordinary", "opaque", "nothing"  # what a step's last stream work is


def step_end(step, lowered, direct: bool, arrays: list, block_of: list, feed_slots: set, elementwise: Iterable[str],
             pools: Iterable[str], reshapes: Iterable[str]) -> str:
    """What the last work ``step`` enqueues is: ``ORDINARY`` (a normally launched kernel that releases
    nothing early, for certain), ``NOTHING`` (no stream work: a Reshape that is a view of its input)
    or ``OPAQUE`` (anything else, or not known)."""
    outs = [arrays[s] for s in step.outputs if s is not None]
    if lowered is not None:
        low = lowered.lowering
        shapes = [lowered.out_shape] + [tuple(a.shape) for a in outs]
        if getattr(low, "ordinary", False) and all(int(np.prod(s)) > 0 for s in shapes):
            return ORDINARY
        return OPAQUE
    if step.kind == "std" and step.op in reshapes and step.outputs and step.outputs[0] is not None \
            and step.inputs and step.inputs[0] is not None and block_of[step.outputs[0]] == block_of[step.inputs[0]]:
        return NOTHING
    if not direct or len(outs) != 1 or int(outs[0].size) == 0:
        return OPAQUE
    if step.op in pools or (step.op in elementwise and step.op != "Transpose"):
        return ORDINARY  # one own pooling kernel / one CuPy elementwise kernel writing the arena view
    if step.op == "Transpose":
        src = step.inputs[0]
        if src is None or src in feed_slots:
            return OPAQUE  # a caller's array may come with any strides: CuPy may copy it with a memcpy
        return OPAQUE if _dense_after(arrays[src], step.node.attr("perm", None)) else ORDINARY
    return OPAQUE


def _dense_after(x: Any, perm) -> bool:
    """Whether ``x`` transposed by ``perm`` is C-contiguous (NumPy and CuPy ignore unit dimensions
    there, as ``cupy.copyto`` does): then CuPy copies it with a memcpy instead of an elementwise kernel."""
    return bool(x.transpose(tuple(perm) if perm is not None else None).flags.c_contiguous)


@contextlib.contextmanager
def all_barriers_kept():
    """Within it, plans compiled keep every lowering barrier (``GRAPHOPT_KEEP_BARRIERS=1``); the
    caller's own setting is restored after (for comparisons: the benches' every-barrier columns)."""
    before = os.environ.get(KEEP_ENV)
    os.environ[KEEP_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(KEEP_ENV, None)
        else:
            os.environ[KEEP_ENV] = before


def barrier_free(ends: list[str], needs: list[bool]) -> list[int]:
    """Indices ``k`` with ``needs[k]`` (the step's lowering declares a barrier) whose last earlier
    step with stream work ends ``ORDINARY``. ``ends[k]``: what step ``k`` enqueues last."""
    if os.environ.get(KEEP_ENV, "").strip() not in ("", "0"):
        return []
    out, before = [], OPAQUE  # at the plan's start: whatever the caller ran
    for k, (end, need) in enumerate(zip(ends, needs)):
        if need and before == ORDINARY:
            out.append(k)
        if end != NOTHING:
            before = end
    return out


def drop_needless_barriers(plan, arrays: list, block_of: list, direct_steps: set, feed_slots: set,
                           elementwise: Iterable[str], pools: Iterable[str], reshapes: Iterable[str]) -> None:
    """Bind the launch without its barrier for the lowered steps right after an ordinary launch, and
    count them in ``plan.barriers``. Called by ``graphopt.runtime.compiled.compile_plan`` before it
    builds the steps' closures (which read ``Lowered.launch``); ``direct_steps``: the indices of the
    standard steps it computes straight into their arena buffers."""
    lowereds = [getattr(step.run, "lowered", None) for step in plan.steps]
    ends = [step_end(step, lw, k in direct_steps, arrays, block_of, feed_slots, elementwise, pools, reshapes)
            for k, (step, lw) in enumerate(zip(plan.steps, lowereds))]
    needs = [lw is not None and bool(getattr(lw.lowering, "needs_barrier", False)) for lw in lowereds]
    free = barrier_free(ends, needs)
    for k in free:
        lowereds[k].launch = lowereds[k].lowering.unordered_launch
    # "unneeded": declared, but measured not to start early (graphopt.lowering.early_start; opt-in)
    unneeded = sum(lw is not None and bool(getattr(lw.lowering, "barrier", False)) and not need
                   for lw, need in zip(lowereds, needs))
    plan.barriers = {"kept": sum(needs) - len(free), "dropped": len(free), "unneeded": unneeded}
