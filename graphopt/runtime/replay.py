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

Only steps that declare themselves capturable, write arena buffers and convert no input are
wrapped (``graphopt.runtime.compiled``). ``Session(step_graphs=False)`` turns it off.
"""

from __future__ import annotations

from typing import Any, Callable

MAX_GRAPHS = 2  # address sets recorded per step (a caller alternating two input buffers is served)


class StepReplay:
    """``run(ins) -> outs`` with each repeated input-address set replayed from a recorded CUDA graph."""

    __slots__ = ("run_step", "outs", "cupy", "graphs", "seen", "failed", "stats")

    def __init__(self, run_step: Callable[[list], list], outs: list, cupy: Any):
        self.run_step = run_step
        self.outs = outs
        self.cupy = cupy
        self.graphs: dict[tuple, tuple[Any, Any]] = {}  # input addresses -> (graph, private pool)
        self.seen: set[tuple] = set()
        self.failed = False  # recording failed once: this step always launches
        self.stats = {"replayed": 0, "recorded": 0, "launched": 0}

    def __call__(self, ins: list) -> list:
        key = tuple(0 if a is None else a.data.ptr for a in ins)
        stream = self.cupy.cuda.get_current_stream()
        hit = self.graphs.get(key)
        if hit is not None and not stream.is_capturing():
            hit[0].launch(stream)
            self.stats["replayed"] += 1
            return self.outs
        if hit is None and not self.failed and key in self.seen and len(self.graphs) < MAX_GRAPHS \
                and not stream.is_capturing():
            graph = self._record(ins, key)
            if graph is not None:
                graph.launch(stream)
                self.stats["recorded"] += 1
                return self.outs
        self.seen.add(key)
        self.stats["launched"] += 1
        return self.run_step(ins)

    def _record(self, ins: list, key: tuple):
        cupy = self.cupy
        pool = cupy.cuda.MemoryPool()
        side = cupy.cuda.Stream(non_blocking=True)
        graph = None
        try:
            with cupy.cuda.using_allocator(pool.malloc), side:
                side.begin_capture()
                try:
                    self.run_step(ins)
                finally:
                    graph = side.end_capture()
        except Exception:  # noqa: BLE001 - the launch refused capture: it launches directly from now on
            self.failed = True
            return None
        self.graphs[key] = (graph, pool)
        return graph
