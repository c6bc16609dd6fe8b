"""Shared test helpers: small graph builders and an onnxruntime runner."""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # running from a source checkout without `pip install -e`
    sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True, scope="session")
def _private_tuning_cache(tmp_path_factory):
    """Tests never read or write the user's real tuning cache (subprocesses inherit this too)."""
    if "GRAPHOPT_CACHE_DIR" not in os.environ:
        os.environ["GRAPHOPT_CACHE_DIR"] = str(tmp_path_factory.mktemp("tuning-cache"))
    yield


@pytest.fixture(autouse=True)
def barrier_calls(request, monkeypatch):
    """Outside GPU tests the stream barrier that vendor lowerings enqueue before each launch
    (``graphopt.lowering.barrier``) is recorded, not launched: CPU tests drive those lowerings with
    fake libraries and no CUDA device. The list counts the calls."""
    calls: list = []
    if "gpu" not in request.keywords:
        from graphopt.lowering import barrier

        monkeypatch.setattr(barrier, "barrier", lambda: calls.append(1))
    return calls


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly on a machine without CuPy or without a CUDA device."""
    try:
        import cupy  # noqa: F401

        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_graphopt(*args, cwd=None, env=None):
    """Run the real command line in a subprocess, as a user would (source checkout on the path)."""
    import subprocess

    e = dict(os.environ)
    e.pop("GRAPHOPT_DEBUG", None)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "graphopt.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=e, timeout=300
    )


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.fixture
def rng(request):
    # A fresh seed per test, derived from its name and a run salt, so inputs differ between tests and
    # between runs (set GRAPHOPT_TEST_SEED to reproduce a failure).
    salt = int(os.environ.get("GRAPHOPT_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
    seed = (zlib.crc32(request.node.nodeid.encode()) ^ salt) % 2**32
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)
