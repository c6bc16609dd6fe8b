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

from graphopt.lowering.buckets import ATTR, decode
from graphopt.lowering.layout import to_layout


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

    def replay(self, feeds: dict[str, Any], stream=None, copy: bool = True) -> list:
        """Copy ``feeds`` in, launch the graph on ``stream`` (default: the capture stream), copy the
        outputs out; ``copy=False`` returns the graph's own output buffers instead (the next replay
        overwrites them: GPT-2's logits at bs32 are 412 MB, a 0.19 ms copy on the H200)."""
        stream = stream or self.stream
        with stream:
            for name, arr in feeds.items():
                _copy_into(self.static_inputs[name], arr, stream)
            self.graph.launch(stream)
            return [_copy_of(o, stream) for o in self.outputs] if copy else list(self.outputs)


def _dense(a) -> bool:
    return a.flags.c_contiguous and a.size > 0


def _copy_into(dst, src, stream) -> None:
    """``dst[...] = src`` on ``stream``; one device-to-device memcpy when both are dense with the
    same dtype and shape (CuPy's elementwise copy cost more host time per run)."""
    if dst.data.ptr == getattr(getattr(src, "data", None), "ptr", None) and dst.shape == src.shape:
        return  # the caller handed back the graph's own input buffer
    if dst.dtype == src.dtype and dst.shape == src.shape and _dense(dst) and _dense(src):
        import cupy

        cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
    else:
        dst[...] = src


def _copy_of(a, stream):
    """A new C-order array equal to ``a`` (a graph output, overwritten by the next replay)."""
    import cupy

    if not _dense(a):
        with stream:  # a rowpad output (GPT-2's logits): one pitched copy, not CuPy's indexed kernel
            return to_layout(a, "rowmajor", cupy)

    out = cupy.empty_like(a)
    cupy.cuda.runtime.memcpyAsync(out.data.ptr, a.data.ptr, a.nbytes, cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
    return out


DEFAULT_MAX_GRAPHS = 8  # distinct input shapes captured per session when nothing says otherwise


def profile_buckets(graph) -> list[dict[str, int]]:
    """The ``--shape-profile`` buckets an optimized model records (``lowering_buckets`` of its nodes),
    ascending, each ``{dim: size}``; ``[]`` for a model optimized without a profile."""
    seen: dict[tuple, dict[str, int]] = {}
    for _, node in graph.walk():
        value = node.attr(ATTR, None) if node.domain == "graphopt" else None
        if not value:
            continue
        try:
            rows = decode(value)
        except Exception:  # noqa: BLE001 - a malformed record is reported when the node runs
            continue
        for row in rows:
            seen.setdefault(tuple(sorted(row["dims"].items())), dict(row["dims"]))
    return sorted(seen.values(), key=lambda d: tuple(d[k] for k in sorted(d)))


def bucket_of(buckets: list[dict[str, int]], dims: dict[str, int]) -> dict[str, int] | None:
    """The bucket a run with these symbolic dim sizes dispatches to (the rule of
    ``graphopt.lowering.buckets.choose``: the first covering every dim, else the last); None without buckets."""
    if not buckets:
        return None
    for b in buckets:
        if all(dims.get(k, 1) <= v for k, v in b.items()):
            return b
    return buckets[-1]


class GraphBook:
    """Which input shapes of a session have a CUDA graph, and the bound on how many.

    A captured graph replays exactly the shapes it was captured with (its kernels, grid sizes and
    buffers are fixed), so a model with symbolic dims gets one graph per distinct input shape seen,
    captured on its second run, up to ``max_graphs`` (default: ``DEFAULT_MAX_GRAPHS``, or the number
    of ``--shape-profile`` buckets when the model records more). Shapes past the bound run eagerly
    and ``reason`` says so. Padding a shape up to its bucket's graph is not done: it is exact only
    for batch-independent models, which the runtime cannot tell. Each graph records its bucket, so
    a report shows which buckets are covered."""

    def __init__(self, graph, max_graphs: int | None = None):
        self.buckets = profile_buckets(graph)
        self.max_graphs = int(max_graphs) if max_graphs is not None else max(DEFAULT_MAX_GRAPHS, len(self.buckets))
        self.graphs: dict[tuple, Any] = {}  # signature -> CapturedRun, or False after a failed capture
        self.bucket: dict[tuple, dict[str, int] | None] = {}

    def get(self, sig):
        return self.graphs.get(sig)

    def full(self, sig) -> str | None:
        """None when ``sig`` may be captured now, else why it runs eagerly."""
        if sig in self.graphs:
            return None
        n = sum(1 for g in self.graphs.values() if g is not False)
        if n >= self.max_graphs:
            shapes = ", ".join(f"{name} {'x'.join(map(str, shape))}" for name, shape, _ in sig)
            return (f"{n} CUDA graphs captured, the session's bound (max_graphs={self.max_graphs}); "
                    f"{shapes} runs eagerly")
        return None

    def add(self, sig, captured, dims: dict[str, int]) -> None:
        self.graphs[sig] = captured
        self.bucket[sig] = bucket_of(self.buckets, dims)

    def summary(self) -> dict:
        captured = [s for s, g in self.graphs.items() if g is not False]
        return {"captured": len(captured), "max_graphs": self.max_graphs, "profile_buckets": len(self.buckets),
                "buckets_covered": [b for b in self.buckets if any(self.bucket.get(s) == b for s in captured)]}
