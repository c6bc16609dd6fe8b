"""A NumPy-backed stand-in for the parts of CuPy the runtime's CUDA backend touches, so the
device="cuda" control flow (stream ordering, feeds, DLPack, block accounting, capture fallbacks,
lowering fallbacks) runs on a CPU. Not a GPU model: kernels cannot build here (no NVRTC device), so
custom ops take their CuPy-fallback path; every "device" array is a NumPy array subclass."""

from __future__ import annotations

import contextlib
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
        return _Data(self)

    def get(self, stream=None):
        return np.array(self, copy=True).view(np.ndarray)


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


class _Stream:
    def __init__(self, non_blocking=False, null=False):
        self.ptr = 0 if null else next(_ptrs)
        self.capturing = False
        self.waits = 0

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
        pass

    def begin_capture(self):
        self.capturing = True

    def end_capture(self):  # as CUDA reports a capture that an illegal call invalidated
        self.capturing = False
        raise RuntimeError("cudaErrorStreamCaptureInvalidated: fake CuPy cannot capture")


class _Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.records = 0

    def record(self, stream=None):
        self.records += 1

    def synchronize(self):
        pass


_null = _Stream(null=True)
_current: list = [_null]


class _Device:
    def __init__(self, i=0):
        self.id = i
        self.compute_capability = "90"

    def synchronize(self):
        pass


class _Pool:
    def malloc(self, n):
        raise NotImplementedError

    def free_all_blocks(self):
        pass


def make():
    """A fresh fake ``cupy`` module, plus the ``cupyx`` pieces the ops use."""
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
    cp.asnumpy = lambda a, stream=None: np.array(a, copy=True).view(np.ndarray)
    cp.from_dlpack = lambda t: _wrap(np.from_dlpack(t))
    cp.get_default_memory_pool = lambda: _Pool()
    cuda = types.SimpleNamespace()
    cuda.Stream = _Stream
    cuda.Event = _Event
    cuda.Device = _Device
    cuda.get_current_stream = lambda: _current[-1]
    cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: 1)
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
