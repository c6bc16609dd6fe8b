"""proven_shape inside symbolic_dims_ahead: the dims onnx's inference leaves as fresh ``unk__N`` names are what
onnxruntime's symbolic inference proves (an int or a graph input's dim name), from a forked child or in-process
alike; what it cannot prove, what disagrees with the IR, and a missing sympy prove nothing; the IR is not
changed, and no file is written (onnxruntime's own driver saves a model into the working directory when a shape
stays unknown)."""

from __future__ import annotations

import builtins
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphopt.ir import from_model
import graphopt.ir.symbolic as S
from graphopt.ir.symbolic import needs_refining, proven_shape, symbolic_dims_ahead
from graphopt.rewrite.testing import Builder

pytest.importorskip("sympy")


def head_split_model(unknown_op: bool = False):
    """x [batch, seq, 8] viewed as [batch, seq, 2, 4] through a target computed from Shape(x) (TorchScript's
    ``x.view(*x.shape[:2], -1, 4)``), then Relu; with ``unknown_op`` the Relu's input comes from an op
    symbolic inference does not know, so its output stays unknown."""
    b = Builder(17)
    x = b.input("x", ["batch", "seq", 8])
    shape = b.op("Shape", [x])
    lead = b.op("Slice", [shape, b.const([0], "s", np.int64), b.const([2], "e", np.int64)])
    target = b.op("Concat", [lead, b.const([-1, 4], "t", np.int64)], axis=0)
    y = b.op("Reshape", [x, target])
    if unknown_op:
        y = b.op("Mystery", [y], domain="custom.test")
    b.output(b.op("Relu", [y]))
    model = b.model()
    if unknown_op:
        model.opset_import.append(helper.make_opsetid("custom.test", 1))
    return onnx.shape_inference.infer_shapes(model)


def _proven(g, name):
    with symbolic_dims_ahead(g):
        return proven_shape(g, name)


@pytest.mark.parametrize("fork", [True, False])
def test_a_computed_reshape_target_gets_the_input_dims(tmp_path, monkeypatch, fork):
    monkeypatch.chdir(tmp_path)
    if not fork:
        monkeypatch.setattr("graphopt.ir.ahead.can_fork", lambda: False)
    g = from_model(head_split_model())
    relu = g.nodes_by_op("Relu")[0]
    before = g.shape(relu.inputs[0])
    assert all(isinstance(d, str) and d.startswith("unk__") for d in before), before
    assert needs_refining(g)
    with symbolic_dims_ahead(g):
        assert g.shape(relu.inputs[0]) == before  # the IR unchanged while the rules run
        assert proven_shape(g, relu.inputs[0]) == ("batch", "seq", 2, 4)
    assert g.shape(relu.inputs[0]) == ("batch", "seq", 2, 4)  # then recorded, for the tuner
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fork", [True, False])
def test_nothing_is_recorded_where_no_proof_asked(monkeypatch, fork):
    """Either route gives the same graph: the in-process route computes before the rules, but records only
    what a proof asked for, as the forked route does."""
    if not fork:
        monkeypatch.setattr("graphopt.ir.ahead.can_fork", lambda: False)
    g = from_model(head_split_model())
    name = g.nodes_by_op("Relu")[0].inputs[0]
    before = g.shape(name)
    with symbolic_dims_ahead(g):
        pass
    assert g.shape(name) == before


def test_what_it_cannot_prove_stays_unknown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    g = from_model(head_split_model(unknown_op=True))
    relu = g.nodes_by_op("Relu")[0]
    before = g.shape(relu.outputs[0])
    assert _proven(g, relu.outputs[0]) == before  # after an unknown op: nothing proven, nothing invented
    assert os.listdir(tmp_path) == []  # onnxruntime's infer_shapes would have saved sym_shape_infer_temp.onnx


def _answering(monkeypatch, name, dims):
    answer = onnx.ModelProto()
    answer.graph.value_info.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
    monkeypatch.setattr(S, "symbolic_inference", lambda model: answer)


def test_a_dim_that_disagrees_with_the_ir_keeps_the_ir(monkeypatch):
    g = from_model(head_split_model())
    name = g.nodes_by_op("Reshape")[0].outputs[0]
    g.set_value_info(name, TensorProto.FLOAT, ["unk__1", "unk__2", "unk__3", 4])
    for dims in (["batch", "seq", 3, 5], ["batch", "seq", 8]):  # another last dim; another rank
        _answering(monkeypatch, name, dims)
        assert _proven(g, name) == ("unk__1", "unk__2", "unk__3", 4)


def test_only_input_dim_names_and_ints_are_taken(monkeypatch):
    g = from_model(head_split_model())
    name = g.nodes_by_op("Reshape")[0].outputs[0]
    _answering(monkeypatch, name, ["batch", "2*seq", "Reshape_dim2", 4])
    got = _proven(g, name)
    assert got[0] == "batch" and got[3] == 4 and all(d.startswith("unk__") for d in got[1:3])


def test_without_sympy_nothing_is_proven(monkeypatch):
    real_import = builtins.__import__

    def no_sympy(name, *args, **kwargs):
        if name.startswith("onnxruntime.tools.symbolic_shape_infer") or name == "sympy":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sympy)
    g = from_model(head_split_model())
    name = g.nodes_by_op("Reshape")[0].outputs[0]
    assert _proven(g, name) == g.shape(name)


def test_a_proof_that_never_asks_costs_no_inference(monkeypatch):
    """The child is cancelled unread; in-process (no fork) the inference runs before the rules."""
    g = from_model(head_split_model())
    with symbolic_dims_ahead(g) as dims:
        assert dims._child.running or dims._dims is not None
    assert not dims._child.running


def test_the_optimized_file_is_the_same_by_either_route(tmp_path, monkeypatch):
    """A model whose causal-mask proof asks (the TorchScript LLaMA): the same bytes with and without the child."""
    from pathlib import Path

    from graphopt.pipeline import optimize_file

    src = Path(__file__).resolve().parents[2] / "models" / "coverage" / "llamadyn_torchscript.onnx"
    optimize_file(src, tmp_path / "ahead.onnx", gpu="none")
    monkeypatch.setattr("graphopt.ir.ahead.can_fork", lambda: False)
    optimize_file(src, tmp_path / "here.onnx", gpu="none")
    assert (tmp_path / "ahead.onnx").read_bytes() == (tmp_path / "here.onnx").read_bytes()
    optimized = onnx.load(str(tmp_path / "here.onnx"))
    assert all(not (len(n.input) > 3 and n.input[3]) for n in optimized.graph.node if n.op_type == "Attention")
