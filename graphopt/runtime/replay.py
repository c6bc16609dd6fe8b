"""Step replay: an eager run enqueues a compiled step by replaying a CUDA graph of that one step.

Without a whole-plan CUDA graph (``cuda_graphs=False``, a shape past the session's graph bound, a
plan that reads a device value on the host), every step pays its launch's host cost on every run: a
cuDNN frontend execute cost 90 us of Python per call on the H200, a raw-pointer execute 31 us, and
the replay of the same execute captured once into a CUDA graph 1.7 us
(``bench/results/probe_cudnn_host_h200.json``). A compiled step writes fixed arena buffers with fixed
constants, so only its non-constant inputs' addresses can change between runs; ``StepReplay`` keys
its graphs by those addresses:

- a run whose input addresses have a recorded graph launches it on the current stream;
- the second run with the same addresses records the step once on a side stream (a first run does
  not: a one-shot run pays no recording), then launches it;
- temporaries the launch allocates while being recorded come from a memory pool private to that
  graph, kept with it: nothing else can be handed those blocks while the graph may still write them;
- while the stream is being captured (the whole-plan CUDA graph), and for a step whose recording
  failed, the step launches as before; at most ``MAX_GRAPHS`` address sets are recorded per step.

Only steps that declare themselves capturable are wrapped (``graphopt.runtime.compiled``): those
writing arena buffers (``StepReplay``, keyed by the inputs that can move: feeds and pool-allocated
tensors; constants and arena views never do) and lowered steps writing graph outputs, new arrays
every run (``FreshStepReplay``, keyed by the outputs' addresses too). A step that converts an input
to its lowering's layout records the conversion with the launch (its buffer from the graph's
private pool), so it is keyed by the address it converts from. ``Session(step_graphs=False)`` turns
it off.
"""

from __future__ import annotations

from typing import Any, Callable

MAX_GRAPHS = 2  # address sets recorded per step (a caller alternating two input buffers is served)
MAX_SEEN = 64  # address sets remembered per step before the memory of them is cleared


class StepReplay:
    """``run(ins) -> outs`` with each repeated input-address set replayed from a recorded CUDA graph.

    ``moving``: the indices of the inputs whose address can change between runs (the compiled plan
    knows the others: constants and arena views never move); only they are read for the key.
    None: every input."""

    __slots__ = ("run_step", "outs", "cupy", "moving", "current", "graphs", "seen", "failed", "replayed", "recorded",
                 "launched")

    def __init__(self, run_step: Callable[[list], list], outs: list, cupy: Any, moving: tuple | None = None):
        self.run_step = run_step
        self.outs = outs
        self.cupy = cupy
        self.moving = moving
        self.current = cupy.cuda.get_current_stream  # looked up once
        self.graphs: dict[tuple, tuple[Any, Any]] = {}  # input addresses -> (graph, private pool)
        self.seen: set[tuple] = set()
        self.failed = False  # recording failed once: this step always launches
        self.replayed = self.recorded = self.launched = 0

    @property
    def stats(self) -> dict:
        return {"replayed": self.replayed, "recorded": self.recorded, "launched": self.launched}

    def _key(self, ins: list) -> tuple:
        moving = self.moving
        if moving is None:
            return tuple(0 if a is None else a.data.ptr for a in ins)
        return tuple([ins[i].data.ptr for i in moving]) if moving else ()

    def __call__(self, ins: list) -> list:
        # the common case inline: a recorded graph for these addresses, no capture under way
        moving = self.moving
        key = () if moving == () else self._key(ins)
        hit = self.graphs.get(key)
        if hit is not None:
            stream = self.current()
            if not stream.is_capturing():
                hit[0].launch(stream)
                self.replayed += 1
                return self.outs
        return self._step(ins, key, self.outs, ins)

    def _step(self, ins: list, key: tuple, outs: list, arg) -> list:
        stream = self.current()
        hit = self.graphs.get(key)
        if hit is not None:
            if not stream.is_capturing():
                hit[0].launch(stream)
                self.replayed += 1
                return outs
        elif not self.failed and key in self.seen and len(self.graphs) < MAX_GRAPHS and not stream.is_capturing():
            graph = self._record(arg, key)
            if graph is not None:
                graph.launch(stream)
                self.recorded += 1
                return outs
        if len(self.seen) >= MAX_SEEN:
            self.seen.clear()
        self.seen.add(key)
        self.launched += 1
        return self.run_step(arg)

    def _record(self, arg, key: tuple):
        cupy = self.cupy
        pool = cupy.cuda.MemoryPool()
        side = cupy.cuda.Stream(non_blocking=True)
        graph = None
        try:
            with cupy.cuda.using_allocator(pool.malloc), side:
                side.begin_capture()
                try:
                    self.run_step(arg)
                finally:
                    graph = side.end_capture()
        except Exception:  # noqa: BLE001 - the launch refused capture: it launches directly from now on
            self.failed = True
            return None
        self.graphs[key] = (graph, pool)
        return graph


class FreshStepReplay(StepReplay):
    """A step whose outputs are new arrays every run (graph outputs: the caller keeps them), so the
    key holds the outputs' addresses too: ``alloc() -> outs``, then ``run_step((ins, outs))``
    enqueues the step writing ``outs``. The memory pool hands a freed block back, so a caller that
    drops (or alternates two) results meets a recorded graph; a caller that keeps every result
    launches as before."""

    __slots__ = ("alloc",)

    def __init__(self, run_step: Callable[[tuple], list], alloc: Callable[[], list], cupy: Any,
                 moving: tuple | None = None):
        super().__init__(run_step, [], cupy, moving)
        self.alloc = alloc

    def __call__(self, ins: list) -> list:
        outs = self.alloc()
        key = self._key(ins) + tuple(o.data.ptr for o in outs)
        self._step(ins, key, outs, (ins, outs))
        return outs


def pool_bytes(pool) -> int:
    """Bytes a CuPy memory pool holds (in use and cached), 0 for none."""
    return int(pool.total_bytes()) if pool is not None and hasattr(pool, "total_bytes") else 0


def replay_pool_bytes(loop) -> int:
    """Bytes held by the private memory pools of the step graphs recorded in a compiled ``loop``
    (``Plan.loop``): the temporaries each recorded step keeps with its graph."""
    return sum(pool_bytes(pool) for step, *_ in loop if isinstance(step.run, StepReplay)
               for _, pool in step.run.graphs.values())

