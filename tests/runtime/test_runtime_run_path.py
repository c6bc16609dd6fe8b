"""The eager run path of a compiled plan on the fake CuPy with captures that succeed
(``_fake_cupy.make(graphs=True)``), step graphs on as on a GPU: what each run does per step.

- a lowered step writing a graph output is bound once (output shapes, layouts, workspace) and
  replayed from its own graph keyed by its output's address, returning a new array every run;
- a replay key reads only the inputs that can move (feeds, pool tensors), never constants or arena views;
- an input converted every run (a feed into an NHWC lowering) no longer stops the replay;
- nothing on the run path synchronises or copies to the host.

A recorded graph is emulated faithfully: launching it runs the recorded launch on the recorded
arrays (same addresses; kept alive, so no other array can take them)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

import _fake_cupy
from _runtime_helpers import ort_run, random_feeds, rel_err

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def graphs_cuda(monkeypatch):
    cp, extra = _fake_cupy.make(graphs=True)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    for k, v in extra.items():
        monkeypatch.setitem(sys.modules, k, v)
    from graphopt.lowering import barrier
    from graphopt.runtime import backend, replay

    monkeypatch.setattr(backend, "_STREAMS", [])
    monkeypatch.setattr(backend, "_BLAS", {})
    monkeypatch.setattr(barrier, "_KERNEL", [])

    def record(self, arg, key):  # the graph: the recorded launch on the recorded arrays
        graph = SimpleNamespace(launch=lambda stream: (_fake_cupy._count("graph_launch"), self.run_step(arg)))
        self.graphs[key] = (graph, None)
        return graph

    monkeypatch.setattr(replay.StepReplay, "_record", record)
    yield cp
    _fake_cupy.make()  # later tests get the fake that cannot capture


def _computing_lowerings(monkeypatch, layouts=None, ordinary=lambda n: False):
    """Every custom op "builds" a lowering that computes its device fallback into the given outputs
    (NHWC in and out for CBR, as cuDNN's, or ``layouts[op]``; a barrier; capturable; a workspace);
    the ``n``-th built with ``ordinary(n)`` declares an ordinary launch (as an own kernel's) instead
    of a barrier."""
    from graphopt.lowering.contract import Lowering
    from graphopt.runtime import backend, ops_custom
    from graphopt.runtime.onnx_ops.registry import OpContext

    real_custom = backend.CudaBackend.custom_step
    built = []

    def custom_step(self, graph, node, in_arrays):
        ctx = OpContext(self.cupy, node, 0, {}, self.compute_dtype, self.matmul)
        attrs = ops_custom.op_attrs(node)
        impl = ops_custom.device_impl(node.op_type)

        def build(_self, op, key, sig):
            def launch(inputs, outputs, workspace):
                assert workspace is not None
                for out, y in zip(outputs, impl(ctx, inputs, attrs)):
                    out[...] = y

            lays = (layouts or {}).get(op, ("NHWC", "NHWC", "", "NHWC", "NHWC") if op == "CBR" else ())
            own = ordinary(len(built))
            built.append(op)
            return Lowering(launch=launch, workspace_bytes=256, barrier=not own, ordinary=own, capturable=True,
                            layouts=lays), None

        monkeypatch.setattr(backend.CudaBackend, "_build", build)
        return real_custom(self, graph, node, in_arrays)

    monkeypatch.setattr(backend.CudaBackend, "custom_step", custom_step)
    monkeypatch.setattr(ops_custom, "lowering_key", lambda node, dims: "fake")


def _session(path):
    from graphopt.runtime import Session

    sess = Session(path, device="cuda", cuda_graphs=False)
    sess.backend.step_graphs = True  # as on a real CuPy (the fake has no RawModule)
    return sess


def test_graph_output_steps_replay_and_every_run_returns_new_outputs(graphs_cuda, monkeypatch):
    import graphopt
    from graphopt.runtime import to_numpy
    from graphopt.runtime.replay import FreshStepReplay, StepReplay

    path = str(ROOT / "models" / "resnet_style.onnx")
    opt, _ = graphopt.optimize(path, gpu="none")
    _computing_lowerings(monkeypatch)
    sess = _session(opt)
    feeds = random_feeds(opt, np.random.default_rng(0))
    dev = {k: graphs_cuda.asarray(v) for k, v in feeds.items()}  # one feed buffer, refilled: a caller's loop
    kept = []
    for seed in range(5):
        new = random_feeds(opt, np.random.default_rng(seed))
        for k in dev:
            dev[k][...] = new[k]
        want = ort_run(path, new)
        got = sess.run(dev)
        for k, w in want.items():
            assert rel_err(to_numpy(got[k]), w) <= 1e-3, (k, seed)
            kept.append((got[k], to_numpy(got[k]).copy()))
    for arr, copy in kept:  # earlier results stay valid: every run wrote new output arrays
        np.testing.assert_array_equal(to_numpy(arr), copy)
    assert len({id(a) for a, _ in kept}) == len(kept)
    plan = sess.last_plan
    outs = {s for _, s in plan.outputs}
    to_out = [s for s in plan.steps if s.lowering == "fake" and set(s.outputs) & outs]
    assert to_out and all(isinstance(s.run, FreshStepReplay) for s in to_out)
    replays = [s.run for s in plan.steps if isinstance(s.run, StepReplay) and not isinstance(s.run, FreshStepReplay)]
    assert sum(r.replayed for r in replays) > 0  # the arena steps replay their graphs
    stable = [r for r in replays if r.moving == ()]
    assert stable  # steps reading only arena views and constants read no address at all


def test_a_fresh_output_graph_is_replayed_when_the_caller_drops_the_result(graphs_cuda, monkeypatch):
    """The pool hands a dropped output's block back: the output-keyed graph then replays (here: a
    fixed allocator returning the same buffer, as CuPy's pool does for a freed block, and the same
    input arrays)."""
    import graphopt
    from graphopt.runtime import to_numpy
    from graphopt.runtime.replay import FreshStepReplay

    path = str(ROOT / "models" / "resnet_style.onnx")
    opt, _ = graphopt.optimize(path, gpu="none")
    _computing_lowerings(monkeypatch)
    sess = _session(opt)
    feeds = random_feeds(opt, np.random.default_rng(3))
    want = ort_run(path, feeds)["logits"]
    sess.run(feeds)
    seen = {}

    def hook(step, ins):
        if isinstance(step.run, FreshStepReplay):
            seen[step.label] = (step.run, list(ins))
        return step.run(ins)

    with sess.backend.stream:
        sess.last_plan.execute(sess._convert_feeds(feeds), hook)
    assert seen
    for f, ins in seen.values():
        bufs = f.alloc()
        f.alloc = lambda bufs=bufs: list(bufs)  # the same block every run
        r0 = f.replayed
        for _ in range(4):
            (out,) = f(list(ins))
            assert out is bufs[0]
            assert rel_err(to_numpy(out), want) <= 1e-3
        assert f.replayed - r0 >= 2 and f.recorded == 1  # recorded once (its second sight), replayed after


def test_a_converted_feed_no_longer_stops_the_replay(graphs_cuda, monkeypatch):
    """The first CBR reads the caller's feed (converted to NHWC every run): the conversion is part of
    the step, so its replay (conversion and launch) is keyed by the feed's own address."""
    import graphopt
    from graphopt.runtime import to_numpy
    from graphopt.runtime.replay import StepReplay

    path = str(ROOT / "models" / "resnet_style.onnx")
    opt, _ = graphopt.optimize(path, gpu="none")
    _computing_lowerings(monkeypatch)
    sess = _session(opt)
    feeds = random_feeds(opt, np.random.default_rng(4))
    dev = {k: graphs_cuda.asarray(v) for k, v in feeds.items()}
    want = ort_run(path, feeds)
    for _ in range(3):
        got = sess.run(dev)
    for k, w in want.items():
        assert rel_err(to_numpy(got[k]), w) <= 1e-3
    plan = sess.last_plan
    feed_slots = {s for _, s in plan.inputs}
    first = next(s for s in plan.steps if s.lowering == "fake" and set(s.inputs) & feed_slots)
    rep = first.run
    assert isinstance(rep, StepReplay)  # the conversion inside the replayed step
    assert rep.moving and rep.launched >= 1 and rep.recorded + rep.replayed >= 1


def _nhwc_flatten_model():
    """Conv + Relu (a CBR with NHWC output) -> Flatten (a copy: NHWC is not C order) -> Gemm (GemmAct)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (4, 3, 3, 3)), ("b", (4,)), ("w2", (64, 5)), ("b2", (5,)))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("Gemm", ["f", "w2", "b2"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_reshape_that_copies_an_arena_view_is_a_moving_input(graphs_cuda, monkeypatch, tmp_path):
    """Flatten of an NHWC arena view copies into a new array every run: the GemmAct reading it keys
    its replay on that array's address (were it taken for a fixed buffer, a replay would read the
    first run's copy: stale outputs)."""
    import graphopt
    from graphopt.runtime import to_numpy

    src = _nhwc_flatten_model()
    path = tmp_path / "m.onnx"
    onnx.save(src, path)
    opt, _ = graphopt.optimize(src, gpu="none")
    _computing_lowerings(monkeypatch)
    sess = _session(opt)
    x = graphs_cuda.asarray(np.zeros((1, 3, 4, 4), np.float32))
    for seed in range(5):
        feed = random_feeds(src, np.random.default_rng(seed))
        x[...] = feed["x"]
        got = to_numpy(sess.run({"x": x})["y"])
        assert rel_err(got, ort_run(str(path), feed)["y"]) <= 1e-3, seed
    flat = next(s for s in sess.last_plan.steps if s.op == "Flatten")
    gemm = next(s for s in sess.last_plan.steps if s.op == "GemmAct")
    assert flat.outputs[0] in gemm.inputs and gemm.run.moving == (gemm.inputs.index(flat.outputs[0]),)


def test_a_compiled_eager_run_never_synchronises_or_reads_back(graphs_cuda, monkeypatch):
    """Whatever the batch, nothing on the run path waits for the device (the host time figure
    cannot contain device time): no stream / event / device synchronisation, no device-to-host copy."""
    import graphopt

    for name in ("resnet_style.onnx", "torch/gpt2_dynamo_op18.onnx"):
        opt, _ = graphopt.optimize(str(ROOT / "models" / name), gpu="none")
        sess = _session(opt)
        feeds = random_feeds(opt, np.random.default_rng(0))
        dev = {k: graphs_cuda.asarray(v) for k, v in feeds.items()}
        for _ in range(3):
            sess.run(dev)
        _fake_cupy.CALLS.clear()
        for _ in range(2):
            sess.run(dev)
        assert not {"synchronize", "to_host"} & set(_fake_cupy.CALLS), (name, _fake_cupy.CALLS)


def test_the_unoptimized_model_runs_the_same_on_the_replaying_path(graphs_cuda):
    path = ROOT / "models" / "resnet_style.onnx"
    sess = _session(path)
    feeds = random_feeds(onnx.load(path), np.random.default_rng(2))
    want = ort_run(str(path), feeds)
    from graphopt.runtime import to_numpy

    for _ in range(3):
        got = sess.run(feeds)
    for k, w in want.items():
        assert rel_err(to_numpy(got[k]), w) <= 1e-3


def _two_gemm_model(first: tuple[str, int], second: tuple[str, int]):
    """x (2, 5, 64) -> GemmAct -> ``first`` (a graph output, also read by Relu) -> GemmAct -> ``second``
    (a graph output); each given as (name, width)."""
    from onnx import TensorProto, helper, numpy_helper

    (n1, d1), (n2, d2) = first, second
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, d1)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(d1).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((d1, d2)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], [n1]),
             helper.make_node("Relu", [n1], ["r"]), helper.make_node("MatMul", ["r", "w2"], [n2])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 64])],
                          [helper.make_tensor_value_info(n1, TensorProto.FLOAT, [2, 5, d1]),
                           helper.make_tensor_value_info(n2, TensorProto.FLOAT, [2, 5, d2])], [w1, b1, w2])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _odd_gemm_model():
    """A GemmAct whose rows (33 fp32) are not 16-byte multiples, its output both a graph output and
    read by Relu and a second GemmAct."""
    return _two_gemm_model(("logits", 33), ("z", 16))


def test_a_row_padded_gemm_output_is_right_as_a_graph_output_and_as_an_input(graphs_cuda, monkeypatch):
    """cublaslt_rowpad declares Y ``rowpad`` (rows 16-byte aligned, a view of a padded buffer): the
    runtime allocates it so, hands it to the user as it is, and converts it for a consumer that reads
    C order; every run's results stay valid."""
    import graphopt
    from graphopt.lowering import layout
    from graphopt.runtime import to_numpy

    src = _odd_gemm_model()
    opt, _ = graphopt.optimize(src, gpu="none")
    assert sum(n.op_type == "GemmAct" for n in opt.graph.node) >= 1
    _computing_lowerings(monkeypatch, {"GemmAct": ("", "", "rowpad", "rowpad")})
    sess = _session(opt)
    kept = []
    for seed in range(4):
        x = np.random.default_rng(seed).standard_normal((2, 5, 64)).astype(np.float32)
        want = ort_run(src, {"x": x})
        got = sess.run({"x": x})
        for k, w in want.items():
            assert rel_err(to_numpy(got[k]), w) <= 1e-4, (k, seed)
            kept.append((got[k], w))
        assert layout.is_layout(got["logits"], "rowpad") and not got["logits"].flags.c_contiguous
    for arr, w in kept:
        assert rel_err(to_numpy(arr), w) <= 1e-4


def _final_gemm_model():
    """The last step writes only a graph output (GPT-2's LM head): h (16, read by Relu) -> logits (33)."""
    return _two_gemm_model(("h", 16), ("logits", 33))


@pytest.mark.parametrize("copy", [True, False])
def test_large_final_graph_outputs_are_written_by_an_uncaptured_tail_not_copied(graphs_cuda, monkeypatch, copy):
    """A plan whose last step is a lowered GEMM writing a graph output of at least TAIL_MIN_BYTES
    (GPT-2's logits) captures every step but that one; each replay launches it after the graph into
    new arrays: the values are right, it is never copied, and every run's result stays valid."""
    import graphopt
    from graphopt.runtime import Session, graphs, to_numpy

    src = _final_gemm_model()
    opt, _ = graphopt.optimize(src, gpu="none")
    assert sum(n.op_type == "GemmAct" for n in opt.graph.node) == 2
    _computing_lowerings(monkeypatch, {"GemmAct": ("", "", "rowpad", "rowpad")})
    monkeypatch.setattr(graphs, "TAIL_MIN_BYTES", 2 * 5 * 33 * 4)
    copied = []
    real_copy = graphs._copy_of
    monkeypatch.setattr(graphs, "_copy_of", lambda a, stream, convert: copied.append(a.shape) or real_copy(a, stream, convert))
    sess = Session(opt, device="cuda", copy_outputs=copy)
    x = np.random.default_rng(0).standard_normal((2, 5, 64)).astype(np.float32)
    want = ort_run(src, {"x": x})
    runs = [sess.run({"x": x}) for _ in range(4)]  # the fake's graph launches do nothing: same feeds
    assert sess.graph_status == "replaying a CUDA graph"
    cap = next(iter(sess._graphs.graphs.values()))
    assert len(cap.tail) == 1 and len(cap.plan.loop) > 1
    assert [sess.output_names[i] for i in cap.fresh] == ["logits"]
    assert set(copied) == ({(2, 5, 16)} if copy else set())  # h is the graph's: copied by default
    for got in runs:
        for k, w in want.items():
            assert rel_err(to_numpy(got[k]), w) <= 1e-4, k
        assert layout_of(got["logits"]) == "rowpad"
    assert len({id(r["logits"]) for r in runs}) == len(runs)


def test_a_tail_is_left_in_the_graph_below_the_size_bound(graphs_cuda, monkeypatch):
    import graphopt
    from graphopt.runtime import Session, graphs

    opt, _ = graphopt.optimize(_final_gemm_model(), gpu="none")
    _computing_lowerings(monkeypatch, {"GemmAct": ("", "", "rowpad", "rowpad")})
    monkeypatch.setattr(graphs, "TAIL_MIN_BYTES", 2 * 5 * 40 * 4 + 1)  # the padded logits span 2*5*36*4
    sess = Session(opt, device="cuda")
    for _ in range(3):
        sess.run({"x": np.ones((2, 5, 64), np.float32)})
    cap = next(iter(sess._graphs.graphs.values()))
    assert cap.tail == [] and cap.fresh == frozenset()


def layout_of(arr) -> str:
    from graphopt.lowering import layout

    return "rowpad" if layout.is_layout(arr, "rowpad") and not arr.flags.c_contiguous else "C"


def test_private_pool_bytes_counts_every_recorded_step_graph_and_captured_run(graphs_cuda, monkeypatch):
    """``Session.private_pool_bytes``: what the step graphs' and whole-run graphs' private pools hold
    (a peak-memory figure read from CuPy's default pool alone misses them: bench/e2e.py adds it)."""
    import graphopt
    from graphopt.runtime import replay
    from graphopt.runtime.graphs import GraphBook

    class Pool:
        def __init__(self, n):
            self.n = n

        def total_bytes(self):
            return self.n

    def record(self, arg, key):  # as the fixture's, with a pool holding 1000 bytes per recorded graph
        graph = SimpleNamespace(launch=lambda stream: self.run_step(arg))
        self.graphs[key] = (graph, Pool(1000))
        return graph

    monkeypatch.setattr(replay.StepReplay, "_record", record)
    opt, _ = graphopt.optimize(str(ROOT / "models" / "resnet_style.onnx"), gpu="none")
    _computing_lowerings(monkeypatch)
    sess = _session(opt)
    assert sess.private_pool_bytes() == 0
    feeds = {k: graphs_cuda.asarray(v) for k, v in random_feeds(opt, np.random.default_rng(0)).items()}
    for _ in range(3):
        sess.run(feeds)
    recorded = sum(len(s.run.graphs) for s in sess.last_plan.steps if isinstance(s.run, replay.StepReplay))
    assert recorded > 0 and sess.private_pool_bytes() == 1000 * recorded
    book = GraphBook(sess.graph)
    book.add(("a",), SimpleNamespace(pool=Pool(5)), {})
    book.add(("b",), False, {})  # a failed capture holds nothing
    book.add(("c",), SimpleNamespace(pool=None), {})
    assert book.pool_bytes() == 5


def test_private_pool_bytes_counts_the_captured_run_once(graphs_cuda, monkeypatch):
    """With CUDA graphs on, the whole-run graph's private pool is counted, once per captured shape."""
    import graphopt
    from graphopt.runtime import Session

    class Pool:
        def malloc(self, n):
            raise NotImplementedError

        def total_bytes(self):
            return 777

    monkeypatch.setattr(graphs_cuda.cuda, "MemoryPool", Pool)
    opt, _ = graphopt.optimize(str(ROOT / "models" / "resnet_style.onnx"), gpu="none")
    _computing_lowerings(monkeypatch)
    sess = Session(opt, device="cuda", cuda_graphs=True)
    feeds = {k: graphs_cuda.asarray(v) for k, v in random_feeds(opt, np.random.default_rng(0)).items()}
    for _ in range(4):
        sess.run(feeds)
    assert sess.plan_summary()["cuda_graphs"]["captured"] == 1, sess.graph_status
    assert sess.private_pool_bytes() == 777  # the fixture's step graphs keep no pool


@pytest.mark.parametrize("keep", [False, True])
def test_barriers_run_only_where_the_launch_before_is_not_ordinary(graphs_cuda, monkeypatch, keep):
    """``graphopt.runtime.ordering`` on a whole plan: every other custom op "builds" a barrier
    lowering (as cuDNN's), the others an ordinary one (as an own kernel's); the barrier lowerings
    right after an ordinary one run without it, the rest with it, and the outputs are unchanged.
    ``GRAPHOPT_KEEP_BARRIERS=1`` keeps them all. A run enqueues exactly the barriers the plan
    reports as kept."""
    import graphopt
    from graphopt.lowering import barrier
    from graphopt.runtime import ordering, to_numpy

    if keep:
        monkeypatch.setenv(ordering.KEEP_ENV, "1")
    calls = []
    monkeypatch.setattr(barrier, "barrier", lambda: calls.append(1))
    path = str(ROOT / "models" / "resnet_style.onnx")
    opt, _ = graphopt.optimize(path, gpu="none")
    _computing_lowerings(monkeypatch, ordinary=lambda n: n % 2 == 1)
    sess = _session(opt)
    feeds = random_feeds(opt, np.random.default_rng(5))
    want = ort_run(path, feeds)
    sess.run(feeds)  # the traced run (every barrier) and the plan
    plan = sess.last_plan
    kept, dropped = plan.barriers["kept"], plan.barriers["dropped"]
    assert plan.summary()["barriers"] == {"kept": kept, "dropped": dropped, "unneeded": 0}
    # resnet_style: CBR, MaxPool, seven CBRs, GlobalAveragePool, Flatten, GemmAct; built in that order,
    # the odd ones ordinary: the barriers of the 3rd, 5th and 7th CBR follow an ordinary one; the
    # first CBR's (the plan's start) and the GemmAct's (after the pool: not known here) stay
    assert [s.op for s in plan.steps if s.lowering == "fake"] == ["CBR"] * 8 + ["GemmAct"]
    assert (kept, dropped) == ((5, 0) if keep else (2, 3)) and plan.barriers["unneeded"] == 0
    calls.clear()
    got = sess.run(feeds)
    assert len(calls) == kept
    for k, w in want.items():
        assert rel_err(to_numpy(got[k]), w) <= 1e-3, k
