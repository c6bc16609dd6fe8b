"""Helpers for the runtime tests: random feeds, onnxruntime references, error measures."""

from __future__ import annotations

import numpy as np
import onnx


def concrete_dim(dim) -> int:
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return dim.dim_value
    name = dim.dim_param.lower()
    return 16 if ("seq" in name or "len" in name) else (2 if name else 1)


def random_feeds(model: onnx.ModelProto, rng: np.random.Generator, overrides: dict | None = None) -> dict:
    """Fresh random inputs per graph input dtype; integer inputs are valid ids, *mask* inputs ones."""
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = list((overrides or {}).get(vi.name) or [concrete_dim(d) for d in tt.shape.dim])
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dtype == np.bool_:
            feeds[vi.name] = np.asarray(rng.random(shape) < 0.5)
        elif np.issubdtype(dtype, np.integer):
            feeds[vi.name] = (np.ones(shape, dtype=dtype) if "mask" in vi.name.lower()
                              else rng.integers(0, 2, size=shape).astype(dtype))
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def ort_run(model, feeds: dict) -> dict:
    import onnxruntime as ort

    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else open(model, "rb").read()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def rel_err(got, want) -> float:
    """max |got - want| / max |want| in float64 (0 for empty tensors); inf on a shape mismatch."""
    got = np.asarray(got).astype(np.float64)
    want = np.asarray(want).astype(np.float64)
    if got.shape != want.shape:
        return float("inf")
    if want.size == 0:
        return 0.0
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return float("inf")
    fin = np.isfinite(want)
    return float(np.max(np.abs(got[fin] - want[fin]), initial=0.0) / (np.max(np.abs(want[fin]), initial=0.0) + 1e-12))
