"""Shared checking logic for the GPU kernel tests."""

from __future__ import annotations

import numpy as np
import pytest

from graphopt.lowering.contract import Signature, as_lowering
from graphopt.kernels.source import device_arch, prebuild


def require_device() -> None:
    """Skip the calling test module when CuPy sees no CUDA device."""
    import cupy

    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, or a CPU-only machine
        pytest.skip(f"no CUDA device ({exc})", allow_module_level=True)
    if n < 1:
        pytest.skip("no CUDA device", allow_module_level=True)


# (normwise relative, max-abs relative to max|ref|) per numeric path.
TOL = {"float16": (1e-2, 2e-2), "tf32": (2e-3, 1e-2), "float32": (1e-5, 1e-4)}

ACTS = [
    {"activation": "none"}, {"activation": "Relu"}, {"activation": "Clip", "clip_min": -0.5, "clip_max": 0.7},
    {"activation": "Clip", "clip_max": 0.3}, {"activation": "LeakyRelu", "act_alpha": 0.1}, {"activation": "Sigmoid"},
    {"activation": "SiLU"}, {"activation": "HardSwish"}, {"activation": "HardSigmoidMul", "act_alpha": 0.25, "act_beta": 0.4},
    {"activation": "Gelu"}, {"activation": "GeluTanh"},
]


def tol_for(cand_name: str, dtype: str):
    if dtype == "float16":
        return TOL["float16"]
    if cand_name in ("implicit_gemm", "implicit_gemm_nhwc", "pointwise_gemm", "mma_gemm"):
        return TOL["tf32"]
    return TOL["float32"]


def run_and_check(cand, op: str, shapes, dtype: str, attrs: dict, inputs_np, ref: np.ndarray):
    """Build ``cand``, run it on poisoned outputs, compare with ``ref``; returns (norm_err, max_err)."""
    import cupy

    sig = Signature.make(op, shapes, [dtype] * len(shapes), attrs)
    reason = cand.applies(sig, (9, 0))
    assert reason is None, reason
    prebuild(cand.kernels(sig))
    launch = as_lowering(cand.build(sig, device_arch()))
    # inputs and outputs in the layouts the lowering declares (NHWC, rowpad), as the runtime and the checker hand them
    ins = launch.conform([None if a is None else cupy.asarray(a) for a in inputs_np], cupy)
    out = launch.empty_outputs(len(ins), [ref.shape], dtype, cupy)[0]  # in the layout it declares (rowpad, NHWC)
    out[...] = cupy.nan
    launch(ins, [out])
    cupy.cuda.get_current_stream().synchronize()
    y = cupy.asnumpy(out).astype(np.float64)
    assert np.isfinite(y).all(), f"{cand.key()}: {np.count_nonzero(~np.isfinite(y))} of {y.size} outputs unwritten or non-finite"
    # A second launch on fresh poison must give the same answer (split-K counters reset, no races).
    out.fill(cupy.nan)
    launch(ins, [out])
    y2 = cupy.asnumpy(out).astype(np.float64)
    assert np.array_equal(y, y2), f"{cand.key()}: second launch differs (max {np.nanmax(np.abs(y - y2))})"
    norm = np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30)
    mx = np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30)
    tn, tm = tol_for(cand.name, dtype)
    assert norm <= tn and mx <= tm, f"{cand.key()} {dtype}: normwise {norm:.2e} (tol {tn}), max {mx:.2e} (tol {tm})"
    return norm, mx


def every_node_on(model, op: str, key: str):
    """A copy of ``model`` whose every graphopt ``op`` node runs lowering ``key`` (its other lowering
    records dropped): a whole model on one provider's lowering."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        if node.domain == "graphopt" and node.op_type == op:
            keep = [a for a in node.attribute if not a.name.startswith("lowering")]
            del node.attribute[:]
            node.attribute.extend(keep + [onnx.helper.make_attribute("lowering", key)])
    return out
