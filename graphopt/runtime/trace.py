"""Tracing: run a graph once and build its execution plan (``graphopt.runtime.plan.Plan``).

``trace(graph, backend, feeds)`` walks the graph in topological order and runs it once. Every value
is either a *host value* (a NumPy array known at plan time: initializers, ``Constant`` outputs,
``Shape``/``Size`` of any tensor, and anything computed only from host values, which is folded
here with NumPy) or a *device value* held in a numbered slot. Only nodes that touch device values
become ``Step``s, so the shape arithmetic of an export (Shape -> Gather -> Concat -> Reshape ...)
costs nothing at run time, and the inputs ops read on the host (Reshape's shape, Slice's starts,
Expand's shape, ...; ``onnx_ops.registry.HOST_INPUTS``) are resolved here, never by a device -> host read
inside a run. A step whose host input is a device value (a data-dependent shape) reads it at run
time: the plan is then ``dynamic``; it is rebuilt on every run and never captured.

During the trace a device tensor read for the last time keeps only its metadata (``_spent``: shape,
dtype, strides) and its memory-block token and size (recorded while it was alive), so the first
run's high-water mark is the live activations, not the sum of all of them (until 2026-12-05 the
trace kept every array until the plan was compiled).

After the trace the plan knows every slot's shape, dtype and last use (``liveness``: each step
drops the slots it read last; ``peak_bytes`` is that schedule's peak of live bytes), and a reusable
plan is compiled (``compiled.compile_plan``): the buffers it owns go into one arena placed by
liveness and its steps become prebuilt closures run by ``Plan._fast``.

``trace`` is a ``_Tracer`` driven node by node; each of its methods does one job: plan-time folding
(``_fold_shape`` for Shape/Size, ``_fold_host`` for host-only subgraphs), the device steps
(``_std_step``, ``_if_step``, ``_custom_step``) and running a new step once (``_run_and_record``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphopt.runtime.liveness import liveness
from graphopt.runtime.onnx_ops.registry import HOST_INPUTS, OPS, OpContext
from graphopt.runtime.plan import Plan, Step


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
    subgraphs (If branches). A plan that can be reused (not ``dynamic``) is then compiled
    (``graphopt.runtime.compiled``): its buffers placed in one arena and its steps rebound.
    """
    tracer = _Tracer(graph, backend, opset, signature, outer)
    tracer.add_feeds(feeds)
    for node in graph.nodes():
        tracer.node(node)
        tracer.release(node)
    outs = tracer.finish()
    plan = tracer.plan
    liveness(plan, tracer.blocks, tracer.block_bytes)
    if outer is None and plan.dynamic is None:
        from graphopt.runtime.compiled import compile_plan

        compile_plan(plan, tracer.arrays, backend, tracer.blocks, tracer.block_bytes)
    return plan, outs


class _Tracer:
    """The state of one trace; each method does one job (see ``trace``)."""

    def __init__(self, graph, backend, opset: int, signature: tuple, outer):
        self.graph, self.backend, self.opset, self.outer = graph, backend, opset, outer
        self.env: dict[str, Any] = {}
        # device arrays by slot; after its last reader is traced a slot keeps only its metadata
        # (``_spent``), so the trace's high-water mark is the live activations, not their sum
        self.arrays: list[Any] = []
        self.blocks: list[int] = []       # per slot: its memory block's token (views share their base's)
        self.block_bytes: list[int] = []  # per slot: that block's size
        self._token_of: dict[Any, int] = {}  # backend.block_id of a block some slot still holds -> token
        self._block_of_token: dict[int, Any] = {}
        self._holders: dict[int, int] = {}  # token -> slots still holding an array on that block
        self._readers = _readers(graph)  # tensor name -> nodes not yet traced that read it (+1: graph output)
        self._kept: set[int] = set()  # feeds and constants: never spent
        self.const_slots: dict[int, int] = {}  # id(host array) -> constant slot
        self.host_keep: list[Any] = []  # keeps host arrays alive so id() keys stay unique
        self.plan = Plan(signature, [], 0, [], [], [])

    # -- values -----------------------------------------------------------------------------------
    def new_slot(self, arr) -> int:
        """A slot for ``arr``. Its block token is the live block's it shares memory with, else a new
        one: ``backend.block_id`` (a Python id) can repeat once a block is freed, a token never does."""
        bid = self.backend.block_id(arr)
        token = self._token_of.get(bid)
        if token is None:
            token = self._token_of[bid] = len(self._block_of_token)
            self._block_of_token[token] = bid
        self._holders[token] = self._holders.get(token, 0) + 1
        self.arrays.append(arr)
        self.blocks.append(token)
        self.block_bytes.append(int(self.backend.block_bytes(arr)))
        return len(self.arrays) - 1

    def release(self, node) -> None:
        """After ``node`` is traced: every device tensor it read last, and every output of it that
        nothing reads (MaxPool's indices, a dead value), keeps only its metadata."""
        done = []
        for t in _read_names(node):
            self._readers[t] = self._readers.get(t, 0) - 1
            done.append(t)
        done += [t for t in node.outputs if t and t not in self._readers]
        for t in done:
            v = self.env.get(t)
            if self._readers.get(t, 0) <= 0 and isinstance(v, _Dev) and v.slot not in self._kept:
                self._spend(v.slot)

    def _spend(self, slot: int) -> None:
        arr = self.arrays[slot]
        if isinstance(arr, _SpentArray):
            return
        self.arrays[slot] = _spent(arr)
        token = self.blocks[slot]
        self._holders[token] -= 1
        if not self._holders[token]:  # no slot holds the block: its id may be reused by a new block
            self._token_of.pop(self._block_of_token[token], None)

    def add_feeds(self, feeds: dict[str, Any]) -> None:
        for name, arr in feeds.items():
            slot = self.new_slot(arr)
            self._kept.add(slot)
            self.env[name] = _Dev(slot)
            self.plan.inputs.append((name, slot))

    def lookup(self, t: str):
        v = self.env.get(t)
        if v is not None:
            return v
        if self.outer is not None and t in self.outer:
            v = self._outer_value(self.outer[t])
        else:
            v = _Host(np.asarray(self._constant(t)))
        self.env[t] = v
        return v

    def _outer_value(self, val):
        if isinstance(val, np.ndarray):
            return _Host(val)
        slot = self.new_slot(val)
        self._kept.add(slot)
        self.plan.constants.append((slot, val))  # outer device values are fixed for this (eager) trace
        return _Dev(slot)

    def _constant(self, t: str):
        c = self.graph.constant_value(t)
        if c is None and self.graph.is_initializer(t):
            from onnx import numpy_helper

            c = numpy_helper.to_array(self.graph.initializer(t))  # the default of an input not fed (IR < 4 style)
        if c is None:
            raise KeyError(t)
        return c

    def device_slot(self, t: str, v) -> int:
        """The slot of ``v``; a host value is uploaded once (a constant slot) on first device use."""
        if isinstance(v, _Dev):
            return v.slot
        key = id(v.value)
        slot = self.const_slots.get(key)
        if slot is None:
            arr = self.backend.upload(v.value, name=t)
            slot = self.new_slot(arr)
            self._kept.add(slot)
            self.plan.constants.append((slot, arr))
            self.const_slots[key] = slot
            self.host_keep.append(v.value)
        return slot

    def _inputs(self, node) -> list:
        vals = []
        for t in node.inputs:
            if not t:
                vals.append(None)
                continue
            try:
                vals.append(self.lookup(t))
            except KeyError:
                raise self.backend.error(f"node {node.name!r} ({node.op_type}) reads tensor {t!r}, "
                                         "which nothing defines") from None
        return vals

    # -- one node ---------------------------------------------------------------------------------
    def node(self, node) -> None:
        vals = self._inputs(node)
        std = node.domain in ("", "ai.onnx")
        op = node.op_type
        if std and op in ("Shape", "Size") and vals and vals[0] is not None:
            return self._fold_shape(node, vals[0])
        if std and op != "If" and op in OPS and all(v is None or isinstance(v, _Host) for v in vals):
            return self._fold_host(node, vals)
        label = f"{op} {node.name or (node.outputs[0] if node.outputs else '?')}"
        if std and op == "If":
            run, capture, in_slots, kind = self._if_step(node, label, vals)
        elif std:
            run, capture, in_slots, kind = self._std_step(node, label, vals)
        else:
            run, capture, in_slots, kind = self._custom_step(node, label, vals)
        self._run_and_record(node, label, run, capture, in_slots, kind)

    def _fold_shape(self, node, v) -> None:
        """Shape / Size of any tensor: a plan-time value (its shape is known)."""
        shape_only = _ShapeOnly(_shape_of(v, self.arrays))
        out = OPS[node.op_type](OpContext(np, node, self.opset, {}), [shape_only])
        self.env[node.outputs[0]] = _Host(_np_value(out[0]))
        self.plan.folded += 1

    def _fold_host(self, node, vals) -> None:
        """A standard op whose inputs are all plan-time values: computed here with NumPy."""
        host = {i: v.value for i, v in enumerate(vals) if v is not None}
        ins = [None if v is None else v.value for v in vals]
        with np.errstate(all="ignore"):
            outs = OPS[node.op_type](OpContext(np, node, self.opset, host), ins)
        for name, o in zip(node.outputs, outs):
            if name:
                self.env[name] = _Host(_np_value(o))
        self.plan.folded += 1

    def _std_step(self, node, label, vals):
        """A standard op on device values; its ``HOST_INPUTS`` are resolved now when they are plan-time values."""
        host_pos = set(HOST_INPUTS.get(node.op_type, ()))
        host_vals: dict[int, np.ndarray] = {}
        dyn_pos: list[int] = []
        in_slots: list[int | None] = []
        for i, v in enumerate(vals):
            if v is None:
                in_slots.append(None)
            elif i in host_pos and isinstance(v, _Host):
                host_vals[i] = v.value
                in_slots.append(None)
            elif i in host_pos:
                dyn_pos.append(i)
                in_slots.append(v.slot)
            else:
                in_slots.append(self.device_slot(node.inputs[i], v))
        run = self.backend.std_step(node, self.opset, host_vals, dyn_pos)
        capture = self.backend.capture_issue(node.op_type)
        if dyn_pos:
            capture = f"input(s) {dyn_pos} are device values read on the host (data-dependent shape)"
            if self.plan.dynamic is None:
                self.plan.dynamic = f"{label}: {capture}"
        return run, capture, tuple(in_slots), "std"

    def _if_step(self, node, label, vals):
        """If: a nested plan per run; outer-scope tensors its branches read become extra inputs."""
        in_slots = [None if v is None else self.device_slot(node.inputs[i], v) for i, v in enumerate(vals)]
        run, capture, dyn = self.backend.if_step(self.graph, node, self.opset, vals, self.arrays)
        extra: list[int] = []
        for t in _outer_refs(node):
            try:
                v = self.lookup(t)
            except KeyError:
                continue
            extra.append(self.device_slot(t, v) if isinstance(v, _Dev) else -1 - len(self.host_keep))
            if not isinstance(v, _Dev):
                self.host_keep.append(v.value)
        if dyn and self.plan.dynamic is None:
            self.plan.dynamic = f"{label}: {dyn}"
        run = _bind_outer(run, node, vals, extra, self.host_keep)
        return run, capture, tuple(in_slots) + tuple(s for s in extra if s >= 0), "if"

    def _custom_step(self, node, label, vals):
        """A graphopt op: its lowering (or device fallback), chosen for the actual input arrays."""
        in_slots = tuple(None if v is None else self.device_slot(node.inputs[i], v) for i, v in enumerate(vals))
        in_arrays = [None if s is None else self.arrays[s] for s in in_slots]
        run, capture, note = self.backend.custom_step(self.graph, node, in_arrays)
        if note:
            self.plan.notes.append(f"{label}: {note}")
        return run, capture, in_slots, "custom"

    def _run_and_record(self, node, label, run, capture, in_slots, kind) -> None:
        """Run the new step once (the trace's run) and give its outputs slots."""
        ins = [None if s is None else self.arrays[s] for s in in_slots]
        try:
            outs = run(ins)
        except self.backend.user_errors as e:  # noqa: B030 - a tuple of exception types from the backend
            raise self.backend.error(f"node {node.name!r} ({node.op_type}) failed: {str(e).splitlines()[0][:300]}") from None
        out_slots: list[int | None] = []
        for name, o in zip(node.outputs, outs):
            if not name:
                out_slots.append(None)
                continue
            slot = self.new_slot(self.backend.ensure_device(o))
            self.env[name] = _Dev(slot)
            out_slots.append(slot)
        lowered = getattr(run, "lowered", None)
        self.plan.steps.append(Step(label, node.op_type, run, in_slots, tuple(out_slots), (), capture, node, kind,
                                    lowered.key if lowered is not None else None))

    def finish(self) -> list:
        """The graph outputs' slots (host values uploaded) and the per-slot shapes."""
        plan = self.plan
        outs: list[Any] = []
        for name in self.graph.outputs:
            try:
                v = self.lookup(name)
            except KeyError:
                raise self.backend.error(f"graph output {name!r} is not computed by any node") from None
            slot = self.device_slot(name, v)
            plan.outputs.append((name, slot))
            outs.append(self.arrays[slot])
        plan.n_slots = len(self.arrays)
        plan.slot_info = [(tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", ""))) for a in self.arrays]
        return outs


class _ShapeOnly:
    """Stands in for a huge tensor when only its shape is asked for (Shape/Size at plan time)."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.ndim = len(shape)


def _shape_of(v, arrays) -> tuple[int, ...]:
    if isinstance(v, _Host):
        return tuple(np.shape(v.value))
    return tuple(arrays[v.slot].shape)


class _SpentArray(np.ndarray):
    """A traced device array after its last use: shape, dtype and strides (what liveness and the
    compiled plan read) over one element of host memory, never read."""


def _spent(arr) -> np.ndarray:
    dt = np.dtype(arr.dtype)
    one = np.empty(1, dt)
    view = np.lib.stride_tricks.as_strided(one, tuple(arr.shape), tuple(arr.strides), writeable=False)
    return view.view(_SpentArray)


def _read_names(node) -> list[str]:
    """The tensors ``node`` reads: its inputs and, for a node with subgraphs, their outer references."""
    return [t for t in node.inputs if t] + (_outer_refs(node) if node.subgraphs() else [])


def _readers(graph) -> dict[str, int]:
    """Tensor name -> how many nodes read it, plus one for a graph output (never released)."""
    count: dict[str, int] = {}
    for node in graph.nodes():
        for t in _read_names(node):
            count[t] = count.get(t, 0) + 1
    for t in graph.outputs:
        count[t] = count.get(t, 0) + 1
    return count


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
