"""CUDA graph capture and replay of a whole plan.

``CapturedRun.capture(plan, feeds, backend)``:
1. allocates static input buffers in a private memory pool and copies the feeds in;
2. runs the plan once eagerly on the session's stream with that pool (compiles CuPy's kernels and
   fills the pool, so the capture itself mostly reuses cached blocks);
3. captures one more run with ``stream.begin_capture()`` / ``end_capture()`` (ended in a
   ``finally``: a capture left open poisons the stream).

Everything the graph touches lives in the private pool, which nothing else allocates from, so a
block freed during the capture (liveness) and reused by a later step is reused in the same order
on every replay. ``replay(feeds)`` copies the feeds into the static inputs, launches the graph and
returns copies of the outputs (the graph overwrites its own output buffers on the next replay).
No step may read a device value on the host: the plan's ``capture_reason`` is checked first.
"""

from __future__ import annotations

from typing import Any


class CaptureFailed(Exception):
    pass


class CapturedRun:
    def __init__(self, graph, pool, static_inputs: dict[str, Any], outputs: list, stream):
        self.graph = graph
        self.pool = pool
        self.static_inputs = static_inputs
        self.outputs = outputs
        self.stream = stream

    @classmethod
    def capture(cls, plan, feeds: dict[str, Any], backend) -> "CapturedRun":
        cupy = backend.cupy
        stream = backend.stream
        pool = cupy.cuda.MemoryPool()
        try:
            with cupy.cuda.using_allocator(pool.malloc), stream:
                static = {name: cupy.empty_like(arr) for name, arr in feeds.items()}
                for name, arr in feeds.items():
                    static[name][...] = arr
                plan.execute(static)  # warm-up: kernels compiled, pool filled
                stream.synchronize()
                graph = None
                stream.begin_capture()
                try:
                    outs = plan.execute(static)
                finally:
                    graph = stream.end_capture()
                graph.upload(stream) if hasattr(graph, "upload") else None
        except Exception as e:  # noqa: BLE001 - report why, the session falls back to eager
            raise CaptureFailed(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None
        return cls(graph, pool, static, outs, stream)

    def replay(self, feeds: dict[str, Any], stream=None) -> list:
        """Copy ``feeds`` in, launch the graph on ``stream`` (default: the capture stream), copy the outputs out."""
        stream = stream or self.stream
        with stream:
            for name, arr in feeds.items():
                self.static_inputs[name][...] = arr
            self.graph.launch(stream)
            return [o.copy() for o in self.outputs]
