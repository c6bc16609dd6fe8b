"""``Session``: run an ONNX model (original or optimized) on the GPU with CuPy, or on the CPU.

    sess = Session("model.opt.onnx", device="cuda")          # or "cpu" (onnxruntime), "numpy"
    outputs = sess.run({"input": x})                         # dict name -> array

- ``device="cuda"``: every node runs on the GPU (``backend.CudaBackend``). Inputs may be NumPy
  arrays (copied to the GPU), CuPy arrays or any DLPack tensor such as a torch CUDA tensor (used
  without a copy in eager mode); outputs are CuPy arrays. With ``cuda_graphs=True`` (the default)
  the second run of an input-shape signature captures the whole run into a CUDA graph and later
  runs replay it: the feeds are copied into the graph's input buffers and the outputs copied out,
  so arrays returned earlier stay valid. A plan that cannot be captured runs eagerly, and
  ``graph_status`` says why. With symbolic dims each distinct input shape gets its own graph, up to
  ``max_graphs`` (``graphs.GraphBook``: 8, or the model's ``--shape-profile`` bucket count when
  larger); shapes past the bound run eagerly, with the reason in ``graph_status``. An eager run
  (no whole-run graph) replays each compiled step's own small CUDA graph from its second run with the
  same input addresses (``replay.StepReplay``; ``step_graphs=False`` turns that off).
- ``device="cpu"``: onnxruntime's CPU provider; graphopt custom ops run through the function bodies
  the optimized file carries.
- ``device="numpy"``: a testing aid, the CUDA backend's plan and executor with ``xp = numpy``.

``dtype="float16"`` runs an fp32 model in fp16 (cuda and numpy): float weights are cast once when
uploaded, float inputs on entry and float outputs back to their declared dtype on exit;
reductions, softmax and normalisations accumulate in fp32, GEMMs accumulate in fp32.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any, Mapping

import numpy as np
import onnx

from graphopt.errors import GraphoptError, InvalidModel, UnsupportedModel, UsageError
from graphopt.runtime import ops_custom
from graphopt.runtime.onnx_ops.registry import OPS
from graphopt.runtime.graphs import CapturedRun, CaptureFailed, GraphBook
from graphopt.runtime.plan import Plan
from graphopt.runtime.trace import trace

DEVICES = ("cuda", "cpu", "numpy")
PLAN_CACHE = 16  # input shapes whose compiled plan (and arena) a session keeps
DTYPES = {None: None, "float32": None, "fp32": None, "float16": np.float16, "fp16": np.float16}


def unsupported_nodes(graph) -> dict[str, list[str]]:
    """op -> node names the runtime cannot run (every graph and subgraph)."""
    custom = ops_custom.runnable_ops()
    bad: dict[str, list[str]] = defaultdict(list)
    for _, node in graph.walk():
        if node.domain in ("", "ai.onnx"):
            if node.op_type in OPS or node.op_type == "If":
                continue
            key = node.op_type
        elif node.domain == "graphopt" and node.op_type in custom:
            continue
        else:
            key = f"{node.domain}.{node.op_type}"
        bad[key].append(node.name or (node.outputs[0] if node.outputs else "?"))
    return dict(sorted(bad.items()))


def _describe_unsupported(bad: dict[str, list[str]], source: str) -> str:
    parts = []
    for op, nodes in bad.items():
        shown = ", ".join(repr(n) for n in nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        parts.append(f"{op} (node {shown})")
    return (f"{source}: the graphopt runtime cannot run {'; '.join(parts)}; run it with device='cpu' "
            "(onnxruntime) instead")


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device
        return False


def to_numpy(arr) -> np.ndarray:
    """A NumPy copy of a NumPy, CuPy or DLPack array (synchronises on a GPU array)."""
    if isinstance(arr, np.ndarray):
        return arr
    get = getattr(arr, "get", None)
    if callable(get) and type(arr).__module__.startswith("cupy"):
        return get()
    if hasattr(arr, "__dlpack__"):
        try:
            return np.from_dlpack(arr)
        except Exception:  # noqa: BLE001 - a device tensor: go through its own host copy
            return np.asarray(arr.cpu()) if hasattr(arr, "cpu") else np.asarray(arr)
    return np.asarray(arr)


class Session:
    """Runs one model; plans are cached per input-shape signature."""

    def __init__(self, model_or_path, device: str = "cuda", dtype: str | None = None, *, cuda_graphs: bool = True,
                 max_graphs: int | None = None, step_graphs: bool = True, copy_outputs: bool = True):
        if max_graphs is not None and (isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1):
            raise UsageError(f"max_graphs {max_graphs!r}: expected a positive integer")
        if not isinstance(copy_outputs, bool):
            raise UsageError(f"copy_outputs {copy_outputs!r}: expected True or False")
        if device not in DEVICES:
            raise UsageError(f"device {device!r}: expected one of {', '.join(DEVICES)}")
        if dtype not in DTYPES:
            raise UsageError(f"dtype {dtype!r}: expected float32 or float16")
        from graphopt.ir import load_model

        self.source = str(model_or_path) if not isinstance(model_or_path, onnx.ModelProto) else "model"
        self.graph = load_model(model_or_path)
        self.graph.toposort()
        self.device = device
        self.compute_dtype = DTYPES[dtype]
        self.opset = int(self.graph.opset.get("", self.graph.opset.get("ai.onnx", 1)))
        self.input_names = [t for t in self.graph.inputs if not self.graph.is_initializer(t)]
        self.optional_inputs = [t for t in self.graph.inputs if self.graph.is_initializer(t)]
        self.output_names = list(self.graph.outputs)
        self.cuda_graphs = bool(cuda_graphs) and device == "cuda"
        # False: a CUDA-graph replay returns the graph's own output buffers, valid until this session's
        # next run of the same input shapes (torch.compile's reduce-overhead contract), not copies of them
        self.copy_outputs = copy_outputs
        self.last_peak_bytes: int | None = None
        self.last_plan: Plan | None = None
        self.graph_status: str = "off" if not self.cuda_graphs else "not captured yet"
        self._plans: dict[tuple, Plan] = {}
        self._graphs = GraphBook(self.graph, max_graphs)  # CUDA graphs per input shape, bounded
        self._declared_memo: dict[str, Any] = {}
        self._feeds_ok: set[tuple] = set()  # (name, dtype, shape) sets already checked: a run's host time counts
        self._events: tuple | None = None  # (into the session stream, back to the caller), reused every run
        self._ort = None
        if device == "cpu":
            if self.compute_dtype is not None:
                raise UsageError("dtype float16 runs on device 'cuda' (or 'numpy'); on 'cpu' optimize with fp16 instead")
            self._ort = _ort_session(self.graph)
            return
        bad = unsupported_nodes(self.graph)
        if bad:
            raise UnsupportedModel(_describe_unsupported(bad, self.source))
        if device == "cuda":
            from graphopt.runtime.backend import CudaBackend

            self.backend = CudaBackend(self.compute_dtype, cuda_graphs=self.cuda_graphs, step_graphs=step_graphs)
        else:
            from graphopt.runtime.backend import NumpyBackend

            self.backend = NumpyBackend(self.compute_dtype)

    # -- feeds ----------------------------------------------------------------------------------
    def _declared(self, name: str):
        vi = self._declared_memo.get(name)
        if vi is None:
            vi = self._declared_memo[name] = self.graph.value_info(name)
        return vi

    def _check_feeds(self, feeds: Mapping[str, Any]) -> None:
        """Names, dtypes and shapes against the model's inputs: ``UsageError`` (exit 2) naming the input.
        A set of names, dtypes and shapes that passed once is not checked again."""
        try:
            key = tuple((n, str(v.dtype), tuple(v.shape)) for n, v in feeds.items())
        except AttributeError:  # a scalar or a list: the full check
            key = None
        if key is not None and key in self._feeds_ok:
            return
        self._check_feeds_fully(feeds)
        if key is not None and len(self._feeds_ok) < 64:
            self._feeds_ok.add(key)

    def _check_feeds_fully(self, feeds: Mapping[str, Any]) -> None:
        unknown = sorted(set(feeds) - set(self.input_names) - set(self.optional_inputs))
        if unknown:
            raise UsageError(f"{self.source}: unknown input(s) {', '.join(map(repr, unknown))}; "
                             f"the model's inputs are {', '.join(map(repr, self.input_names))}")
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise UsageError(f"{self.source}: missing input(s) {', '.join(map(repr, missing))}")
        for name, value in feeds.items():
            vi = self._declared(name)
            # device arrays refuse np.asarray (an implicit device-to-host copy): read dtype/shape as attributes
            dtype = np.dtype(value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype)
            shape = tuple(value.shape) if hasattr(value, "shape") else tuple(np.shape(value))
            if vi.dtype:
                want = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.dtype))
                if dtype != want:
                    raise UsageError(f"{self.source}: input {name!r} has dtype {dtype.name}, the model declares "
                                     f"{want.name}; convert it (numpy: arr.astype('{want.name}'))")
            if vi.shape is not None:
                if len(vi.shape) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(vi.shape, shape)):
                    shown = "x".join(str(d) if isinstance(d, int) else str(d or "?") for d in vi.shape)
                    raise UsageError(f"{self.source}: input {name!r} has shape {shape}, the model declares {shown}")

    def _convert_feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        arrays = {name: self._to_backend(value, name) for name, value in feeds.items()}
        self._check_feeds(arrays)
        out: dict[str, Any] = {}
        for name, arr in arrays.items():
            if self.compute_dtype is not None and np.dtype(arr.dtype) == np.float32:
                arr = arr.astype(self.compute_dtype)
            out[name] = arr
        return out

    def _to_backend(self, value, name: str):
        if self.device == "cuda":
            cupy = self.backend.cupy
            if isinstance(value, cupy.ndarray):
                return value
            if isinstance(value, np.ndarray) or np.isscalar(value):
                return cupy.asarray(value)
            if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__") and value.__dlpack_device__()[0] == 2:
                return cupy.from_dlpack(value)  # a CUDA tensor (torch, jax, ...): no copy
            return cupy.asarray(to_numpy(value))
        return to_numpy(value) if not isinstance(value, np.ndarray) else value

    def _dims(self, feeds: Mapping[str, Any]) -> dict[str, int]:
        dims: dict[str, int] = {}
        for name, arr in feeds.items():
            shape = self._declared(name).shape
            if shape is None:
                continue
            for d, v in zip(shape, arr.shape):
                if isinstance(d, str) and d:
                    dims.setdefault(d, int(v))
        return dims

    # -- running ----------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any], output_names=None) -> dict[str, Any]:
        """Run the model; ``{output name: array}`` (CuPy on cuda, NumPy elsewhere)."""
        if self._ort is not None:
            names = list(output_names or self.output_names)
            np_feeds = {k: to_numpy(v) for k, v in feeds.items()}
            self._check_feeds(np_feeds)
            try:
                res = self._ort.run(names, np_feeds)
            except Exception as e:  # noqa: BLE001 - onnxruntime's own exception types
                raise GraphoptError(f"{self.source}: onnxruntime could not run the model: {str(e).splitlines()[0][:300]}") from None
            return dict(zip(names, res))
        if self.device == "cuda":
            outs = self._run_cuda_ordered(feeds)
        else:
            conv = self._convert_feeds(feeds)
            sig = tuple((n, tuple(int(d) for d in a.shape), np.dtype(a.dtype).str) for n, a in sorted(conv.items()))
            with np.errstate(all="ignore"):
                outs = self._run_plan(sig, conv)
        result = dict(zip(self.output_names, outs))
        if output_names is not None:
            result = {n: result[n] for n in output_names}
        return result

    def _plan_and_run(self, sig, conv):
        plan = self._plans.pop(sig, None)
        if plan is not None:
            self._plans[sig] = plan  # most recently used last
            return plan, None
        self.backend.dims = self._dims(conv)
        plan, outs = trace(self.graph, self.backend, conv, opset=self.opset, signature=sig)
        if plan.dynamic is None:
            self._plans[sig] = plan
            self._evict_plans()
        self.last_plan = plan
        self.last_peak_bytes = plan.peak_bytes
        return plan, self._cast_out(outs)

    def _evict_plans(self) -> None:
        """A cached plan holds its arena: keep at most ``PLAN_CACHE`` plans (and every plan with a CUDA
        graph, which replays into its arena), dropping the least recently used first; a dropped
        shape is traced again when it comes back."""
        while len(self._plans) > PLAN_CACHE:
            victim = next((s for s in self._plans if not self._graphs.get(s)), None)
            if victim is None:
                return
            del self._plans[victim]

    def _run_plan(self, sig, conv, profile=None):
        plan, outs = self._plan_and_run(sig, conv)
        if outs is not None:
            return outs
        self.last_plan = plan
        self.last_peak_bytes = plan.peak_bytes
        return self._cast_out(plan.execute(conv, profile))

    def _cast_out(self, outs):
        if self.compute_dtype is None:
            return outs
        res = []
        for name, o in zip(self.output_names, outs):
            vi = self._declared(name)
            if vi.dtype == onnx.TensorProto.FLOAT and o.dtype == self.compute_dtype:
                o = o.astype(np.float32)
            res.append(o)
        return res

    def _run_cuda_ordered(self, feeds):
        """Run on the session stream, ordered after the caller's current stream and before its
        next work, through events only (no host synchronisation): inputs the caller just wrote are
        complete before the first kernel, and ``out.get()`` or any later kernel of the caller sees
        the finished outputs."""
        from graphopt.runtime.backend import current_stream

        be = self.backend
        cupy = be.cupy
        shared = current_stream(cupy)
        if be.stream is not shared:  # another session's failed capture replaced the shared stream
            be.set_stream(shared)
        caller = cupy.cuda.get_current_stream()
        if self._events is None:  # recorded again every run: a wait takes the event's latest record
            self._events = (cupy.cuda.Event(disable_timing=True), cupy.cuda.Event(disable_timing=True))
        into, back = self._events
        with be.stream:
            if caller.ptr != be.stream.ptr:
                into.record(caller)
                be.stream.wait_event(into)
            conv = self._convert_feeds(feeds)
            sig = tuple((n, tuple(int(d) for d in a.shape), np.dtype(a.dtype).str) for n, a in sorted(conv.items()))
            outs = self._run_cuda(sig, conv)
            if caller.ptr != be.stream.ptr:
                back.record(be.stream)
                caller.wait_event(back)
        return outs

    def _run_cuda(self, sig, conv):
        be = self.backend
        with be.stream:
            if not self.cuda_graphs or sig not in self._plans:
                outs = self._run_plan(sig, conv)
                if self.cuda_graphs and self.last_plan is not None and self.last_plan.dynamic:
                    self.graph_status = f"eager: {self.last_plan.dynamic}"  # rebuilt every run, never captured
                return outs
            plan = self._plans[sig]
            if plan.capture_reason is not None:
                self.graph_status = f"eager: {plan.capture_reason}"
                return self._run_plan(sig, conv)
            cap = self._graphs.get(sig)
            if cap is None:
                why = self._graphs.full(sig)
                if why:
                    self.graph_status = f"eager: {why}"
                    return self._run_plan(sig, conv)
                try:
                    cap = CapturedRun.capture(plan, conv, be)
                except CaptureFailed as e:
                    # the failed capture poisoned the stream: move to a fresh one, run eagerly from now on
                    from graphopt.runtime.backend import fresh_stream

                    be.set_stream(fresh_stream(be.cupy))
                    plan.notes.append(f"CUDA graph capture failed: {e}")
                    self._graphs.add(sig, False, self._dims(conv))
                    self.graph_status = f"eager: capture failed ({e})"
                    with be.stream:
                        return self._run_plan(sig, conv)
                self._graphs.add(sig, cap, self._dims(conv))
            if cap is False:
                return self._run_plan(sig, conv)
            self.graph_status = "replaying a CUDA graph"
            self.last_plan = plan
            self.last_peak_bytes = plan.peak_bytes
            return self._cast_out(cap.replay(conv, be.stream, copy=self.copy_outputs))

    def synchronize(self) -> None:
        if self.device == "cuda":
            self.backend.stream.synchronize()

    def profile(self, feeds: Mapping[str, Any], repeats: int = 3) -> dict[str, float]:
        """Seconds per op type (the mean over ``repeats`` eager runs), synchronising after every step.

        The synchronisation makes each step's time its own (device time plus launch overhead);
        it is a measurement mode, never how ``run`` executes.
        """
        if self._ort is not None:
            raise UsageError("profile needs device 'cuda' or 'numpy'")
        ctx = self.backend.stream if self.device == "cuda" else _Null()
        if self.device == "cuda":
            self.backend.cupy.cuda.Device().synchronize()  # the caller's uploads are complete
        with ctx:
            conv = self._convert_feeds(feeds)
        sig = tuple((n, tuple(int(d) for d in a.shape), np.dtype(a.dtype).str) for n, a in sorted(conv.items()))
        totals: dict[str, float] = defaultdict(float)
        sync = self.synchronize

        def timed(step, ins):
            t0 = time.perf_counter()
            outs = step.run(ins)
            sync()
            totals[step.op] += time.perf_counter() - t0
            return outs

        with ctx, np.errstate(all="ignore"):
            self._plan_and_run(sig, conv)
            plan = self._plans.get(sig) or self.last_plan
            sync()
            for _ in range(repeats):
                plan.execute(conv, timed)
        return {k: v / repeats for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}

    def private_pool_bytes(self) -> int:
        """GPU bytes held by this session's own memory pools: its whole-run CUDA graphs' and its step
        graphs' (``replay``). Weights, arenas and outputs come from CuPy's default pool and are not
        counted here: a peak-memory figure taken from the default pool alone misses these."""
        from graphopt.runtime.replay import replay_pool_bytes

        return self._graphs.pool_bytes() + sum(replay_pool_bytes(p.loop) for p in self._plans.values() if p.loop)

    def plan_summary(self) -> dict:
        """The last plan's summary: steps, plan-time folds, peak bytes, CUDA graph status, notes."""
        if self.last_plan is None:
            return {}
        out = self.last_plan.summary()
        out["graph_status"] = self.graph_status
        if self.cuda_graphs:
            out["cuda_graphs"] = self._graphs.summary()
        if self.device == "cuda":
            out["gemm"] = "runtime cuBLAS handle" if self.backend.blas is not None else f"cupy.matmul ({self.backend.blas_reason})"
        return out


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _ort_session(graph):
    import onnxruntime as ort

    from graphopt.ir.io import model_bytes

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    threads = os.environ.get("GRAPHOPT_ORT_THREADS")
    if threads:
        opts.intra_op_num_threads = int(threads)
    try:
        return ort.InferenceSession(model_bytes(graph), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime's own exception types
        raise InvalidModel(f"onnxruntime cannot load the model: {str(e).splitlines()[0][:300]}") from None
