"""``graphopt.ir.ahead.InferAhead``: the input's shape inference in a forked child gives exactly the
``value_info`` the in-process inference gives; every way the child cannot be used (no fork, another
model, a dead child, a failed inference, an answer not collected) ends in the in-process route or a
reaped child, never a different answer. ``load_model`` hands the header check to the child and meets
the same errors, in the same order, by either route."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphopt.ir.ahead as ahead_mod
from graphopt.errors import InvalidModel, UnsupportedModel
from graphopt.ir import load_model
from graphopt.ir.ahead import NOT_RUN, InferAhead, can_fork, worth_forking
from graphopt.ir.shapes import infer

pytestmark = pytest.mark.skipif(not can_fork(), reason="InferAhead forks only on Linux without other threads")


def _model() -> onnx.ModelProto:
    """Shape -> Gather -> Reshape: data propagation makes the reshaped tensor's shape static."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Reshape", ["r", "s"], ["y"]),
        helper.make_node("MatMul", ["y", "w"], ["z"]),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.ones((4, 5), np.float32), "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _expected(model: onnx.ModelProto) -> list[bytes]:
    return [vi.SerializeToString() for vi in infer(model).graph.value_info]


def test_child_answer_is_in_process_value_info():
    model = _model()
    with InferAhead() as ahead:
        ahead.start(model)
        assert ahead._pid is not None  # a child runs
        got = ahead.result(model)
    assert isinstance(got, onnx.GraphProto)
    assert [vi.SerializeToString() for vi in got.value_info] == _expected(model)
    assert len(got.value_info) == 3 and not got.node and not got.initializer  # value_info only


def test_inferred_graph_without_a_child_infers_in_process():
    model = _model()
    got = InferAhead().inferred_graph(model)
    assert [vi.SerializeToString() for vi in got.value_info] == _expected(model)


def test_answer_for_another_model_is_not_used(monkeypatch):
    model, other = _model(), _model()
    with InferAhead() as ahead:
        ahead.start(model)
        assert ahead.result(other) is NOT_RUN  # near-miss: an equal model, not the one forked on
        assert ahead._pid is None  # reaped all the same
    calls = []
    real = ahead_mod.infer
    monkeypatch.setattr(ahead_mod, "infer", lambda m: calls.append(m) or real(m))
    with InferAhead() as ahead:
        ahead.start(model)
        got = ahead.inferred_graph(other)
    assert calls[-1] is other  # inferred here, in-process
    assert [vi.SerializeToString() for vi in got.value_info] == _expected(other)


def test_no_fork_with_other_threads(monkeypatch):
    monkeypatch.setattr(ahead_mod.threading, "active_count", lambda: 2)
    assert not can_fork()
    with InferAhead() as ahead:
        ahead.start(_model())
        assert ahead._pid is None
        assert ahead.result(_model()) is NOT_RUN


def test_no_fork_off_linux(monkeypatch):
    monkeypatch.setattr(ahead_mod.sys, "platform", "darwin")
    assert not can_fork()


def test_failed_inference_answers_none(monkeypatch):
    monkeypatch.setattr(ahead_mod, "infer", lambda m: m)  # infer's failure: it hands its input back
    model = _model()
    with InferAhead() as ahead:
        ahead.start(model)
        assert ahead.result(model) is None
    with InferAhead() as ahead:
        ahead.start(model)
        assert ahead.inferred_graph(model) is None


def _in_child_only(monkeypatch, child, parent_answer=None):
    """Make ``ahead``'s ``infer`` run ``child()`` first when called in a forked child; in this process
    it answers ``parent_answer(m)`` (default: the real inference)."""
    parent, real = os.getpid(), ahead_mod.infer

    def infer(m):
        if os.getpid() != parent:
            child()
        return (parent_answer or real)(m)

    monkeypatch.setattr(ahead_mod, "infer", infer)


def test_dead_child_falls_back_to_in_process(monkeypatch):
    _in_child_only(monkeypatch, lambda: os._exit(3))
    model = _model()
    with InferAhead() as ahead:
        ahead.start(model)
        assert ahead.result(model) is NOT_RUN
    with InferAhead() as ahead:
        ahead.start(model)
        got = ahead.inferred_graph(model)
    assert [vi.SerializeToString() for vi in got.value_info] == _expected(model)


def test_uncollected_child_is_killed_and_reaped(monkeypatch):
    _in_child_only(monkeypatch, lambda: time.sleep(60), parent_answer=lambda m: m)
    t = time.perf_counter()
    with InferAhead() as ahead:
        ahead.start(_model())
        pid = ahead._pid
        assert pid is not None
    assert time.perf_counter() - t < 10
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie left


def test_a_child_that_never_answers_is_killed_and_inference_runs_here(monkeypatch):
    """A child stuck past the deadline (a lock some native thread held at the fork) costs the
    deadline, never a hang: it is killed and reaped, and the answer is the in-process one."""
    _in_child_only(monkeypatch, lambda: time.sleep(60))
    monkeypatch.setattr(ahead_mod, "ANSWER_DEADLINE_S", 0.5)
    model = _model()
    t = time.perf_counter()
    with InferAhead() as ahead:
        ahead.start(model)
        pid = ahead._pid
        got = ahead.inferred_graph(model)
    assert time.perf_counter() - t < 10
    assert [vi.SerializeToString() for vi in got.value_info] == _expected(model)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped: no zombie left


def test_child_output_does_not_reach_parent_streams(capfd):
    with InferAhead() as ahead:
        print("buffered in the parent", end="", file=sys.stdout)  # os._exit: the child never flushes it
        ahead.start(_model())
        ahead.result(_model())
    sys.stdout.flush()
    assert capfd.readouterr().out.count("buffered in the parent") == 1


def _count_header_checks(monkeypatch) -> list[int]:
    """The pids of every ``check_header`` call made from here on (the parent's and the child's)."""
    import graphopt.ir.io as io_mod

    pids, real = [], io_mod.check_header
    monkeypatch.setattr(io_mod, "check_header", lambda *a: pids.append(os.getpid()) or real(*a))
    return pids


def test_load_model_hands_the_header_check_to_the_child(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    pids = _count_header_checks(monkeypatch)
    with InferAhead() as ahead:
        graph = load_model(path, ahead=ahead)
        assert ahead.check_passed()
        got = ahead.result(graph.source_model)
    assert pids == []  # the child's call is not recorded here: the parent never checked
    assert [vi.SerializeToString() for vi in got.value_info] == _expected(_model())


def _bad_header_and_tensor(tmp_path):
    bad = _model()
    bad.opset_import[0].version = 99  # refused by the header check ...
    bad.graph.initializer[0].raw_data = b"\0" * 3  # ... and by the tensor check, which comes later
    path = tmp_path / "bad.onnx"
    path.write_bytes(bad.SerializeToString())
    return path


def test_a_bad_header_is_the_error_by_either_route(tmp_path, monkeypatch):
    path = _bad_header_and_tensor(tmp_path)
    with pytest.raises(UnsupportedModel) as here:
        load_model(path)
    pids = _count_header_checks(monkeypatch)
    with InferAhead() as ahead, pytest.raises(UnsupportedModel) as ahead_route:
        load_model(path, ahead=ahead)
    assert str(ahead_route.value) == str(here.value) and "opset 99" in str(here.value)
    assert pids == [os.getpid()]  # the child said no: the parent checked, for the error


def test_a_bad_tensor_behind_a_good_header_is_refused_by_either_route(tmp_path):
    bad = _model()
    bad.graph.initializer[0].raw_data = b"\0" * 3  # 3 bytes for 20 floats: refused by the tensor check
    path = tmp_path / "bad.onnx"
    path.write_bytes(bad.SerializeToString())
    with pytest.raises(InvalidModel) as here:
        load_model(path)
    with InferAhead() as ahead, pytest.raises(InvalidModel) as ahead_route:
        load_model(path, ahead=ahead)
    assert str(ahead_route.value) == str(here.value)


def test_a_child_that_dies_before_checking_leaves_the_check_to_the_parent(tmp_path, monkeypatch):
    import graphopt.ir.io as io_mod

    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    parent, real = os.getpid(), io_mod.check_header
    pids = []

    def check(*a):
        pids.append(os.getpid())
        if os.getpid() != parent:
            os._exit(3)
        return real(*a)

    monkeypatch.setattr(io_mod, "check_header", check)
    with InferAhead() as ahead:
        graph = load_model(path, ahead=ahead)
        assert ahead.result(graph.source_model) is NOT_RUN
    assert pids == [parent]


def test_a_model_with_external_data_is_checked_here_and_inferred_once_loaded(tmp_path, monkeypatch):
    model = _model()
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    pids = _count_header_checks(monkeypatch)
    starts = []
    real_start = InferAhead.start
    monkeypatch.setattr(InferAhead, "start", lambda self, m, check=None: starts.append(check) or real_start(self, m, check))
    with InferAhead() as ahead:
        graph = load_model(tmp_path / "ext.onnx", ahead=ahead)
        got = ahead.result(graph.source_model)
    assert pids == [os.getpid()]  # checked here: inference must see the loaded data
    assert starts[-1] is None and len(starts) == 2  # the early start, then one after validation
    assert [vi.SerializeToString() for vi in got.value_info] == _expected(model)


def test_optimize_file_writes_the_same_bytes_with_and_without_the_child(tmp_path, monkeypatch):
    from pathlib import Path

    from graphopt.pipeline import optimize_file

    src = Path(__file__).resolve().parents[2] / "models" / "transformer_block.onnx"
    started = []
    real_start = InferAhead.start
    monkeypatch.setattr(InferAhead, "start", lambda self, m, check=None: started.append(m) or real_start(self, m, check))
    optimize_file(src, tmp_path / "child.onnx", gpu="a100")
    assert len(started) == 1
    monkeypatch.setattr(ahead_mod.threading, "active_count", lambda: 2)  # no fork: in-process
    optimize_file(src, tmp_path / "here.onnx", gpu="a100")
    assert (tmp_path / "child.onnx").read_bytes() == (tmp_path / "here.onnx").read_bytes()


def test_small_model_is_worth_forking_a_large_one_is_not(monkeypatch):
    model = _model()
    assert worth_forking(model)
    monkeypatch.setattr(ahead_mod, "WEIGHTLESS_ABOVE", 80)  # the 4x5 float weight holds exactly 80 bytes
    assert not worth_forking(model)
    with InferAhead() as ahead:
        ahead.start(model)
        assert ahead._pid is None  # inferred in-process (from the weightless copy when truly large)
        assert ahead.result(model) is NOT_RUN
    monkeypatch.setattr(ahead_mod, "WEIGHTLESS_ABOVE", 81)
    assert worth_forking(model)


def test_model_with_lazy_weights_is_not_forked(monkeypatch):
    monkeypatch.setattr(ahead_mod, "has_lazy", lambda m: True)
    assert not worth_forking(_model())


def test_optimize_file_reaps_the_child_when_the_graph_is_refused(tmp_path, monkeypatch):
    from graphopt.errors import InvalidGraph
    from graphopt.pipeline import optimize_file

    # header and tensors pass (the child starts), the IR refuses it: two nodes make "y"
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    src = tmp_path / "dup.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    pids = []
    real_start = InferAhead.start

    def start(self, m, check=None):
        started = real_start(self, m, check)
        pids.append(self._pid)
        return started

    monkeypatch.setattr(InferAhead, "start", start)
    with pytest.raises(InvalidGraph, match="produced by two nodes"):
        optimize_file(src, tmp_path / "out.onnx", gpu="a100")
    assert len(pids) == 1 and pids[0] is not None
    with pytest.raises(ChildProcessError):
        os.waitpid(pids[0], os.WNOHANG)
    assert not (tmp_path / "out.onnx").exists()
