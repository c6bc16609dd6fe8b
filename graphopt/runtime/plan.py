"""The execution plan: one per input-shape signature, built by tracing one run.

``trace(graph, backend, feeds)`` walks the graph in topological order and runs it once. Every value
is either a *host value* (a NumPy array known at plan time: initializers, ``Constant`` outputs,
``Shape``/``Size`` of any tensor, and anything computed only from host values, which is folded
here with NumPy) or a *device value* held in a numbered slot. Only nodes that touch device values
become ``Step``s, so the shape arithmetic of an export (Shape -> Gather -> Concat -> Reshape ...)
costs nothing at run time, and the inputs ops read on the host (Reshape's shape, Slice's starts,
Expand's shape, ...; ``ops_std.HOST_INPUTS``) are resolved here, never by a device -> host read
inside a run. A step whose host input is a device value (a data-dependent shape) reads it at run
time: the plan is then ``dynamic``; it is rebuilt on every run and never captured.

After the trace the plan knows every slot's shape, dtype and last use: ``Plan.execute`` drops each
slot after its last use so the memory pool reuses the block (CuPy's pool is a free list by size),
and ``peak_bytes`` is that schedule's peak of live activation bytes (views share their base's
block), computed by replaying the liveness over the recorded sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from graphopt.runtime import ops_std

ALIGN = 512  # CuPy's pool rounds every block to 512 bytes; the peak estimate does too


@dataclass
class Step:
    """One node that runs on the device: ``run(device inputs) -> device outputs``."""

    label: str  # "OpType node_name", for errors and the per-op profile
    op: str
    run: Callable[[list], list]
    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]
    free: tuple[int, ...] = ()
    capture: str | None = None  # why this step cannot be captured into a CUDA graph


@dataclass
class Plan:
    signature: tuple
    steps: list[Step]
    n_slots: int
    inputs: list[tuple[str, int]]
    constants: list[tuple[int, Any]]
    outputs: list[tuple[str, int]]
    slot_info: list[tuple[tuple[int, ...], str]] = field(default_factory=list)  # (shape, dtype) per slot
    peak_bytes: int = 0
    constant_bytes: int = 0
    folded: int = 0
    dynamic: str | None = None  # why the plan cannot be reused (data-dependent host reads)
    notes: list[str] = field(default_factory=list)

    @property
    def capture_reason(self) -> str | None:
        """None when the whole run can be captured into a CUDA graph, else the first reason why not."""
        if self.dynamic:
            return self.dynamic
        for s in self.steps:
            if s.capture:
                return f"{s.label}: {s.capture}"
        return None

    def execute(self, feeds: dict[str, Any], profile: Callable | None = None) -> list:
        """Run the steps on ``feeds`` (device arrays by input name); the outputs in graph order."""
        vals: list[Any] = [None] * self.n_slots
        for slot, arr in self.constants:
            vals[slot] = arr
        for name, slot in self.inputs:
            vals[slot] = feeds[name]
        for step in self.steps:
            ins = [None if i is None else vals[i] for i in step.inputs]
            outs = step.run(ins) if profile is None else profile(step, ins)
            for slot, arr in zip(step.outputs, outs):
                if slot is not None:
                    vals[slot] = arr
            for slot in step.free:
                vals[slot] = None
        return [vals[slot] for _, slot in self.outputs]

    def summary(self) -> dict:
        return {
            "steps": len(self.steps), "folded_at_plan_time": self.folded, "slots": self.n_slots,
            "peak_bytes": self.peak_bytes, "constant_bytes": self.constant_bytes,
            "cuda_graph": "capturable" if self.capture_reason is None else f"eager ({self.capture_reason})",
            "dynamic": self.dynamic, "notes": list(self.notes),
        }


class _Host:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class _Dev:
    __slots__ = ("slot",)

    def __init__(self, slot: int):
        self.slot = slot


def _np_value(v) -> np.ndarray:
    return v if isinstance(v, np.ndarray) else np.asarray(v)


def trace(graph, backend, feeds: dict[str, Any], *, opset: int, signature: tuple = (),
          outer: dict[str, Any] | None = None) -> tuple[Plan, list]:
    """Run ``graph`` once on ``feeds`` while building its plan; returns ``(plan, outputs)``.

    ``outer`` maps outer-scope tensor names to values (host NumPy arrays or device arrays) for
    subgraphs (If branches).
    """
    env: dict[str, Any] = {}
    arrays: list[Any] = []  # device arrays by slot, during the trace
    steps: list[Step] = []
    constants: list[tuple[int, Any]] = []
    const_slots: dict[int, int] = {}  # id(host array) -> constant slot
    plan = Plan(signature, steps, 0, [], constants, [])
    host_keep: list[Any] = []  # keeps host arrays alive so id() keys stay unique

    def new_slot(arr) -> int:
        arrays.append(arr)
        return len(arrays) - 1

    for name, arr in feeds.items():
        slot = new_slot(arr)
        env[name] = _Dev(slot)
        plan.inputs.append((name, slot))

    def lookup(t: str):
        v = env.get(t)
        if v is not None:
            return v
        if outer is not None and t in outer:
            val = outer[t]
            if isinstance(val, np.ndarray):
                v = _Host(val)
            else:
                slot = new_slot(val)
                constants.append((slot, val))  # outer device values are fixed for this (eager) trace
                v = _Dev(slot)
            env[t] = v
            return v
        c = graph.constant_value(t)
        if c is None and graph.is_initializer(t):
            from onnx import numpy_helper

            c = numpy_helper.to_array(graph.initializer(t))  # the default of an input not fed (IR < 4 style)
        if c is None:
            raise KeyError(t)
        v = _Host(np.asarray(c))
        env[t] = v
        return v

    def device_slot(t: str, v) -> int:
        if isinstance(v, _Dev):
            return v.slot
        key = id(v.value)
        slot = const_slots.get(key)
        if slot is None:
            arr = backend.upload(v.value, name=t)
            slot = new_slot(arr)
            constants.append((slot, arr))
            const_slots[key] = slot
            host_keep.append(v.value)
        return slot

    for node in graph.nodes():
        label = f"{node.op_type} {node.name or (node.outputs[0] if node.outputs else '?')}"
        vals = []
        for t in node.inputs:
            if not t:
                vals.append(None)
                continue
            try:
                vals.append(lookup(t))
            except KeyError:
                raise backend.error(f"node {node.name!r} ({node.op_type}) reads tensor {t!r}, which nothing defines") from None
        std = node.domain in ("", "ai.onnx")
        op = node.op_type
        # -- plan-time values -----------------------------------------------------------------
        if std and op in ("Shape", "Size") and vals and vals[0] is not None:
            out = ops_std.OPS[op](ops_std.OpContext(np, node, opset, {}), [_ShapeOnly(_shape_of(vals[0], arrays))])
            env[node.outputs[0]] = _Host(_np_value(out[0]))
            plan.folded += 1
            continue
        if std and op != "If" and op in ops_std.OPS and all(v is None or isinstance(v, _Host) for v in vals):
            host = {i: v.value for i, v in enumerate(vals) if v is not None}
            ins = [None if v is None else v.value for v in vals]
            with np.errstate(all="ignore"):
                outs = ops_std.OPS[op](ops_std.OpContext(np, node, opset, host), ins)
            for name, o in zip(node.outputs, outs):
                if name:
                    env[name] = _Host(_np_value(o))
            plan.folded += 1
            continue
        # -- a device step --------------------------------------------------------------------
        host_pos = set(ops_std.HOST_INPUTS.get(op, ())) if std else set()
        host_vals: dict[int, np.ndarray] = {}
        dyn_pos: list[int] = []
        in_slots: list[int | None] = []
        for i, v in enumerate(vals):
            if v is None:
                in_slots.append(None)
            elif i in host_pos:
                if isinstance(v, _Host):
                    host_vals[i] = v.value
                    in_slots.append(None)
                else:
                    dyn_pos.append(i)
                    in_slots.append(v.slot)
            else:
                in_slots.append(device_slot(node.inputs[i], v))
        extra: list[int] = []
        if std and op == "If":
            run, capture, dyn = backend.if_step(graph, node, opset, vals, arrays)
            for t in _outer_refs(node):
                try:
                    v = lookup(t)
                except KeyError:
                    continue
                extra.append(device_slot(t, v) if isinstance(v, _Dev) else -1 - len(host_keep))
                if not isinstance(v, _Dev):
                    host_keep.append(v.value)
            if dyn and plan.dynamic is None:
                plan.dynamic = f"{label}: {dyn}"
            run = _bind_outer(run, node, vals, extra, host_keep)
        elif std:
            run = backend.std_step(node, opset, host_vals, dyn_pos)
            capture = backend.capture_issue(op)
            if dyn_pos:
                capture = f"input(s) {dyn_pos} are device values read on the host (data-dependent shape)"
                if plan.dynamic is None:
                    plan.dynamic = f"{label}: {capture}"
        else:
            in_arrays = [None if s is None else arrays[s] for s in in_slots]
            run, capture, note = backend.custom_step(graph, node, in_arrays)
            if note:
                plan.notes.append(f"{label}: {note}")
        step_inputs = tuple(in_slots) + tuple(s for s in extra if s >= 0)
        ins = [None if s is None else arrays[s] for s in step_inputs]
        try:
            outs = run(ins)
        except backend.user_errors as e:  # noqa: B030 - a tuple of exception types from the backend
            raise backend.error(f"node {node.name!r} ({op}) failed: {str(e).splitlines()[0][:300]}") from None
        out_slots: list[int | None] = []
        for name, o in zip(node.outputs, outs):
            if not name:
                out_slots.append(None)
                continue
            o = backend.ensure_device(o)
            slot = new_slot(o)
            env[name] = _Dev(slot)
            out_slots.append(slot)
        steps.append(Step(label, op, run, step_inputs, tuple(out_slots), (), capture))

    outs: list[Any] = []
    for name in graph.outputs:
        try:
            v = lookup(name)
        except KeyError:
            raise backend.error(f"graph output {name!r} is not computed by any node") from None
        slot = device_slot(name, v)
        plan.outputs.append((name, slot))
        outs.append(arrays[slot])
    plan.n_slots = len(arrays)
    plan.slot_info = [(tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", ""))) for a in arrays]
    _liveness(plan, arrays, backend)
    return plan, outs


class _ShapeOnly:
    """Stands in for a huge tensor when only its shape is asked for (Shape/Size at plan time)."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.ndim = len(shape)


def _shape_of(v, arrays) -> tuple[int, ...]:
    if isinstance(v, _Host):
        return tuple(np.shape(v.value))
    return tuple(arrays[v.slot].shape)


def _outer_refs(node) -> list[str]:
    names: list[str] = []
    for sub in node.subgraphs():
        for t in sub.outer_references():
            if t not in names:
                names.append(t)
    return names


def _bind_outer(run, node, vals, extra, host_keep):
    """The If runner gets the outer-scope values by name: device ones from the step's inputs."""
    names = _outer_refs(node)
    n_direct = len(vals)

    def bound(ins):
        outer: dict[str, Any] = {}
        k = n_direct
        for name, s in zip(names, extra):
            if s >= 0:
                outer[name] = ins[k]
                k += 1
            else:
                outer[name] = host_keep[-1 - s]
        return run(ins[:n_direct], outer)

    return bound


def _liveness(plan: Plan, arrays: list, backend) -> None:
    """Free each slot after its last use, and compute the peak of live activation bytes."""
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
    block_of = [backend.block_id(a) for a in arrays]
    size_of: dict[Any, int] = {}
    for a, b in zip(arrays, block_of):
        size_of[b] = max(size_of.get(b, 0), -(-backend.block_bytes(a) // ALIGN) * ALIGN)
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
