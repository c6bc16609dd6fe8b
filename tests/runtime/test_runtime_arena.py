"""Compiled plans: the arena (offsets by liveness, no two live buffers overlap, its size is the plan's
computed size), lowering steps rebound to arena outputs and workspaces, and the compiled loop giving
the same results as the trace, on models built in code and the models/ files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from _runtime_helpers import ort_run, random_feeds, rel_err
from graphopt.runtime.arena import ALIGN, Interval, aligned, assign, live_peak, overlapping_pairs

ROOT = Path(__file__).resolve().parents[2]
MODELS = ["resnet_style.onnx", "mobilenetv2_style.onnx", "transformer_block.onnx", "torch/gpt2_dynamo_op18.onnx",
          "torch/bert_torchscript_op14.onnx"]


# ---------------------------------------------------------------- offset assignment
def test_a_chain_needs_two_buffers_and_best_fit_reaches_the_lower_bound():
    ivs = [Interval(i, 1000, i, i + 1) for i in range(6)]
    offsets, total = assign(ivs)
    assert total == live_peak(ivs) == 2 * aligned(1000)
    assert overlapping_pairs(ivs, offsets) == []
    assert all(o % ALIGN == 0 for o in offsets.values())


def test_best_fit_reuses_the_tightest_gap():
    # a big buffer dies at step 1; a small one takes its place rather than growing the arena
    ivs = [Interval("big", 4096, 0, 1), Interval("keep", 1024, 0, 3), Interval("small", 1024, 2, 3)]
    offsets, total = assign(ivs)
    assert total == 4096 + 1024 and overlapping_pairs(ivs, offsets) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 20), st.integers(0, 6)), min_size=1, max_size=25))
def test_no_two_live_buffers_overlap_and_the_arena_covers_every_buffer(spec):
    ivs = [Interval(i, size, start, start + length) for i, (size, start, length) in enumerate(spec)]
    offsets, total = assign(ivs)
    assert overlapping_pairs(ivs, offsets) == []
    assert total >= live_peak(ivs)
    assert all(offsets[iv.key] + aligned(iv.size) <= total for iv in ivs)


# ---------------------------------------------------------------- plans on the numpy device
def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _check_arena(plan):
    assert overlapping_pairs(plan.arena_intervals, plan.arena_offsets) == []
    assert plan.arena_bytes >= plan.arena_live_bytes
    if plan.arena_bytes:
        assert int(plan.arena.nbytes) == plan.arena_bytes  # the one allocation is the computed size
        assert plan.summary()["arena_bytes"] == plan.arena_bytes


def test_an_elementwise_chain_runs_in_an_arena_of_two_buffers():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 1024])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Abs", ["b"], ["c"]), helper.make_node("Exp", ["c"], ["d"]),
             helper.make_node("Sqrt", ["d"], ["y"])]
    m = _model(nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 1024])])
    from graphopt.runtime import Session

    sess = Session(m, device="numpy")
    rng = np.random.default_rng(0)
    for _ in range(3):
        v = rng.standard_normal((256, 1024)).astype(np.float32)
        got = sess.run({"x": v})["y"]
        np.testing.assert_allclose(got, np.sqrt(np.exp(np.abs(-np.maximum(v, 0)))), rtol=1e-6)
    plan = sess.last_plan
    mib = 256 * 1024 * 4
    assert plan.arena_bytes == plan.arena_live_bytes == 2 * mib  # a..d in two buffers; y is the caller's
    _check_arena(plan)
    views = [plan.template[s] for step in plan.steps[:4] for s in step.outputs]
    assert all(v.base is plan.arena for v in views)
    assert not np.shares_memory(got, plan.arena)


def test_a_graph_output_and_the_buffer_it_views_stay_out_of_the_arena():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    shape = onnx.numpy_helper.from_array(np.array([6, 4], np.int64), "shape")
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "shape"], ["y"])]
    m = _model(nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4])], [shape])
    from graphopt.runtime import Session

    sess = Session(m, device="numpy")
    first = sess.run({"x": np.ones((4, 6), np.float32)})["y"]
    again = sess.run({"x": np.ones((4, 6), np.float32)})["y"]
    sess.run({"x": np.full((4, 6), 5, np.float32)})
    np.testing.assert_array_equal(again, 1)  # the next run did not overwrite what the caller holds
    assert sess.last_plan.arena_bytes == 0 and first.shape == (6, 4)  # Relu's buffer is the output's base


@pytest.mark.parametrize("name", MODELS)
def test_models_files_run_compiled_with_a_valid_arena(name):
    from graphopt.runtime import Session

    path = ROOT / "models" / name
    m = onnx.load(path)
    sess = Session(path, device="numpy")
    for seed in (0, 1):  # the first run traces, the second runs the compiled loop
        feeds = random_feeds(m, np.random.default_rng(seed))
        want = ort_run(str(path), feeds)
        got = sess.run(feeds)
        for k, w in want.items():
            assert rel_err(np.asarray(got[k]), w) <= 1e-4, (name, k)
    _check_arena(sess.last_plan)
    assert sess.last_plan.template is not None and len(sess.last_plan.loop) == len(sess.last_plan.steps)


# ---------------------------------------------------------------- lowering steps (fake CuPy)
def _scribbling_lowerings(monkeypatch, fake_cuda, built: list):
    """Every custom op "builds" a NumPy lowering (its device fallback) that declares a workspace and
    fills it with garbage on every launch, and NHWC outputs for CBR: an arena that overlapped a live
    buffer with a workspace, or lost a layout, would give wrong outputs."""
    from graphopt.lowering.contract import Lowering
    from graphopt.runtime import backend, ops_custom
    from graphopt.runtime.onnx_ops.registry import OpContext

    def fake_build(self, op, key, sig):
        impl = ops_custom.device_impl(op)
        ctx_holder = {}

        def launch(inputs, outputs, workspace):
            assert workspace is not None and workspace.nbytes == 4096
            workspace[...] = 0xA5
            ys = impl(ctx_holder["ctx"], inputs, ctx_holder["attrs"])
            for out, y in zip(outputs, ys):
                out[...] = y

        low = Lowering(launch=launch, workspace_bytes=4096,
                       layouts=(("", "", "", "", "NHWC") if op == "CBR" else ()))
        low._built = ctx_holder
        built.append((op, ctx_holder))
        return low, None

    real_custom = backend.CudaBackend.custom_step

    def custom_step(self, graph, node, in_arrays):
        n0 = len(built)
        res = real_custom(self, graph, node, in_arrays)
        if len(built) > n0:
            built[-1][1]["ctx"] = OpContext(self.cupy, node, 0, {}, self.compute_dtype, self.matmul)
            built[-1][1]["attrs"] = ops_custom.op_attrs(node)
        return res

    monkeypatch.setattr(backend.CudaBackend, "_build", fake_build)
    monkeypatch.setattr(backend.CudaBackend, "custom_step", custom_step)
    monkeypatch.setattr(ops_custom, "lowering_key", lambda node, dims: "fake")


@pytest.mark.parametrize("name", ["resnet_style.onnx", "transformer_block.onnx"])
def test_lowering_steps_write_arena_views_and_workspaces(fake_cuda, monkeypatch, name):
    import graphopt
    from graphopt.runtime import Session, to_numpy

    path = str(ROOT / "models" / name)
    opt, _ = graphopt.optimize(path, gpu="none")
    built: list = []
    _scribbling_lowerings(monkeypatch, fake_cuda, built)
    sess = Session(opt, device="cuda", cuda_graphs=False)
    for seed in (0, 1, 2):
        feeds = random_feeds(opt, np.random.default_rng(seed))
        want = ort_run(path, feeds)
        got = sess.run(feeds)
        for k, w in want.items():
            assert rel_err(to_numpy(got[k]), w) <= 1e-3, (name, k, seed)
    plan = sess.last_plan
    lowered = [s for s in plan.steps if s.lowering == "fake"]
    assert lowered and len(built) >= len(lowered)
    assert plan.workspace_bytes == 4096 * len(lowered)  # every workspace counted
    # in the arena, but for a lowered step writing a graph output (it keeps its own buffers)
    ws = [iv for iv in plan.arena_intervals if iv.key[0] == "ws"]
    to_outputs = [s for s in lowered if any(slot in {o for _, o in plan.outputs} for slot in s.outputs)]
    assert len(ws) == len(lowered) - len(to_outputs) and all(iv.start == iv.end for iv in ws)
    _check_arena(plan)
    assert plan.arena_bytes < sum(aligned(iv.size) for iv in plan.arena_intervals)  # buffers share bytes


def test_the_compiled_loop_feeds_the_profile_hook_every_step(fake_cuda):
    from graphopt.runtime import Session

    path = ROOT / "models" / "resnet_style.onnx"
    sess = Session(path, device="cuda", cuda_graphs=False)
    feeds = random_feeds(onnx.load(path), np.random.default_rng(0))
    prof = sess.profile(feeds, repeats=1)
    assert prof and sum(prof.values()) > 0



def test_matmul_and_gemm_steps_are_bound_once_and_write_into_the_arena():
    """MatMul, Gemm with transB / alpha / a bias, and a near miss each (beta != 1, a graph output)."""
    from onnx import numpy_helper

    from graphopt.runtime import Session

    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((24, 32)).astype(np.float32), "w2")
    b2 = numpy_helper.from_array(rng.standard_normal((24,)).astype(np.float32), "b2")
    w3 = numpy_helper.from_array(rng.standard_normal((24, 8)).astype(np.float32), "w3")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Gemm", ["h", "w2", "b2"], ["g"], transB=1, alpha=0.5),
             helper.make_node("Gemm", ["g", "w3", "b2s"], ["k"], beta=2.0),  # beta != 1: the generic path
             helper.make_node("Relu", ["k"], ["r"]),
             helper.make_node("MatMul", ["r", "w4"], ["y"])]  # a graph output: the generic path
    b2s = numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), "b2s")
    w4 = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w4")
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 16])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 4])], [w1, w2, b2, w3, b2s, w4])
    sess = Session(m, device="numpy")
    for seed in (0, 1, 2):
        x = np.random.default_rng(seed).standard_normal((5, 16)).astype(np.float32)
        assert rel_err(sess.run({"x": x})["y"], ort_run(m, {"x": x})["y"]) <= 1e-5
    plan = sess.last_plan
    placed = {key[1] for key in plan.arena_offsets}
    assert placed == {0, 1, 3}, placed  # MatMul, Gemm(transB, alpha, bias), Relu; not beta=2 nor the output
    _check_arena(plan)


def test_traced_runs_share_one_scratch_workspace(fake_cuda, monkeypatch):
    """Each lowering's first (traced) run gets the front of one scratch buffer, grown to the largest
    request, never a buffer per node: the compiled plan places workspaces in the arena, and per-node
    buffers kept the sum of all of them allocated for the session's life."""
    from graphopt.runtime.backend import CudaBackend

    b = CudaBackend.__new__(CudaBackend)
    b.cupy = fake_cuda
    small, big, again = b._trace_workspace(4096), b._trace_workspace(1 << 16), b._trace_workspace(100)
    assert b._trace_workspace(0) is None
    assert (small.nbytes, big.nbytes, again.nbytes) == (4096, 1 << 16, 100)
    assert b._scratch.nbytes == 1 << 16 and np.shares_memory(np.asarray(again), np.asarray(b._scratch))


def _first_run_peak(nodes, out_name: str, x: np.ndarray):
    """(session, output, the first run's peak of traced host memory) of a one-input float model
    built from ``nodes`` on the numpy device (tracemalloc sees NumPy's allocations)."""
    import tracemalloc

    from graphopt.runtime import Session

    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
               [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, list(x.shape))])
    sess = Session(m, device="numpy")
    tracemalloc.start()
    try:
        out = sess.run({"x": x})[out_name]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return sess, out, peak


def test_the_first_run_holds_only_live_activations_not_their_sum():
    """The trace (a session's first run) used to keep every activation until the plan was compiled,
    so the first run peaked near the sum of all activations (the likelier cause of e2e's pool far
    above the plan's peak, BERT bs32 on the H200: 1,144 MB against 36). A slot read for the last time
    keeps only its metadata: 16 chained 1 MB ops peak at a few MB, and the results are unchanged."""
    n, prev, nodes = 16, "x", []
    for i in range(n):
        nodes.append(helper.make_node("Neg" if i % 2 == 0 else "Relu", [prev], [f"t{i}"]))
        prev = f"t{i}"
    x = np.random.default_rng(0).random((512, 512), dtype=np.float32)
    sess, out, peak = _first_run_peak(nodes, prev, x)
    assert peak < 6 * x.nbytes, f"first run peaked at {peak / 2**20:.1f} MB for 1 MB activations"
    ref = x.copy()
    for i in range(n):
        ref = -ref if i % 2 == 0 else np.maximum(ref, 0)
    assert np.array_equal(out, ref) and np.array_equal(sess.run({"x": x})[prev], ref)  # traced and compiled runs
    assert sess.last_plan.peak_bytes <= 3 * x.nbytes


def test_an_unnamed_output_gets_arena_bytes_for_its_whole_extent():
    """An output allocated in its declared layout may be a strided view (``rowpad``: rows 16-byte
    aligned): its arena interval covers the view's extent, not just its ``nbytes``; a dense array's
    extent is its ``nbytes``."""
    from graphopt.lowering import layout
    from graphopt.runtime.compiled import _compact, _extent

    padded = layout.empty((4, 33), np.float16, "rowpad", np)
    assert _extent(padded) == (3 * 40 + 33) * 2 > padded.nbytes
    dense = np.zeros((4, 33), np.float16)
    assert _extent(dense) == dense.nbytes and _compact(dense, dense.nbytes) and not _compact(padded, 10**6)
    assert _extent(layout.empty((2, 3, 4, 5), np.float32, "NHWC", np)) == 2 * 3 * 4 * 5 * 4
    assert _extent(np.zeros((0, 3))) == 0


def test_outputs_nothing_reads_are_dropped_in_the_first_run_too():
    """A value no node reads (a dead branch, MaxPool's indices) keeps only its metadata right after
    its step: 12 dead 1 MB values beside a chain do not add up in the first run."""
    nodes, prev = [], "x"
    for i in range(12):
        nodes.append(helper.make_node("Neg", [prev], [f"dead{i}"]))  # read by nobody
        nodes.append(helper.make_node("Relu", [prev], [f"t{i}"]))
        prev = f"t{i}"
    x = np.random.default_rng(1).random((512, 512), dtype=np.float32) - 0.5
    _, out, peak = _first_run_peak(nodes, prev, x)
    assert peak < 6 * x.nbytes, f"first run peaked at {peak / 2**20:.1f} MB"
    assert np.array_equal(out, np.maximum(x, 0))
