"""The registry of the runtime's standard ONNX ops and what every implementation sees.

An implementation is ``fn(ctx, inputs) -> list[outputs]``, registered under its op type with
``@op(name, host=...)``. ``ctx`` (an :class:`OpContext`) carries ``xp``, the node's attributes, its
opset, and ``host(i)``: the i-th input as a NumPy array known at *plan time* (shapes, axes, pads...).
Inputs listed in ``HOST_INPUTS`` are always such plan-time values, so no op reads a device value on
the host during a run (no synchronisation on CUDA). Importing this module imports the package, whose
``__init__`` imports every family module, so ``OPS`` is always complete.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

OpFn = Callable[["OpContext", list], list]
OPS: dict[str, OpFn] = {}
# input positions that must be known at plan time (host values), per op
HOST_INPUTS: dict[str, tuple[int, ...]] = {}
# ops whose implementation calls cuBLAS through CuPy (refused during CUDA graph capture)
CUBLAS_OPS = {"Conv", "MatMul", "Gemm", "ConvTranspose"}


_MISSING = object()


class OpContext:
    """What an op implementation sees: ``xp``, attributes, opset, plan-time host inputs, accumulation dtype."""

    def __init__(self, xp, node, opset: int, host_values: dict[int, np.ndarray], compute_dtype=None, matmul=None,
                 pool=None):
        self.xp = xp
        # the backend's pooling kernel (graphopt.kernels.pool.pool2d on a GPU, any layout), or None
        self.pool = pool
        self.node = node
        self.opset = opset
        self._host = host_values
        self.compute_dtype = compute_dtype  # np.float16 when the session runs fp16, else None
        # the backend's GEMM (capture-safe cuBLAS on CUDA); xp.matmul semantics, fp32 accumulation for fp16
        self.matmul = matmul or numpy_matmul
        self._attrs: dict[str, Any] = {}  # attributes decoded once (a step's context lives as long as its plan)
        self.memo: dict[Any, Any] = {}  # what an op derives once per step (Resize: its taps on the device)

    def attr(self, name: str, default: Any = None) -> Any:
        value = self._attrs.get(name, _MISSING)
        if value is _MISSING:
            value = self._attrs[name] = self.node.attr(name, _MISSING)
        if value is _MISSING:
            return default
        return list(value) if isinstance(value, list) else value  # a list the op may change stays ours

    def host(self, i: int):
        """Input ``i`` as a NumPy array known at plan time, or None when the input is omitted."""
        return self._host.get(i)


def numpy_matmul(a, b):
    """np.matmul, accumulating half-precision products in float32 as cuBLAS does on the GPU."""
    if a.dtype == np.float16:
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    return np.matmul(a, b)


def op(name: str, host: tuple[int, ...] = ()):
    """Decorator: register ``fn`` as op type ``name``, whose inputs at positions ``host`` are plan-time values."""

    def deco(fn: OpFn) -> OpFn:
        OPS[name] = fn
        if host:
            HOST_INPUTS[name] = host
        return fn

    return deco


def for_accumulation(ctx, x):
    """fp32 accumulation copy of a half-precision tensor (reductions, softmax, normalisation)."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


def on_host(xp, x) -> bool:
    """Whether ``x`` is a host (NumPy) value on a backend whose arrays are ``xp``'s: any NumPy array
    with the NumPy backend; with a device backend, a NumPy array that is not the device's own array
    type (CuPy's arrays are no NumPy arrays; the CPU tests' fake CuPy's are a NumPy subclass, so
    ``isinstance(x, np.ndarray)`` alone took its device arrays for host values)."""
    if not isinstance(x, np.ndarray):
        return False
    device_type = getattr(xp, "ndarray", None)
    return xp is np or device_type is None or not isinstance(x, device_type)


def host_ints(a) -> list[int]:
    """A plan-time host value (shape, axes, pads...) as a list of Python ints."""
    return [int(v) for v in np.asarray(a).reshape(-1)]


def supported_ops() -> list[str]:
    """Standard op types the runtime implements (If is handled by the planner), sorted."""
    return sorted(set(OPS) | {"If"})
