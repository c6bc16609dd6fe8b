"""device="cuda" control flow on a CPU, through a NumPy-backed stand-in for CuPy (_fake_cupy.py):
feeds, stream ordering, plans, liveness, the capture fallback (the fake cannot capture), and custom
ops falling back when their lowering cannot build. The GPU itself is tested in tests/gpu."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from _runtime_helpers import ort_run, random_feeds, rel_err

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["resnet_style.onnx", "transformer_block.onnx", "subgraph_if.onnx",
                                  "torch/gpt2_dynamo_op18.onnx", "torch/bert_torchscript_op14.onnx"])
def test_cuda_backend_runs_models_eager_and_through_the_capture_fallback(fake_cuda, name):
    from graphopt.runtime import Session, to_numpy

    path = ROOT / "models" / name
    feeds = random_feeds(onnx.load(path), np.random.default_rng(0))
    want = ort_run(str(path), feeds)
    for graphs in (False, True):
        sess = Session(path, device="cuda", cuda_graphs=graphs)
        assert sess.backend.blas is None and sess.backend.blas_reason  # no cuBLAS here: cupy.matmul, reason kept
        for _ in range(3):
            got = sess.run(feeds)
            for k, w in want.items():
                assert isinstance(got[k], fake_cuda.ndarray)
                assert rel_err(to_numpy(got[k]), w) <= 1e-3, (name, graphs, k)
        if graphs:
            # GEMM steps through cupy.matmul cannot be captured: known before any capture is tried
            assert sess.graph_status.startswith("eager"), sess.graph_status
        assert sess.last_peak_bytes > 0


def test_optimized_custom_ops_fall_back_when_their_lowering_cannot_build(fake_cuda):
    import graphopt
    from graphopt.runtime import Session, to_numpy

    opt, _ = graphopt.optimize(str(ROOT / "models" / "resnet_style.onnx"), gpu="none")
    feeds = random_feeds(opt, np.random.default_rng(1))
    want = ort_run(str(ROOT / "models" / "resnet_style.onnx"), feeds)
    for dtype, tol in ((None, 1e-3), ("float16", 1e-2)):
        sess = Session(opt, device="cuda", dtype=dtype, cuda_graphs=False)
        got = sess.run(feeds)
        assert rel_err(to_numpy(got["logits"]), want["logits"]) <= tol
        notes = " ".join(sess.plan_summary()["notes"])
        assert "CBR" in notes or "fallback" in notes, notes


@pytest.mark.parametrize("name", ["transformer_block.onnx", "torch/gpt2_dynamo_op18.onnx"])
def test_optimized_transformer_ops_run_on_cuda(fake_cuda, name):
    """LayerNorm / Attention / GemmAct nodes after optimize: lowering or host reference, never a crash."""
    import graphopt
    from graphopt.runtime import Session, to_numpy

    path = str(ROOT / "models" / name)
    opt, _ = graphopt.optimize(path, gpu="none")
    ops = {n.op_type for n in opt.graph.node if n.domain == "graphopt"}
    assert ops & {"LayerNorm", "Attention"}, ops  # the test must exercise the transformer ops
    feeds = random_feeds(opt, np.random.default_rng(2))
    want = ort_run(path, feeds)
    sess = Session(opt, device="cuda", cuda_graphs=False)
    got = sess.run(feeds)
    for k, w in want.items():
        assert rel_err(to_numpy(got[k]), w) <= 1e-3, (name, k)


def test_a_failed_capture_moves_every_session_to_a_fresh_stream(fake_cuda, monkeypatch):
    from graphopt.runtime import Session, backend, to_numpy

    monkeypatch.setitem(backend._BLAS, 0, None)  # pretend cuBLAS works: the plan looks capturable
    monkeypatch.setattr(backend.CudaBackend, "_blas_matmul", lambda self, a, b: fake_cuda.matmul(a, b))
    m = onnx.load(ROOT / "models" / "transformer_block.onnx")
    feeds = random_feeds(m, np.random.default_rng(2))
    want = ort_run(m, feeds)
    other = Session(m, device="cuda")
    sess = Session(m, device="cuda")
    old = sess.backend.stream
    assert other.backend.stream is old
    for _ in range(3):
        got = sess.run(feeds)
    assert sess.graph_status.startswith("eager: capture failed"), sess.graph_status
    assert sess.backend.stream is not old and not old.capturing  # the capture was ended, the stream replaced
    for k, w in want.items():
        assert rel_err(to_numpy(got[k]), w) <= 1e-3
    got = other.run(feeds)  # made before the failure: follows the shared stream
    assert other.backend.stream is sess.backend.stream
    for k, w in want.items():
        assert rel_err(to_numpy(got[k]), w) <= 1e-3


def test_runs_are_ordered_with_the_callers_stream(fake_cuda):
    from graphopt.runtime import Session

    m = onnx.load(ROOT / "models" / "resnet_style.onnx")
    feeds = random_feeds(m, np.random.default_rng(3))
    sess = Session(m, device="cuda", cuda_graphs=False)
    user = fake_cuda.cuda.Stream(non_blocking=True)
    with user:
        sess.run(feeds)
    assert sess.backend.stream.waits == 1 and user.waits == 1  # ours waited for the caller, the caller for ours


def test_feed_checks_never_copy_a_device_array_to_the_host(fake_cuda):
    """CuPy arrays refuse ``np.asarray`` (an implicit device-to-host copy): the feed checks read the dtype
    and shape as attributes. A regression here broke every ``device="cuda"`` run on the GPU."""
    from graphopt.runtime import Session

    class DeviceOnly:
        def __init__(self, arr):
            self.dtype, self.shape = arr.dtype, arr.shape

        def __array__(self, *a, **k):
            raise TypeError("Implicit conversion to a NumPy array is not allowed")

    path = ROOT / "models" / "resnet_style.onnx"
    feeds = random_feeds(onnx.load(path), np.random.default_rng(0))
    sess = Session(path, device="cuda", cuda_graphs=False)
    sess._check_feeds({k: DeviceOnly(v) for k, v in feeds.items()})
