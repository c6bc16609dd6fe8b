"""The execution plan: one per input-shape signature, built by tracing one run (``graphopt.runtime.trace``).

A ``Plan`` is its ``Step``s (the nodes that run on the device, each ``run(device inputs) -> device
outputs`` over numbered slots), the slots' shapes, dtypes and last uses (``liveness``) and, once
compiled (``graphopt.runtime.compiled.compile_plan``), one arena for the buffers it owns and a loop of
prebuilt closures (``Plan._fast``). A ``dynamic`` plan (a data-dependent host read) is rebuilt on
every run and never captured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


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
    node: Any = None
    kind: str = "std"  # "std", "custom" or "if"
    lowering: str | None = None  # the custom op's lowering key when it runs one


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
    # the compiled form (graphopt.runtime.compiled): one arena for the buffers the plan owns
    arena: Any = None
    arena_bytes: int = 0  # the arena's size: activations and workspaces placed by liveness
    arena_live_bytes: int = 0  # the most arena bytes live at one step (the assignment's lower bound)
    workspace_bytes: int = 0  # of which lowering workspaces (each live during its own step)
    arena_offsets: dict = field(default_factory=dict)  # buffer key -> byte offset
    arena_intervals: list = field(default_factory=list)  # graphopt.runtime.arena.Interval per buffer
    template: list | None = None  # slot values every run starts from (constants, arena views)
    loop: list = field(default_factory=list)  # (step, input slots, output slots, slots to drop) per step
    fresh_bytes: dict = field(default_factory=dict)  # loop index -> bytes, for lowered steps writing new graph outputs each run
    barriers: dict = field(default_factory=dict)  # {"kept", "dropped", "unneeded"}: lowering barriers (graphopt.runtime.ordering)

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
        """Run the steps on ``feeds`` (device arrays by input name); the outputs in graph order.

        ``profile(step, inputs) -> outputs`` replaces each ``step.run(inputs)`` (timing)."""
        if self.template is not None:
            return self._fast(feeds, profile)
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
        return self.output_values(vals)

    def _fast(self, feeds: dict[str, Any], profile: Callable | None) -> list:
        """The compiled loop: slot lists prebuilt (a spare slot stands for every omitted input or
        output), nothing looked up or decided per step."""
        vals = self.begin(feeds)
        self.run_loop(vals, self.loop, profile)
        return self.output_values(vals)

    def begin(self, feeds: dict[str, Any]) -> list:
        """The compiled loop's slot values before its first step: the template with ``feeds`` in."""
        vals = self.template.copy()
        for name, slot in self.inputs:
            vals[slot] = feeds[name]
        return vals

    @staticmethod
    def run_loop(vals: list, loop: list, profile: Callable | None = None) -> None:
        """Run ``loop`` (``self.loop`` or a part of it: ``graphs.CapturedRun``'s tail) on ``vals``."""
        if profile is None:
            for step, ins, outs, free in loop:
                res = step.run([vals[i] for i in ins])
                for slot, arr in zip(outs, res):
                    vals[slot] = arr
                for slot in free:
                    vals[slot] = None
        else:
            for step, ins, outs, free in loop:
                res = profile(step, [vals[i] for i in ins])
                for slot, arr in zip(outs, res):
                    vals[slot] = arr
                for slot in free:
                    vals[slot] = None

    def output_values(self, vals) -> list:
        return [vals[slot] for _, slot in self.outputs]

    def summary(self) -> dict:
        return {
            "steps": len(self.steps), "folded_at_plan_time": self.folded, "slots": self.n_slots,
            "peak_bytes": self.peak_bytes, "constant_bytes": self.constant_bytes,
            "arena_bytes": self.arena_bytes, "arena_live_bytes": self.arena_live_bytes,
            "workspace_bytes": self.workspace_bytes, "barriers": dict(self.barriers),
            "cuda_graph": "capturable" if self.capture_reason is None else f"eager ({self.capture_reason})",
            "dynamic": self.dynamic, "notes": list(self.notes),
        }
