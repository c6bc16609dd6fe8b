"""Backends: the array module and everything device-specific the plan needs.

- ``NumpyBackend`` (``device="numpy"``, a testing aid): the same plan and executor with
  ``xp = numpy``; custom ops run their float64 NumPy references. CPU CI tests the executor and
  every op against onnxruntime through it.
- ``CudaBackend`` (``device="cuda"``): ``xp = cupy`` on one non-blocking stream; GEMMs through
  ``graphopt.kernels.blas.matmul`` (capture-safe; ``cupy.matmul`` when that fails its self-test,
  and for float64 / integer GEMMs, and then those steps are not capturable); custom ops through their recorded lowering.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto

from graphopt.errors import GraphoptError, TuningError
from graphopt.kernels import pool as pool_kernels
from graphopt.kernels import transpose as transpose_kernels
from graphopt.kernels.heuristic import DEFAULT_LOWERING, heuristic_lowering
from graphopt.kernels.registry import candidate_from_key, signature_of
from graphopt.lowering.contract import build_lowering
from graphopt.lowering.layout import to_layout
from graphopt.runtime import ops_custom
from graphopt.runtime.onnx_ops.layout_order import for_device
from graphopt.runtime.onnx_ops.registry import CUBLAS_OPS, OPS, OpContext, numpy_matmul
from graphopt.runtime.compiled import Lowered


def _declared_float32(graph, node) -> bool:
    """Whether the node's first input is declared float32 in the file (or undeclared): its recorded
    lowering was then chosen for float32. A model already in float16 run with ``dtype="float16"``
    keeps its tuned choices (plan_breakdown ran the heuristic's until 2026-12-05)."""
    try:
        declared = graph.dtype(node.inputs[0]) if node.inputs and node.inputs[0] else None
    except Exception:  # noqa: BLE001 - no type information: assume the conversion applies
        return True
    return declared is None or declared == TensorProto.FLOAT


class RuntimeFailure(GraphoptError):
    """A node could not run (bad input values, a kernel that refused the shapes)."""

    exit_code = 12


class _Backend:
    name = "?"
    xp: Any = np
    user_errors: tuple = (ValueError, IndexError, TypeError, NotImplementedError, ZeroDivisionError, OverflowError)

    def __init__(self, compute_dtype=None):
        self.compute_dtype = None if compute_dtype is None else np.dtype(compute_dtype)
        self.dims: dict[str, int] = {}  # symbolic dim -> actual size for the run being traced
        self.workspace_bytes = 0  # lowering workspaces allocated at plan build (counted in peak memory)
        self.matmul = numpy_matmul
        self.pool = None  # a pooling-kernel module (CUDA only), handed to the standard ops
        self.to_layout = to_layout  # a compiled step's input conversions (CUDA: the tiled transpose)

    @staticmethod
    def error(message: str) -> GraphoptError:
        return RuntimeFailure(message)

    # -- values -------------------------------------------------------------------------------
    def cast_in(self, host: np.ndarray) -> np.ndarray:
        """fp16 execution: float weights cast once, here. A finite value beyond the compute type's range
        saturates to its largest finite value (an exporter's fp32 mask constant, finfo(float32).min,
        becomes -65504, as torch's fp16 masks use finfo(float16).min, not -inf, which would give a fully
        masked row NaN, and no overflow warning); inf and NaN stay."""
        if self.compute_dtype is None or host.dtype != np.float32:
            return host
        with np.errstate(over="ignore"):
            out = host.astype(self.compute_dtype)
        if self.compute_dtype.kind == "f" and self.compute_dtype.itemsize < host.dtype.itemsize:
            overflowed = np.isinf(out) & np.isfinite(host)
            if overflowed.any():
                out[overflowed] = np.copysign(np.finfo(self.compute_dtype).max, host[overflowed])
        return out

    def upload(self, host: np.ndarray, name: str = ""):
        return self.cast_in(host if host.flags.c_contiguous else host.copy())

    def ensure_device(self, value):
        return np.asarray(value)

    def to_host(self, value) -> np.ndarray:
        return np.asarray(value)

    def block_id(self, arr) -> int:
        base = arr
        while getattr(base, "base", None) is not None and isinstance(base.base, np.ndarray):
            base = base.base
        return id(base)

    def block_bytes(self, arr) -> int:
        base = arr
        while getattr(base, "base", None) is not None and isinstance(base.base, np.ndarray):
            base = base.base
        return int(getattr(base, "nbytes", 0))

    # -- the arena (graphopt.runtime.compiled) --------------------------------------------------
    def arena_alloc(self, nbytes: int):
        """The plan's one allocation for the buffers it owns."""
        return self.xp.empty(int(nbytes), dtype=np.uint8)

    def arena_view(self, arena, offset: int, like):
        """An array with ``like``'s shape, dtype and strides at ``offset`` bytes into ``arena``."""
        return np.ndarray(like.shape, like.dtype, buffer=arena, offset=int(offset), strides=like.strides)

    def arena_view_bytes(self, arena, offset: int, nbytes: int):
        """``nbytes`` bytes of ``arena`` from ``offset`` (a lowering's workspace)."""
        return arena[int(offset):int(offset) + int(nbytes)]

    def matmul_into(self, a, b, trans_a: bool, trans_b: bool, alpha: float, gemm: bool):
        """``run(a, b, out)``: ``alpha * op(a) @ op(b)`` into ``out``, prepared once for these
        operands' shapes and dtype (MatMul semantics, or Gemm's 2-D ones with ``gemm``); None when
        this backend has no such path for them (the step then runs its generic implementation)."""
        return None

    # -- steps --------------------------------------------------------------------------------
    def capture_issue(self, op: str) -> str | None:
        return None

    def std_step(self, node, opset: int, host_vals: dict, dyn_pos: list[int]):
        fn = for_device(node.op_type, OPS[node.op_type])
        xp, cd, mm, pool = self.xp, self.compute_dtype, self.matmul, self.pool
        if not dyn_pos:
            ctx = OpContext(xp, node, opset, host_vals, cd, mm, pool)
            return lambda ins: fn(ctx, ins)

        def run(ins):
            hv = dict(host_vals)
            ins = list(ins)
            for i in dyn_pos:
                hv[i] = self.to_host(ins[i])
                ins[i] = None
            return fn(OpContext(xp, node, opset, hv, cd, mm, pool), ins)

        return run

    def if_step(self, graph, node, opset: int, vals, arrays):
        from graphopt.runtime.trace import _Host, trace

        branches = dict(node.subgraph_items())
        cond = vals[0]
        static = isinstance(cond, _Host)

        def run(ins, outer):
            c = cond.value if static else self.to_host(ins[0])
            branch = branches["then_branch"] if bool(np.asarray(c).reshape(-1)[0]) else branches["else_branch"]
            _, outs = trace(branch, self, {}, opset=opset, outer=outer)
            return outs

        dyn = None if static else "the If condition is a device value (read on the host every run)"
        return run, "If runs its branch through a nested plan (eager)", dyn

    def custom_step(self, graph, node, in_arrays):
        raise NotImplementedError


class NumpyBackend(_Backend):
    """``device="numpy"``: a testing aid that runs the real plan with ``xp = numpy``."""

    name = "numpy"
    xp = np

    def matmul_into(self, a, b, trans_a, trans_b, alpha, gemm):
        if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
            return None  # float16 keeps numpy_matmul's float32 accumulation

        def run(x, y, out):
            np.matmul(x.T if trans_a else x, y.T if trans_b else y, out=out)
            if alpha != 1.0:
                np.multiply(out, out.dtype.type(alpha), out=out)

        return run

    def custom_step(self, graph, node, in_arrays):
        from graphopt.ops import get_schema

        schema = get_schema(node.op_type)
        attrs = ops_custom.op_attrs(node)
        if self.compute_dtype is None:
            return (lambda ins: schema.reference(ins, attrs)), None, None
        # fp16: the reference computes in float64 and returns the first input's dtype
        return (lambda ins: [np.asarray(y) for y in schema.reference(ins, attrs)]), None, None


_STREAMS: list = []
_BLAS: dict[int, str | None] = {}  # device id -> None (graphopt.kernels.blas works) or why not


def _shared_stream(cupy):
    """One non-blocking stream per process for every session (they then never race each other)."""
    if not _STREAMS:
        _STREAMS.append(cupy.cuda.Stream(non_blocking=True))
    return _STREAMS[0]


def current_stream(cupy):
    """The shared stream sessions run on now (created on first use)."""
    return _shared_stream(cupy)


def fresh_stream(cupy):
    """Replace the shared stream (after a failed capture poisoned it) and return the new one."""
    stream = cupy.cuda.Stream(non_blocking=True)
    _STREAMS[:] = [stream]
    return stream


def _blas_reason(cupy) -> str | None:
    """None when graphopt.kernels.blas (capture-safe cuBLAS) works on this device, else why not; tested once."""
    dev = cupy.cuda.Device().id
    if dev not in _BLAS:
        try:
            from graphopt.kernels import blas

            _BLAS[dev] = blas.self_test()
        except Exception as e:  # noqa: BLE001 - no libcublas, or a symbol missing: use cupy.matmul
            _BLAS[dev] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return _BLAS[dev]


class CudaBackend(_Backend):
    """``device="cuda"``: CuPy on one stream; custom ops through their lowerings."""

    name = "cuda"
    user_errors = _Backend.user_errors

    def __init__(self, compute_dtype=None, cuda_graphs: bool = True, stream=None, step_graphs: bool = True):
        super().__init__(compute_dtype)
        try:
            import cupy
        except ImportError:
            raise TuningError("device 'cuda' needs CuPy: pip install 'graphopt[gpu]' (or use device='cpu')") from None
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # noqa: BLE001 - CUDA driver missing or broken
            raise TuningError(f"device 'cuda': no usable GPU ({str(e).splitlines()[0][:200]}); use device='cpu'") from None
        if n < 1:
            raise TuningError("device 'cuda': no GPU found; use device='cpu'")
        self.cupy = cupy
        self.xp = cupy
        self.cuda_graphs = cuda_graphs
        cc = cupy.cuda.Device().compute_capability
        self.compute_capability = (int(cc[:-1]), int(cc[-1]))
        self.arch = f"sm_{cc}"
        self.set_stream(stream or _shared_stream(cupy))
        self.user_errors = _Backend.user_errors + (cupy.cuda.memory.OutOfMemoryError,)
        # eager runs replay each compiled step's CUDA graph (graphopt.runtime.replay); a real CuPy only
        self.step_graphs = bool(step_graphs) and hasattr(cupy.cuda, "Stream") and hasattr(cupy, "RawModule")
        if hasattr(cupy, "RawModule"):  # a real CuPy (the CPU tests' stand-in has no kernels)
            self.pool = pool_kernels
            self.to_layout = transpose_kernels.to_layout

    def _cupy_matmul(self, a, b):
        return self.cupy.matmul(a, b)

    def set_stream(self, stream) -> None:
        """Run on ``stream`` (a fresh one after a failed capture, which poisons the old one)."""
        self.stream = stream
        with stream:
            self.blas_reason = _blas_reason(self.cupy)
        self.blas = None
        if self.blas_reason is None:
            from graphopt.kernels import blas

            self.blas = blas
        self.matmul = self._blas_matmul if self.blas is not None else self._cupy_matmul

    def _blas_matmul(self, a, b):
        if a.dtype == b.dtype and a.dtype.name in ("float16", "float32"):
            return self.blas.matmul(a, b)
        return self.cupy.matmul(a, b)  # float64 / integer GEMMs: rare in models; CuPy's path (not capturable)

    def upload(self, host: np.ndarray, name: str = ""):
        return self.cupy.asarray(self.cast_in(host if host.flags.c_contiguous else host.copy()))

    def ensure_device(self, value):
        if isinstance(value, self.cupy.ndarray):
            return value
        return self.cupy.asarray(np.asarray(value))

    def to_host(self, value) -> np.ndarray:
        return self.cupy.asnumpy(value) if isinstance(value, self.cupy.ndarray) else np.asarray(value)

    def block_id(self, arr) -> int:
        return id(arr.data.mem) if isinstance(arr, self.cupy.ndarray) else super().block_id(arr)

    def arena_view(self, arena, offset: int, like):
        return self.cupy.ndarray(like.shape, like.dtype, memptr=arena.data + int(offset), strides=like.strides)

    def block_bytes(self, arr) -> int:
        return int(arr.data.mem.size) if isinstance(arr, self.cupy.ndarray) else super().block_bytes(arr)

    def capture_issue(self, op: str) -> str | None:
        if op in CUBLAS_OPS and self.blas is None:
            return f"cupy.matmul refuses stream capture, and the runtime's own cuBLAS path is unavailable ({self.blas_reason})"
        return None

    def matmul_into(self, a, b, trans_a, trans_b, alpha, gemm):
        if self.blas is None or a.dtype != b.dtype or a.dtype.name not in ("float16", "float32"):
            return None
        try:
            return self._bound_gemm(a, b, trans_a, trans_b, alpha, gemm)
        except TuningError:  # the library went missing since the self-test: the generic path
            return None

    def _bound_gemm(self, a, b, trans_a, trans_b, alpha, gemm):
        dt = a.dtype.name
        if gemm:
            if a.ndim != 2 or b.ndim != 2:
                return None
            M, K = (a.shape[1], a.shape[0]) if trans_a else a.shape
            N = b.shape[0] if trans_b else b.shape[1]
            if 0 in (M, N, K):
                return None
            return self.blas.bound_gemm(dt, int(M), int(N), int(K), trans_a=trans_a, trans_b=trans_b, alpha=alpha)
        g = self.blas.gemm_args(tuple(a.shape), tuple(b.shape))
        if g.broadcast_a is not None or g.broadcast_b is not None or 0 in (g.M, g.N, g.K):
            return None
        return self.blas.bound_gemm(dt, g.M, g.N, g.K, batch=g.batch, stride_a=g.stride_a, stride_b=g.stride_b,
                                    stride_c=g.stride_c)

    def _build(self, op: str, key: str, sig):
        """(Lowering, None) for candidate ``key`` on ``sig``, or (None, why it cannot run here)."""
        try:
            cand = candidate_from_key(op, key)
        except GraphoptError as e:
            return None, str(e)
        reason = cand.applies(sig, self.compute_capability)
        if reason:
            return None, f"lowering {key} does not apply ({reason})"
        try:
            return build_lowering(cand, sig, self.arch), None
        except Exception as e:  # noqa: BLE001 - a kernel that fails to build must not stop the model
            return None, f"lowering {key} failed to build ({type(e).__name__}: {str(e)[:160]})"

    def _trace_workspace(self, nbytes: int):
        """A workspace for a lowering's traced (first) run: the front of one scratch buffer every node
        shares, grown when a node needs more. Steps run one after another on one stream, so sharing is
        safe; the compiled plan then gives each placed step its own arena bytes. One buffer per node
        (as until 2026-12-05) kept the sum of every node's workspace allocated for the session's life:
        the likely bulk of BERT bs32's 1,144 MB pool against a 36 MB plan peak on the H200."""
        if not nbytes:
            return None
        scratch = getattr(self, "_scratch", None)
        if scratch is None or scratch.nbytes < nbytes:
            scratch = self._scratch = self.cupy.empty(nbytes, dtype=self.cupy.uint8)
        return scratch[:nbytes]

    def custom_step(self, graph, node, in_arrays):
        """(run, capture problem, note): the recorded lowering, else the op's device fallback and why.

        Nothing runs on the host: a node whose lowering cannot run and whose op has no device
        fallback (``OpSchema.xp_impl``) is refused here, naming the node, before any run."""
        op = node.op_type
        attrs = ops_custom.op_attrs(node)
        n_out = len(node.outputs)
        ctx = OpContext(self.cupy, node, 0, {}, self.compute_dtype, self.matmul)
        impl = ops_custom.device_impl(op)

        def fallback_for(why: str):
            if impl is None:
                raise self.error(f"node {node.name!r} (graphopt.{op}): {why}, and the op has no device implementation "
                                 f"(OpSchema.xp_impl): it would run on the host. Re-run `graphopt optimize` for this "
                                 f"GPU, or give the op an xp_impl")
            return (lambda ins: impl(ctx, ins, attrs)), self.capture_issue("MatMul"), f"{why}: runs the CuPy fallback"

        try:
            key = ops_custom.lowering_key(node, self.dims)
        except ValueError as e:
            raise self.error(str(e)) from None
        if key is None:
            return fallback_for("no lowering recorded")
        shapes = [None if a is None else tuple(int(d) for d in a.shape) for a in in_arrays]
        dtypes = ["" if a is None else np.dtype(a.dtype).name for a in in_arrays]
        sig = signature_of(op, shapes, dtypes, attrs)
        note = None
        if self.compute_dtype is not None and _declared_float32(graph, node):
            # a float32 model run in float16: the recorded choice was made for float32 signatures;
            # the heuristic's choice for the dtype that actually runs (profile the model converted with
            # `optimize --precision fp16` for tuned float16 choices)
            name, params, _ = heuristic_lowering(op, sig, self.compute_capability)
            if name != DEFAULT_LOWERING:
                redo = f"{name}:{params}" if params else name
                if redo != key:
                    note = f"recorded {key} was chosen for float32; runs {redo}, the heuristic's {dtypes[0]} choice"
                    key = redo
        lowering, why = self._build(op, key, sig)
        if lowering is None:
            # the recorded lowering cannot run here (a vendor library missing, a shape it refuses):
            # the heuristic's own-kernel choice for these shapes, before the CuPy fallback
            name, params, _ = heuristic_lowering(op, sig, self.compute_capability, providers=False)
            own = f"{name}:{params}" if params else name
            if name != DEFAULT_LOWERING and own != key:
                lowering, why2 = self._build(op, own, sig)
                if lowering is not None:
                    note = f"{why}: runs {own} (the own-kernel heuristic)"
                    key = own
                else:
                    why = f"{why}; {why2}"
            if lowering is None:
                return fallback_for(why)
        if lowering.outputs < n_out:
            return fallback_for(f"lowering {key} fills {lowering.outputs} of the node's {n_out} outputs")
        if not lowering.capturable and self.cuda_graphs:
            fb = fallback_for(f"lowering {key} cannot be captured in a CUDA graph")
            if fb[1] is None:  # the fallback captures: it is the better choice with graphs on
                return fb
        out_shape = ops_custom.output_shape(op, shapes, attrs, sig)
        out_dtype = in_arrays[0].dtype
        cupy = self.cupy
        workspace = self._trace_workspace(int(lowering.workspace_bytes))
        self.workspace_bytes += int(lowering.workspace_bytes)
        n_in = len(in_arrays)
        # Constant inputs (weights) are put into the lowering's layout once, here; activations are
        # converted only when their producer left them in another layout (a CNN region's edge).
        fixed = {i: lowering.conform([None] * i + [a], cupy)[i] for i, a in enumerate(in_arrays)
                 if a is not None and i < len(node.inputs) and graph.is_constant(node.inputs[i])}

        def run(ins):
            ins = lowering.conform([fixed.get(i, a) for i, a in enumerate(ins)], cupy)
            outs = lowering.empty_outputs(n_in, [out_shape] * n_out, out_dtype, cupy)
            lowering.launch(ins, outs, workspace)
            return outs

        # what compile_plan needs to rebind the step to arena outputs and an arena workspace
        run.lowered = Lowered(lowering, key, fixed, out_shape, out_dtype, n_in, n_out, workspace)
        capture = None if lowering.capturable else f"lowering {key} cannot be captured in a CUDA graph"
        return run, capture, note

