"""One answer to "is this a host value?" for the ops that keep shape arithmetic on the host (Gather,
Concat) and for the elementwise layout order: NumPy arrays are host values unless they are the
device backend's own array type (the CPU tests' fake CuPy's arrays are a NumPy subclass)."""

from __future__ import annotations

import types

import numpy as np

from _fake_cupy import make
from graphopt.runtime.onnx_ops.registry import on_host


def test_host_values_on_each_backend():
    a = np.arange(3)
    assert on_host(np, a) and not on_host(np, 3) and not on_host(np, None)
    cp, _ = make()
    dev = cp.asarray(a)
    assert on_host(cp, a) and not on_host(cp, dev)  # the fake's device array is a NumPy subclass

    class DeviceArray:  # CuPy's arrays are no NumPy arrays at all
        pass

    cupy_like = types.SimpleNamespace(ndarray=DeviceArray)
    assert on_host(cupy_like, a) and not on_host(cupy_like, DeviceArray())
    assert on_host(object(), a)  # a backend module without an array type: every NumPy array is the host's


def test_gather_on_fake_device_arrays_stays_on_the_device():
    """The embedding Gather of a BERT export: device weights and device indices give a device array
    (before on_host, the fake's arrays were taken for host values and a plain NumPy array came out)."""
    cp, _ = make()
    from graphopt.runtime.onnx_ops.indexing import _gather

    ctx = types.SimpleNamespace(xp=cp, attr=lambda name, default=None: default)
    out = _gather(ctx, [cp.asarray(np.ones((5, 2), np.float16)), cp.asarray(np.array([0, 4, -1]))])[0]
    assert isinstance(out, cp.ndarray) and out.shape == (3, 2)
    host = _gather(ctx, [np.arange(4), np.array([1, -1])])[0]
    assert type(host) is np.ndarray and host.tolist() == [1, 3]
