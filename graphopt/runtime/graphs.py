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
A plan whose last steps write large graph outputs (``fresh_tail``: GPT-2's logits) leaves those
steps out of the graph: each replay launches them after it, into new arrays, so those outputs are
never copied.
No step may read a device value on the host: the plan's ``capture_reason`` is checked first.
"""

from __future__ import annotations

from typing import Any

from graphopt.lowering.buckets import ATTR, decode
from graphopt.lowering.layout import to_layout
from graphopt.runtime.replay import pool_bytes


class CaptureFailed(Exception):
    pass


# Graph outputs at least this large, written by the plan's last steps, are written by those steps
# launched after the graph into new arrays (the plan's uncaptured tail), not copied out of the graph.
TAIL_MIN_BYTES = 8 << 20


def fresh_tail(plan) -> int:
    """Where the plan's uncaptured tail starts in ``plan.loop`` (``len(plan.loop)``: no tail).

    The tail is the longest run of final steps that are compiled lowered steps writing only graph
    outputs into new arrays every run (``plan.fresh_bytes``), kept when together they write at least
    ``TAIL_MIN_BYTES``. Launched after the graph they cost a launch each (a replay of the step's own
    CUDA graph once its addresses repeat); copying their outputs out of the graph instead costs a read
    and a write of every byte: GPT-2's 412 MB of bs32 logits, ~0.3 ms on the H100, more than the
    whole model's lead over torch.compile."""
    loop, fresh = plan.loop, plan.fresh_bytes
    if plan.template is None or not loop:
        return len(loop)
    writable = {s for _, s in plan.outputs} | {plan.n_slots + 1}  # graph outputs and the unnamed-output sink
    k, nbytes = len(loop), 0
    while k > 0 and k - 1 in fresh and all(s in writable for s in loop[k - 1][2]):
        k -= 1
        nbytes += fresh[k]
    # a plan that would be all tail keeps its graph (an empty graph saves nothing)
    return k if nbytes >= TAIL_MIN_BYTES and k > 0 else len(loop)


class CapturedRun:
    """A captured plan: ``graph`` writes every step before ``tail`` into buffers of ``pool``; the
    ``tail`` steps (``fresh_tail``) run after each launch on ``vals``, the slot values the capture
    left (the inputs they read are graph buffers), and write new arrays."""

    def __init__(self, graph, pool, static_inputs: dict[str, Any], outputs: list, stream,
                 plan=None, vals: list | None = None, tail: list = (), convert=to_layout):
        self.graph = graph
        self.pool = pool
        self.static_inputs = static_inputs
        self.outputs = outputs
        self.stream = stream
        self.convert = convert  # to_layout for the copies of strided outputs (the backend's: the tiled transpose)
        self.plan, self.vals, self.tail = plan, vals, list(tail)
        written = {s for _, _, outs, _ in self.tail for s in outs}
        self.fresh = frozenset(i for i, (_, s) in enumerate(plan.outputs) if s in written) if plan else frozenset()

    @classmethod
    def capture(cls, plan, feeds: dict[str, Any], backend) -> "CapturedRun":
        cupy = backend.cupy
        stream = backend.stream
        pool = cupy.cuda.MemoryPool()
        cut = fresh_tail(plan) if plan.template is not None else None
        tail = cut is not None and cut < len(plan.loop)
        vals = None
        try:
            with cupy.cuda.using_allocator(pool.malloc), stream:
                static = {name: cupy.empty_like(arr) for name, arr in feeds.items()}
                for name, arr in feeds.items():
                    static[name][...] = arr
                if not tail:
                    plan.execute(static)  # warm-up: kernels compiled, pool filled
                else:  # the captured part only: the tail's outputs must not be left cached in this pool
                    warm = plan.begin(static)
                    plan.run_loop(warm, plan.loop[:cut])
            if tail:
                with stream:  # the tail's warm-up, its outputs from the default pool (and returned to it)
                    plan.run_loop(warm, plan.loop[cut:])
                warm = None
            with cupy.cuda.using_allocator(pool.malloc), stream:
                stream.synchronize()
                graph = None
                stream.begin_capture()
                try:
                    if not tail:
                        outs = plan.execute(static)
                    else:
                        vals = plan.begin(static)
                        plan.run_loop(vals, plan.loop[:cut])
                        outs = plan.output_values(vals)  # the tail's outputs: placeholders, never returned
                finally:
                    graph = stream.end_capture()
                graph.upload(stream) if hasattr(graph, "upload") else None
        except Exception as e:  # noqa: BLE001 - report why, the session falls back to eager
            raise CaptureFailed(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None
        if vals is None:
            return cls(graph, pool, static, outs, stream, convert=backend.to_layout)
        return cls(graph, pool, static, outs, stream, plan, vals, plan.loop[cut:], backend.to_layout)

    def replay(self, feeds: dict[str, Any], stream=None, copy: bool = True) -> list:
        """Copy ``feeds`` in, launch the graph on ``stream`` (default: the capture stream), run the
        uncaptured tail, copy the graph's outputs out; ``copy=False`` returns the graph's own output
        buffers instead (the next replay overwrites them). The tail's outputs are new arrays either way."""
        stream = stream or self.stream
        with stream:
            for name, arr in feeds.items():
                _copy_into(self.static_inputs[name], arr, stream)
            self.graph.launch(stream)
            if not self.tail:
                return [_copy_of(o, stream, self.convert) for o in self.outputs] if copy else list(self.outputs)
            vals = self.vals.copy()
            self.plan.run_loop(vals, self.tail)
            outs = self.plan.output_values(vals)
            fresh = self.fresh
            return [o if i in fresh or not copy else _copy_of(o, stream, self.convert) for i, o in enumerate(outs)]


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


def _copy_of(a, stream, convert=to_layout):
    """A new C-order array equal to ``a`` (a graph output, overwritten by the next replay); a strided
    one through ``convert`` (rowpad: one pitched copy; NHWC on a real GPU: the tiled transpose)."""
    import cupy

    if not _dense(a):
        with stream:
            return convert(a, "rowmajor", cupy)

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

    def pool_bytes(self) -> int:
        """Bytes held by the captured graphs' private memory pools (what their runs allocated while
        being captured: activations outside the arena, temporaries)."""
        return sum(pool_bytes(g.pool) for g in self.graphs.values() if g)

    def summary(self) -> dict:
        captured = [s for s, g in self.graphs.items() if g is not False]
        return {"captured": len(captured), "max_graphs": self.max_graphs, "profile_buckets": len(self.buckets),
                "buckets_covered": [b for b in self.buckets if any(self.bucket.get(s) == b for s in captured)]}
