"""Compiled plans on the GPU (marker ``gpu``; skipped without a CUDA device): the arena is one CuPy
allocation whose views sit at their assigned offsets, no two live buffers overlap, the compiled runs
give the traced run's outputs (original and optimized models, fp32 and fp16, graphs on and off), and
the bound cuBLAS GEMM matches cupy.matmul. Host time per node is printed.

Run on the device:  python3 -m pytest -q -s -m gpu tests/gpu/test_runtime_compiled_gpu.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

cupy = pytest.importorskip("cupy")

from _harness import every_node_on, require_device  # noqa: E402

require_device()

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
from _runtime_helpers import random_feeds, rel_err  # noqa: E402

from graphopt.runtime import Session, to_numpy  # noqa: E402
from graphopt.runtime.arena import overlapping_pairs  # noqa: E402

MODELS = ["resnet_style.onnx", "mobilenetv2_style.onnx", "transformer_block.onnx", "torch/gpt2_dynamo_op18.onnx"]


@pytest.fixture(scope="module")
def optimized():
    import graphopt

    return {n: graphopt.optimize(str(ROOT / "models" / n), gpu="none")[0] for n in MODELS}


def _two_feeds_and_plain_outputs(model):
    """Two random feed sets and, for each, the outputs of plain launches (no CUDA graph of any kind)."""
    feeds = [random_feeds(model, np.random.default_rng(seed)) for seed in (1, 2)]
    plain = Session(model, device="cuda", dtype="float16", cuda_graphs=False, step_graphs=False)
    return feeds, [[to_numpy(o) for o in plain.run(f).values()] for f in feeds]


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("sa, sb, ta, tb, alpha", [((5, 7), (7, 3), 0, 0, 1.0), ((7, 5), (3, 7), 1, 1, 0.5),
                                                   ((64, 96), (128, 96), 0, 1, 1.0)])
def test_bound_gemm_matches_cupy(dt, sa, sb, ta, tb, alpha):
    from graphopt.kernels import blas

    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.standard_normal(sa).astype(dt))
    b = cupy.asarray(rng.standard_normal(sb).astype(dt))
    aa, bb = (a.T if ta else a), (b.T if tb else b)
    M, K = aa.shape
    N = bb.shape[1]
    c = cupy.empty((M, N), dtype=dt)
    run = blas.bound_gemm(dt, M, N, K, trans_a=bool(ta), trans_b=bool(tb), alpha=alpha)
    for _ in range(2):
        run(a, b, c)
    want = alpha * cupy.matmul(aa.astype(np.float32), bb.astype(np.float32))
    err = float(cupy.abs(c.astype(np.float32) - want).max()) / (1 + float(cupy.abs(want).max()))
    assert err <= (1e-2 if dt == "float16" else 1e-5)


@pytest.mark.parametrize("dtype", [None, "float16"])
@pytest.mark.parametrize("variant", ["original", "optimized"])
@pytest.mark.parametrize("name", MODELS)
def test_compiled_runs_equal_the_traced_run(name, variant, dtype, optimized):
    model = optimized[name] if variant == "optimized" else str(ROOT / "models" / name)
    m = optimized[name] if variant == "optimized" else onnx.load(ROOT / "models" / name)
    feeds = random_feeds(m, np.random.default_rng(5))
    tol = 1e-5 if dtype is None else 1e-3
    for graphs in (False, True):
        sess = Session(model, device="cuda", dtype=dtype, cuda_graphs=graphs)
        traced = {k: to_numpy(v) for k, v in sess.run(feeds).items()}
        for _ in range(3):
            got = sess.run(feeds)
            for k, w in traced.items():
                assert rel_err(to_numpy(got[k]), w) <= tol, (name, variant, dtype, graphs, k)
        plan = sess.last_plan
        assert overlapping_pairs(plan.arena_intervals, plan.arena_offsets) == []
        if plan.arena_bytes:
            assert plan.arena.nbytes == plan.arena_bytes
            base = plan.arena.data.ptr
            for k, step in enumerate(plan.steps):
                for j, s in enumerate(step.outputs):
                    key = ("out", k, j)
                    if key in plan.arena_offsets and s is not None:
                        assert plan.template[s].data.ptr == base + plan.arena_offsets[key]
        print(f"\n{name} {variant} {dtype or 'float32'} graphs={graphs}: arena {plan.arena_bytes / 2**20:.2f} MiB "
              f"(live bound {plan.arena_live_bytes / 2**20:.2f}), workspaces {plan.workspace_bytes}; {sess.graph_status}")


@pytest.mark.parametrize("name", MODELS)
def test_host_us_per_node_is_printed(name, optimized):
    from graphopt.runtime.bench import host_overhead_us

    feeds = random_feeds(optimized[name], np.random.default_rng(6))
    sess = Session(optimized[name], device="cuda", dtype="float16", cuda_graphs=False)
    us, steps = host_overhead_us(sess, feeds, repeats=30)
    print(f"\n{name} optimized fp16: host {us:.1f} us per node over {steps} steps (eager, compiled)")
    assert us > 0


@pytest.mark.parametrize("name", MODELS)
def test_step_graphs_replay_the_same_outputs(optimized, name):
    """Eager runs (no whole-run graph) replay each compiled step's own CUDA graph from the second run
    on (graphopt.runtime.replay): the outputs equal the plain launches' run after run, and steps were
    in fact replayed."""
    from graphopt.runtime.replay import StepReplay

    model = optimized[name]
    feeds = random_feeds(model, np.random.default_rng(1))
    plain = Session(model, device="cuda", dtype="float16", cuda_graphs=False, step_graphs=False)
    want = [to_numpy(o) for o in plain.run(feeds).values()]
    sess = Session(model, device="cuda", dtype="float16", cuda_graphs=False)
    for _ in range(4):
        got = [to_numpy(o) for o in sess.run(feeds).values()]
        for g, w in zip(got, want):
            assert rel_err(g, w) <= 1e-3, (name, rel_err(g, w))
    replays = [s.run for s in sess.last_plan.steps if isinstance(s.run, StepReplay)]
    assert replays and sum(r.stats["replayed"] for r in replays) > 0


@pytest.mark.parametrize("name", MODELS)
def test_graph_output_lowerings_replay_and_earlier_outputs_stay_valid(optimized, name):
    """A lowered step writing a graph output replays a graph keyed by its new output's address
    (graphopt.runtime.replay.FreshStepReplay): a caller that drops each result meets the recorded
    graph; a caller that keeps every result gets new arrays, never overwritten by a later run."""
    from graphopt.runtime.replay import FreshStepReplay

    model = optimized[name]
    feeds, want = _two_feeds_and_plain_outputs(model)
    sess = Session(model, device="cuda", dtype="float16", cuda_graphs=False)
    dev = [{k: cupy.asarray(v) for k, v in f.items()} for f in feeds]
    for i in range(6):  # results dropped: the pool hands the output block back
        got = [to_numpy(o) for o in sess.run(dev[i % 2]).values()]
        for g, w in zip(got, want[i % 2]):
            assert rel_err(g, w) <= 1e-3, (name, i, rel_err(g, w))
    fresh = [s.run for s in sess.last_plan.steps if isinstance(s.run, FreshStepReplay)]
    if not fresh:
        pytest.skip(f"{name}: no lowered step writes a graph output")
    assert sum(f.replayed for f in fresh) > 0, [f.stats for f in fresh]
    kept = [(i % 2, list(sess.run(dev[i % 2]).values())) for i in range(4)]  # results kept
    sess.synchronize()
    for j, outs in kept:
        for o, w in zip(outs, want[j]):
            assert rel_err(to_numpy(o), w) <= 1e-3, (name, j)


def test_host_time_holds_the_gpu_for_every_timed_run(optimized):
    """graphopt.runtime.host_time: the hold kernel outlasts every timed run (gpu_held), at bs 1."""
    from graphopt.runtime import host_time

    model = optimized["resnet_style.onnx"]
    sess = Session(model, device="cuda", dtype="float16", cuda_graphs=False)
    h = host_time.measure(sess, random_feeds(model, np.random.default_rng(0)), repeats=10)
    d = h.to_dict()
    print(f"\nresnet_style host time: {d}")
    assert h.held and d["host_us_per_node"] > 0 and d["host_cpu_us_per_node"] > 0


def test_a_whole_graph_of_cudnn_lowerings_replays_the_eager_outputs():
    """Every CBR of the ResNet-50 export on cuDNN's fused graph, bs32 fp16: the whole-plan CUDA graph
    gives the eager run's outputs on every replay. Without the stream barrier before each vendor
    lowering (graphopt.lowering.barrier) a tuned ResNet-50 on the H200 differed from its eager run by
    up to 0.43 (max relative), differently on each replay."""
    import graphopt
    from graphopt.providers import cudnn

    if cudnn.unavailable():
        pytest.skip(f"cuDNN frontend: {cudnn.unavailable()}")
    model, _ = graphopt.optimize(str(ROOT / "models" / "torch" / "resnet50_torchscript_op17.onnx"), gpu="none",
                                 shapes={"x": [32, 3, 64, 64]})
    model = every_node_on(model, "CBR", "cudnn")
    feeds = {"x": np.random.default_rng(3).standard_normal((32, 3, 64, 64)).astype(np.float32)}
    eager = Session(model, device="cuda", dtype="float16", cuda_graphs=False, step_graphs=False)
    want = to_numpy(next(iter(eager.run(feeds).values())))
    sess = Session(model, device="cuda", dtype="float16")
    got = [to_numpy(next(iter(sess.run(feeds).values()))) for _ in range(5)]
    assert sess.graph_status == "replaying a CUDA graph"
    for g in got:
        assert rel_err(g, want) <= 1e-3, [rel_err(x, want) for x in got]


@pytest.mark.parametrize("name", MODELS)
def test_an_uncaptured_tail_gives_the_eager_outputs_and_new_arrays_every_replay(optimized, name, monkeypatch):
    """With every size let through (TAIL_MIN_BYTES = 1), a plan whose last steps write only graph
    outputs leaves them out of the whole-plan CUDA graph and launches them after each replay
    (graphopt.runtime.graphs.fresh_tail): two alternating feeds give the eager outputs, kept results
    stay valid, the tail's outputs are new arrays."""
    from graphopt.runtime import graphs

    monkeypatch.setattr(graphs, "TAIL_MIN_BYTES", 1)
    model = optimized[name]
    feeds, want = _two_feeds_and_plain_outputs(model)
    sess = Session(model, device="cuda", dtype="float16")
    kept = [(i % 2, list(sess.run(feeds[i % 2]).values())) for i in range(6)]
    assert sess.graph_status == "replaying a CUDA graph"
    caps = [c for c in sess._graphs.graphs.values() if c]
    if not any(c.tail for c in caps):
        pytest.skip(f"{name}: the last step does not write only graph outputs")
    sess.synchronize()
    for j, outs in kept:
        for o, w in zip(outs, want[j]):
            assert rel_err(to_numpy(o), w) <= 1e-3, (name, j)
    fresh = next(c for c in caps if c.tail).fresh
    for i in fresh:
        assert len({kept[r][1][i].data.ptr for r in range(2, 6)}) == 4  # kept results: 4 distinct arrays


@pytest.mark.parametrize("name", ["torch/gpt2_dynamo_op18.onnx"])
def test_an_uncaptured_tail_with_static_outputs_and_dropped_results(optimized, name, monkeypatch):
    """``copy_outputs=False`` and a caller that drops each result: the tail's own step graph records and
    replays after the whole graph (the pool hands its output block back), alternating feeds stay right."""
    from graphopt.runtime import graphs
    from graphopt.runtime.replay import FreshStepReplay

    monkeypatch.setattr(graphs, "TAIL_MIN_BYTES", 1)
    model = optimized[name]
    feeds, want = _two_feeds_and_plain_outputs(model)
    sess = Session(model, device="cuda", dtype="float16", copy_outputs=False)
    dev = [{k: cupy.asarray(v) for k, v in f.items()} for f in feeds]
    for i in range(8):
        got = [to_numpy(o) for o in sess.run(dev[i % 2]).values()]
        for g, w in zip(got, want[i % 2]):
            assert rel_err(g, w) <= 1e-3, (name, i, rel_err(g, w))
    cap = next(c for c in sess._graphs.graphs.values() if c)
    if not cap.tail:
        pytest.skip(f"{name}: the last step does not write only graph outputs")
    fresh = [s for s, _, _, _ in cap.tail if isinstance(s.run, FreshStepReplay)]
    assert fresh and sum(s.run.replayed for s in fresh) > 0, [s.run.stats for s in fresh]


def test_barriers_dropped_after_ordinary_launches_keep_every_replay_exact():
    """GPT-2 (the 2-layer export, bs4, 128 tokens, fp16) with every GemmAct on cuDNN's matmul graph: its barriers after
    an own kernel (the LayerNorms, the attention output's transpose) are dropped
    (``graphopt.runtime.ordering``), the one after another cuDNN GemmAct kept; the whole-plan CUDA
    graph gives the eager run's outputs on every replay, and the same with every barrier kept."""
    import contextlib

    import graphopt
    from graphopt.providers import cudnn
    from graphopt.runtime import ordering

    if cudnn.unavailable():
        pytest.skip(f"cuDNN frontend: {cudnn.unavailable()}")
    path = ROOT / "models" / "torch" / "gpt2_torchscript_op17.onnx"
    model, _ = graphopt.optimize(str(path), gpu="none", shapes={"input_ids": [4, 128], "attention_mask": [4, 128]})
    model = every_node_on(model, "GemmAct", "cudnn")
    feeds = random_feeds(model, np.random.default_rng(5))
    eager = Session(model, device="cuda", dtype="float16", cuda_graphs=False, step_graphs=False)
    want = {k: to_numpy(v) for k, v in eager.run(feeds).items()}
    for keep in (False, True):
        with ordering.all_barriers_kept() if keep else contextlib.nullcontext():
            sess = Session(model, device="cuda", dtype="float16")
            got = [{k: to_numpy(v) for k, v in sess.run(feeds).items()} for _ in range(5)]
        barriers = sess.last_plan.barriers
        print(f"\nkeep={keep}: barriers {barriers}, {sess.graph_status}")
        assert sess.graph_status == "replaying a CUDA graph"
        # the export has 2 layers: per layer 3 GemmActs after an own kernel, 1 after a GemmAct; the head
        assert (barriers["dropped"] == 0) if keep else (barriers["dropped"] >= 3 and barriers["kept"] >= 1)
        for g in got:
            for k, w in want.items():
                assert rel_err(g[k], w) <= 1e-3, (keep, k, rel_err(g[k], w))
