"""infer_reshape_dims: a Reshape whose target is computed from shapes at run time gets the dims its entries
prove (the LLaMA head split ``[batch, seq, -1, 16]`` of ``[batch, seq, 32]`` has 2 heads); one whose named
dims do not cancel, or whose input has unknown dims, keeps what onnx inferred, with the reason; nothing is
recorded against a dim the value_info already knows."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper as h

sys.path.insert(0, str(Path(__file__).parent))
from test_passes_common import model  # noqa: E402

from graphopt.ir import from_model  # noqa: E402
from graphopt.passes import CLEANUP_ORDER, infer_reshape_dims  # noqa: E402


def _head_split(x_shape=("batch", "seq", 32), tail=(-1, 16), entries=(0, 1), vi=("batch", "seq", None, 16)):
    """Reshape(x, Concat(Unsqueeze(Gather(Shape(hid), i)) for i in entries, tail)), as TorchScript writes
    ``x.view(*input_shape, -1, head_dim)``; hid is the projection's input [batch, seq, 64]."""
    inits = {f"i{i}": np.array(i, np.int64) for i in range(3)}
    inits.update(ax=np.array([0], np.int64), tail=np.array(tail, np.int64))
    nodes = [h.make_node("Relu", ["hid"], ["hr"]), h.make_node("Shape", ["hr"], ["s"])]
    parts = []
    for i in entries:
        nodes += [h.make_node("Gather", ["s", f"i{i}"], [f"g{i}"], axis=0), h.make_node("Unsqueeze", [f"g{i}", "ax"], [f"u{i}"])]
        parts.append(f"u{i}")
    nodes += [h.make_node("Concat", parts + ["tail"], ["target"], axis=0), h.make_node("Relu", ["x"], ["xr"]),
              h.make_node("Reshape", ["xr", "target"], ["y"]), h.make_node("Neg", ["y"], ["out"])]
    m = model(nodes, [("hid", ["batch", "seq", 64]), ("x", list(x_shape))], [("out", None)], inits,
              value_info=[("hr", ["batch", "seq", 64]), ("xr", list(x_shape)),
                          ("y", [d if d is not None else "unk__8" for d in vi])])
    return from_model(onnx.shape_inference.infer_shapes(m))  # as the pipeline loads it


def test_the_head_count_of_a_computed_head_split():
    g = _head_split()
    assert g.shape("y")[2] != 2  # onnx cannot say
    assert infer_reshape_dims(g) == 1
    assert g.shape("y") == ("batch", "seq", 2, 16)
    assert infer_reshape_dims(g) == 0  # idempotent


def test_dims_that_do_not_follow_stay_with_their_reason():
    cases = [
        (dict(x_shape=("batch", "seq", 32), tail=(-1, 16), entries=(0,), vi=("batch", None, 16)), "named dims that do not cancel"),
        (dict(x_shape=("batch", "unk__3", 32)), "its input has dims of unknown size"),
        (dict(tail=(-1, -1), entries=(0,), vi=("batch", None, None)), "more than one -1"),
    ]
    for kw, why in cases:
        g = _head_split(**kw)
        reasons = []
        assert infer_reshape_dims(g, trace=lambda p, n, r: reasons.append(r)) == 0
        assert any(why in r for r in reasons), (kw, reasons)


def test_it_runs_after_the_folds_and_before_the_rewrites_read_the_shapes():
    assert CLEANUP_ORDER.index("fold_constants") < CLEANUP_ORDER.index("infer_reshape_dims") < CLEANUP_ORDER.index("fold_transposes")


def test_the_expand_idiom_is_read_entry_by_entry():
    """torch's expand writes its target as Where(Equal(T, -1), 1, T): T's dims pass, a -1 constant becomes 1."""
    from graphopt.rewrite.dim_sources import dim_source

    inits = {"i0": np.array(0, np.int64), "ax": np.array([0], np.int64), "c": np.array([-1, 3], np.int64),
             "neg": np.array([-1, -1, -1], np.int64), "ones": np.array([1, 1, 1], np.int64)}
    nodes = [h.make_node("Shape", ["k"], ["s"]), h.make_node("Gather", ["s", "i0"], ["g0"], axis=0),
             h.make_node("Unsqueeze", ["g0", "ax"], ["u0"]), h.make_node("Concat", ["u0", "c"], ["t"], axis=0),
             h.make_node("Equal", ["t", "neg"], ["eq"]), h.make_node("Where", ["eq", "ones", "t"], ["target"]),
             h.make_node("Expand", ["k", "target"], ["y"])]
    g = from_model(onnx.shape_inference.infer_shapes(model(nodes, [("k", ["b", 1, 1])], [("y", None)], inits)))
    assert [dim_source(g, "target", i) for i in range(3)] == [("k", 0), 1, 3]


def test_a_graph_output_keeps_its_declared_shape_and_the_pass_stays_idempotent():
    """refine_value_info leaves a graph output's declared value_info alone: nothing changed, nothing counted."""
    g = _head_split()
    g.set_outputs(list(g.outputs) + ["y"])
    before = g.shape("y")
    assert infer_reshape_dims(g) == 0 and g.shape("y") == before
