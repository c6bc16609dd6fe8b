"""Resize on the GPU (marker ``gpu``; skipped without a CUDA device): the CuPy path gives the NumPy
path's outputs (which tests/runtime/test_runtime_resize.py holds to onnxruntime and ONNX's
reference) for every mode, odd sizes, fp32 and fp16, with CUDA graphs on and off; outputs poisoned
first by running a different input through the same session.

Run on the device:  python3 -m pytest -q -m gpu tests/gpu/test_resize_gpu.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.runtime.test_runtime_resize import _model  # noqa: E402

from graphopt.runtime import Session, to_numpy  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = [
    dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    dict(mode="nearest", coordinate_transformation_mode="half_pixel"),
    dict(mode="linear", coordinate_transformation_mode="half_pixel"),
    dict(mode="linear", coordinate_transformation_mode="align_corners"),
    dict(mode="cubic", coordinate_transformation_mode="pytorch_half_pixel", exclude_outside=1),
    dict(mode="linear", antialias=1),
]


@pytest.mark.parametrize("attrs", CASES, ids=lambda a: "-".join(str(v) for v in a.values()))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("graphs", [True, False])
def test_cuda_resize_equals_the_numpy_path(attrs, dtype, graphs):
    from onnx import TensorProto

    rng = np.random.default_rng(7)
    shape = (3, 5, 13, 17)
    model = _model(shape, 19, attrs, scales=[1, 1, 2.3, 0.55], dtype=TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16)
    x = rng.standard_normal(shape).astype(dtype)
    want = Session(model, device="numpy").run({"x": x})["y"]
    sess = Session(model, device="cuda", cuda_graphs=graphs)
    for _ in range(2):  # poison: another input first, then the checked one (a replay on the second)
        sess.run({"x": rng.standard_normal(shape).astype(dtype)})
        got = to_numpy(sess.run({"x": x})["y"])
    if graphs:  # the taps were uploaded when the step was planned: nothing in the run stops a capture
        assert sess.graph_status == "replaying a CUDA graph", sess.graph_status
    tol = 1e-5 if dtype == "float32" else 2e-3
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
