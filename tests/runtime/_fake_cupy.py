"""A NumPy-backed stand-in for the parts of CuPy the runtime's CUDA backend touches, so the
device="cuda" control flow (stream ordering, feeds, DLPack, block accounting, capture fallbacks,
lowering fallbacks) runs on a CPU. Not a GPU model: kernels cannot build here (no NVRTC device), so
custom ops take their CuPy-fallback path; every "device" array is a NumPy array subclass."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import types
import weakref

import numpy as np

_ptrs = itertools.count(0x1000, 0x100)


class _Mem:
    def __init__(self, size):
        self.size = size


_MEMS: dict = {}  # id(root array) -> (weak reference to it, its _Mem): one block per root, as CuPy's pool


def _mem_of(base) -> _Mem:
    entry = _MEMS.get(id(base))
    if entry is None or entry[0]() is not base:
        entry = _MEMS[id(base)] = (weakref.ref(base), _Mem(base.nbytes))
    return entry[1]


class _Data:
    def __init__(self, arr):
        base = arr
        while isinstance(getattr(base, "base", None), np.ndarray):
            base = base.base
        self.mem = _mem_of(base)
        self.ptr = arr.__array_interface__["data"][0]
        self.arr, self.offset = arr, 0

    def __add__(self, offset):  # cupy: MemoryPointer + bytes
        moved = _Data(self.arr)
        moved.offset = self.offset + int(offset)
        moved.ptr = self.ptr + int(offset)
        return moved


class ndarray(np.ndarray):  # noqa: N801 - mirrors cupy.ndarray
    def __new__(cls, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is None:
            return np.ndarray.__new__(cls, shape, dtype, strides=strides, order=order)
        # cupy.ndarray(shape, dtype, memptr=base.data + offset, strides=...): a view of that memory
        return np.ndarray.__new__(cls, shape, dtype, buffer=memptr.arr, offset=memptr.offset, strides=strides)

    @property
    def data(self):  # cupy: a MemoryPointer with .mem (the pool block) and .ptr
        _count("data")
        return _Data(self)

    def get(self, stream=None):
        _count("to_host")
        return np.array(self, copy=True).view(np.ndarray)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """As CuPy: an elementwise op allocates its output in C order whatever its inputs' strides
        (CuPy's ufuncs take no ``order``; NumPy's default keeps the inputs' order). A given ``out``
        is written and returned."""
        plain = [x.view(np.ndarray) if isinstance(x, ndarray) else x for x in inputs]
        given = kwargs.get("out")
        if given is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, ndarray) else o for o in given)
        elif method == "__call__":
            kwargs["order"] = "C"
        result = getattr(ufunc, method)(*plain, **kwargs)
        if given is not None:
            return given[0] if len(given) == 1 else given
        return _wrap(result)


def _wrap(x):
    if isinstance(x, np.ndarray) and not isinstance(x, ndarray):
        return x.view(ndarray)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _lift(fn):
    def f(*a, **k):
        return _wrap(fn(*a, **k))

    return f


CALLS: dict = {}  # with make(graphs=True): device-API-like calls by name (a host-cost proxy: each costs CuPy ~0.5-3 us)
_GRAPHS: list = [False]  # whether captures succeed (make(graphs=True))


def _count(name):
    CALLS[name] = CALLS.get(name, 0) + 1


class _Graph:
    """A captured "graph": launching it does nothing here (the fake computes eagerly while capturing)."""

    def launch(self, stream=None):
        _count("graph_launch")

    def upload(self, stream=None):
        pass


class _RawKernel:
    def __init__(self, source, name, **kw):
        self.name = name

    def __call__(self, grid, block, args, **kw):
        _count("kernel_launch")


class _Stream:
    def __init__(self, non_blocking=False, null=False):
        self.ptr = 0 if null else next(_ptrs)
        self.capturing = False
        self.waits = 0

    def is_capturing(self):
        _count("is_capturing")
        return self.capturing

    def __enter__(self):
        _current.append(self)
        return self

    def __exit__(self, *exc):
        _current.pop()
        return False

    def record(self, event=None):
        return _Event()

    def wait_event(self, event):
        self.waits += 1

    def synchronize(self):
        _count("synchronize")

    def begin_capture(self):
        self.capturing = True

    def end_capture(self):  # as CUDA reports a capture that an illegal call invalidated
        self.capturing = False
        if _GRAPHS[0]:
            return _Graph()
        raise RuntimeError("cudaErrorStreamCaptureInvalidated: fake CuPy cannot capture")


class _Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.records = 0

    def record(self, stream=None):
        self.records += 1

    @property
    def done(self):
        return True

    def synchronize(self):
        _count("synchronize")


_null = _Stream(null=True)
_current: list = [_null]


class _Device:
    def __init__(self, i=0):
        self.id = i
        self.compute_capability = "90"

    def synchronize(self):
        _count("synchronize")


class _Pool:
    def malloc(self, n):
        raise NotImplementedError

    def free_all_blocks(self):
        pass


def make(graphs: bool = False):
    """A fresh fake ``cupy`` module, plus the ``cupyx`` pieces the ops use. ``graphs``: stream
    captures succeed (their graphs launch as no-ops), ``RawKernel`` launches count and do nothing,
    and ``CALLS`` counts those calls, pointer reads and allocations (the host-cost benchmark's and
    the step-replay tests' fake; the runtime's other tests keep a fake that cannot capture)."""
    _GRAPHS[0] = graphs
    CALLS.clear()
    cp = types.ModuleType("cupy")
    cp.__fake__ = True
    for name in dir(np):
        obj = getattr(np, name)
        if callable(obj) and not isinstance(obj, type):
            setattr(cp, name, _lift(obj))
        elif not name.startswith("__"):
            setattr(cp, name, obj)
    cp.ndarray = ndarray
    cp.asarray = lambda a, dtype=None: _wrap(np.array(a, dtype=dtype, copy=True) if not isinstance(a, np.ndarray)
                                             else np.asarray(a, dtype=dtype).copy())
    def asnumpy(a, stream=None):
        _count("to_host")
        return np.array(a, copy=True).view(np.ndarray)

    cp.asnumpy = asnumpy
    cp.from_dlpack = lambda t: _wrap(np.from_dlpack(t))
    cp.get_default_memory_pool = lambda: _Pool()
    if graphs:
        cp.RawKernel = _RawKernel
        np_empty = cp.empty

        def empty(*a, **k):
            _count("empty")
            return np_empty(*a, **k)

        cp.empty = empty
    cuda = types.SimpleNamespace()
    cuda.Stream = _Stream
    cuda.Event = _Event
    cuda.Device = _Device
    cuda.get_current_stream = lambda: _current[-1]
    def memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream):  # host addresses here
        _count("memcpy2d")
        for r in range(height):
            ctypes.memmove(dst + r * dpitch, src + r * spitch, width)

    def memcpy(dst, src, nbytes, kind, stream):
        _count("memcpy")
        ctypes.memmove(dst, src, nbytes)

    cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: 1, memcpy2DAsync=memcpy2d, memcpyAsync=memcpy,
                                         memcpyDeviceToDevice=3)
    cuda.memory = types.SimpleNamespace(OutOfMemoryError=MemoryError)
    cuda.MemoryPool = _Pool
    cuda.using_allocator = lambda alloc=None: contextlib.nullcontext()
    cp.cuda = cuda
    cupyx = types.ModuleType("cupyx")
    special = types.ModuleType("cupyx.scipy.special")
    import math

    special.erf = lambda x: _wrap(np.vectorize(math.erf, otypes=[np.float64])(np.asarray(x, np.float64)).astype(x.dtype))
    scipy = types.ModuleType("cupyx.scipy")
    scipy.special = special
    cupyx.scipy = scipy
    return cp, {"cupyx": cupyx, "cupyx.scipy": scipy, "cupyx.scipy.special": special}
