"""attention_causal_mask on masks computed at run time (``rewrite/mask_grid.py``): the dynamic-length form of
transformers' decoder exports (``Where(Expand(LessOrEqual(key, query)), 0, min)`` over ``Range(0, S, 1)``)
and the static-length form (a constant causal table And-ed with a padding mask made of ones) become causal=1;
near-misses (an offset Range, the anti-causal comparison, a window constant, another length, a real padding
mask, a table that differs per batch entry, a padding of zeros) keep the mask, with the reason; the rewritten
graph computes what the original did under onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from graphopt.ir import to_model
from graphopt.ops import attach_functions
from graphopt.rewrite import RuleSet, load_rules
from graphopt.rewrite.mask_grid import NotAMaskGrid, mask_grid
from graphopt.rewrite.testing import Builder, rewrite_inferred, run_ort

RULE = "attention_causal_mask"
SHIPPED = load_rules()
H, D, S_STATIC = 3, 4, 5
FLOAT_MIN = float(np.finfo(np.float32).min)


def _attention(b, mask, kind, seq, elem=TensorProto.FLOAT, **attrs):
    qkv = [b.input(n, ["batch", H, seq, D], elem) for n in ("q", "k", "v")]
    b.output(b.op("Attention", qkv + [mask], domain="graphopt", mask_kind=kind, scale=0.5, **attrs))


def dynamic_model(variant="fires", kind="additive", fp16=False):
    """The dynamic-length causal mask of transformers' LLaMA export (dynamo's value_info names the dims)."""
    b = Builder(17, seed=3)
    ids = b.input("ids", ["batch", "seq"], TensorProto.INT64)
    bound = b.input("past", ["batch", "ctx"], TensorProto.INT64) if variant == "other_length" else ids
    length = b.op("Squeeze", [b.op("Shape", [bound], start=1, end=2)])
    start = 1 if variant == "offset" else 0
    if variant == "float_range":  # Range(0.5, S, 1.0): a half-position offset that int() would round away
        arange = b.op("Range", [b.const(0.5, "start"), b.op("Cast", [length], to=TensorProto.FLOAT), b.const(1.0, "delta")])
    else:
        arange = b.op("Range", [b.const(start, "start", np.int64), length, b.const(1, "delta", np.int64)])
    row = b.op("Unsqueeze", [arange, b.const([0, 1], "ax", np.int64)])
    key = b.op("Unsqueeze", [row, b.const([2], "ax", np.int64)])  # [1, 1, 1, S]
    query = b.op("Unsqueeze", [row, b.const([3], "ax", np.int64)])  # [1, 1, S, 1]
    keep = b.op("GreaterOrEqual" if variant == "anti" else "LessOrEqual", [key, query])
    if variant == "window":  # a key more than 2 ahead of position 0 is dropped: not a function of i vs j alone
        keep = b.op("And", [keep, b.op("Less", [key, b.const(3, "w", np.int64)])])
    target = b.op("Concat", [b.op("Shape", [ids], start=0, end=1), b.const([1], "one", np.int64),
                             b.op("Shape", [ids], start=1, end=2), b.op("Shape", [ids], start=1, end=2)], axis=0)
    keep = b.op("Expand", [keep, target])
    np_t = np.float16 if fp16 else np.float32
    fill = {"finite_fill": -1e3, "clamped_fill": -1e4}.get(variant, float(np.finfo(np_t).min))
    mask = keep if kind == "bool" else b.op("Where", [keep, b.const(0.0, "zero", np_t), b.const(fill, "fill", np_t)])
    _attention(b, mask, kind, "seq", TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT)
    model = b.model()
    if variant != "no_hints":  # what the dynamo exporter writes: the Range's and the Expand's dims by name
        model.graph.value_info.extend([
            helper.make_tensor_value_info(arange, TensorProto.FLOAT if variant == "float_range" else TensorProto.INT64,
                                          ["ctx" if variant == "other_length" else "seq"]),
            helper.make_tensor_value_info(keep, TensorProto.BOOL, ["batch", 1, "seq", "seq"])])
    return model


def static_model(variant="fires"):
    """The static-length form: a constant causal table And-ed with ones_like(ids) gathered (transformers 5)."""
    b = Builder(17, seed=4)
    ids = b.input("ids", ["batch", S_STATIC], TensorProto.INT64)
    future = np.arange(S_STATIC)[None, :] > np.arange(S_STATIC)[:, None]
    table = np.broadcast_to(~future, (2 if variant == "per_batch" else 1, 1, S_STATIC, S_STATIC)).copy()
    if variant == "per_batch":
        table[1, 0, 4, 0] = False
    fill = 0 if variant == "zeros" else 1
    if variant == "padding_input":
        pad = b.input("attention_mask", ["batch", 1, 1, S_STATIC], TensorProto.BOOL)
    else:
        ones = b.op("Cast", [b.op("Expand", [b.const(fill, "one", np.int64), b.op("Shape", [ids])])], to=TensorProto.BOOL)
        pad = b.op("GatherND", [ones, b.input("idx", ["batch", 1, 1, S_STATIC, 2], TensorProto.INT64)])
    keep = b.op("And", [b.const(table, "causal", np.bool_), pad])
    mask = b.op("Where", [keep, b.const(0.0, "zero"), b.const(FLOAT_MIN, "fill")])
    _attention(b, mask, "additive", S_STATIC)
    return b.model()


def _attention_node(g):
    (node,) = [n for n in g.nodes() if n.op_type == "Attention"]
    return node


def _feeds(model, batch=2, seq=6, fp16=False):
    rng = np.random.default_rng(7)
    dt = np.float16 if fp16 else np.float32
    feeds = {n: rng.standard_normal((batch, H, seq, D)).astype(dt) for n in ("q", "k", "v")}
    feeds["ids"] = np.zeros((batch, seq), np.int64)
    if "past" in {i.name for i in model.graph.input}:
        feeds["past"] = np.zeros((batch, seq), np.int64)
    names = {i.name for i in model.graph.input}
    if "idx" in names:  # [b, 0, 0, s] -> ones_like(ids)[b, s]
        grid = np.stack(np.meshgrid(np.arange(batch), np.arange(seq), indexing="ij"), -1)
        feeds["idx"] = grid[:, None, None].astype(np.int64)
    return feeds


def _same_outputs(model, g, **kw):
    feeds = _feeds(model, **kw)
    got = run_ort(attach_functions(to_model(g)), feeds)[0].astype(np.float64)
    want = run_ort(attach_functions(model), feeds)[0].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-2 if kw.get("fp16") else 1e-5, atol=2e-2 if kw.get("fp16") else 1e-5)


@pytest.mark.parametrize("kind,fp16,variant", [("additive", False, "fires"), ("bool", False, "fires"),
                                               ("additive", True, "fires"), ("additive", False, "no_hints")])
def test_dynamic_causal_mask_becomes_causal(kind, fp16, variant):
    """no_hints: no value_info names the Range's or the Expand's dims (TorchScript's exports, where onnx's
    inference calls them unk__): they are computed from the Shape entries the bound and the target read."""
    model = dynamic_model(variant, kind=kind, fp16=fp16)
    g, report = rewrite_inferred(model, RuleSet([SHIPPED.get(RULE)]))
    assert report.counts == {RULE: 1}, report.counts
    att = _attention_node(g)
    assert (att.attr("causal"), att.attr("mask_kind"), len(att.inputs)) == (1, "none", 3)
    for seq in (1, 2, 6):
        _same_outputs(model, g, seq=seq, fp16=fp16)


def test_static_table_and_ones_padding_becomes_causal():
    model = static_model()
    g, report = rewrite_inferred(model, RuleSet([SHIPPED.get(RULE)]))
    assert report.counts == {RULE: 1}, report.counts
    assert _attention_node(g).attr("causal") == 1
    _same_outputs(model, g, seq=S_STATIC)


@pytest.mark.parametrize("build,variant,reason", [
    (dynamic_model, "offset", "is not Range(0, n, 1)"),
    (dynamic_model, "float_range", "is not Range(0, n, 1) over integers"),
    (dynamic_model, "anti", "is not 0 everywhere at or below the diagonal"),
    (dynamic_model, "window", "not proven small integers"),
    (dynamic_model, "other_length", "a Range of length ctx indexes an axis of size seq"),
    (dynamic_model, "finite_fill", "does not mask a score exactly"),
    (lambda v: dynamic_model(v, fp16=True), "clamped_fill", "does not mask a score exactly"),
    (static_model, "per_batch", "not proven to fit the attention's scores"),  # a batch of 2 on Q's batch
    (static_model, "zeros", "is not 0 everywhere at or below the diagonal"),
    (static_model, "padding_input", "'attention_mask' is a graph input"),
])
def test_near_misses_keep_the_mask(build, variant, reason):
    model = build(variant)
    g, report = rewrite_inferred(model, RuleSet([SHIPPED.get(RULE)]), explain=True)
    assert report.counts == {}
    reasons = [m.reason for m in report.near_misses if m.rule == RULE]
    assert any(reason in r for r in reasons), reasons
    assert _attention_node(g).attr("mask_kind") == "additive"


def test_the_grid_is_3x3_for_symbolic_lengths_and_full_for_a_table():
    g, _ = rewrite_inferred(dynamic_model(), RuleSet([]))
    mask = _attention_node(g).inputs[3]
    grid = mask_grid(g, mask, lambda: ("batch", H, "seq", "seq"))
    assert grid.shape == (3, 3) and grid.dtype == np.float32
    assert np.array_equal(grid == 0, np.tril(np.ones((3, 3), bool)))
    with pytest.raises(NotAMaskGrid, match="not proven to fit"):
        mask_grid(g, mask, lambda: ("batch", H, "seq", "other"))
    with pytest.raises(NotAMaskGrid, match="not proven to fit"):  # one query row: the [S, S] mask would grow it
        mask_grid(g, mask, lambda: ("batch", H, 1, "seq"))
    with pytest.raises(NotAMaskGrid, match="not proven to fit"):  # another batch: the mask's could grow it
        mask_grid(g, mask, lambda: ("nb", H, "seq", "seq"))
    g, _ = rewrite_inferred(static_model(), RuleSet([]))
    grid = mask_grid(g, _attention_node(g).inputs[3], lambda: ("batch", H, S_STATIC, S_STATIC))
    assert grid.shape == (S_STATIC, S_STATIC)


def test_the_fp16_conversions_clamped_fill_is_the_sources_minus_infinity():
    """The dynamic LLaMA at --precision fp16: the conversion writes its -3.4e38 fill as -1e4, which alone does
    not mask exactly (above); the fp32 source's did, so the clamp is read as -inf there and the mask goes."""
    from pathlib import Path

    import onnx

    import graphopt

    src = Path(__file__).resolve().parents[2] / "models" / "coverage" / "llamadyn_dynamo.onnx"
    optimized, report = graphopt.optimize(onnx.load(str(src)), gpu="none", precision="fp16", verify=True)
    attention = [n for n in optimized.graph.node if n.op_type == "Attention"]
    assert attention and all(len(n.input) == 3 for n in attention), [list(n.input) for n in attention]
    assert report.rewrites.get(RULE) == len(attention)


def _causal_condition(b) -> str:
    """key <= query over Range(0, S) of the ids' length: dynamic_model's condition without its variants."""
    ids = b.input("ids", ["batch", "seq"], TensorProto.INT64)
    length = b.op("Squeeze", [b.op("Shape", [ids], start=1, end=2)])
    arange = b.op("Range", [b.const(0, "start", np.int64), length, b.const(1, "delta", np.int64)])
    row = b.op("Unsqueeze", [arange, b.const([0, 1], "ax", np.int64)])
    return b.op("LessOrEqual", [b.op("Unsqueeze", [row, b.const([2], "ax", np.int64)]),
                                b.op("Unsqueeze", [row, b.const([3], "ax", np.int64)])])


def _two_layers_sharing_one_condition(fill_2: float):
    """Two attentions on one causal condition: layer 1 fills with float32's minimum, layer 2 with ``fill_2``."""
    b = Builder(17, seed=3)
    keep = _causal_condition(b)
    for tag, fill in (("1", FLOAT_MIN), ("2", fill_2)):
        q, k, v = (b.input(f"{n}{tag}", ["batch", H, "seq", D]) for n in "qkv")
        mask = b.op("Where", [keep, b.const(0.0, "zero"), b.const(fill, "fill")])
        s = b.op("Add", [b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]), b.const(0.5, "sc")]), mask])
        b.output(b.op("MatMul", [b.op("Softmax", [s], axis=-1), v]))
    return b.model()


def test_a_genuine_fp16_fill_is_not_merged_into_a_clamped_one():
    """--precision fp16 writes both fills as -1e4; only layer 1's was -3.4e38 in the source. merge_duplicates must
    not hand layer 2 layer 1's flagged fill (Graph.fp16_clamped): layer 2 keeps its mask."""
    import graphopt

    optimized, report = graphopt.optimize(_two_layers_sharing_one_condition(-1e4), gpu="none", precision="fp16")
    masks = sorted(len(n.input) for n in optimized.graph.node if n.op_type == "Attention")
    assert masks == [3, 4] and report.rewrites.get(RULE) == 1, (masks, report.rewrites)


def test_a_mask_built_as_a_deep_dag_is_walked_once_per_tensor():
    """x = And(x, x) twenty times: without the memo the walk took 2^20 steps."""
    import time

    b = Builder(17)
    keep = _causal_condition(b)
    for _ in range(20):
        keep = b.op("And", [keep, keep])
    _attention(b, keep, "bool", "seq")
    model = b.model()
    t = time.perf_counter()
    g, report = rewrite_inferred(model, RuleSet([SHIPPED.get(RULE)]))
    assert report.counts == {RULE: 1} and time.perf_counter() - t < 5.0


def test_verify_after_precision_fp16_uses_fp16_tolerances():
    """The library's verify after --precision fp16 compares at fp16's tolerances, as the CLI does, also where the
    rewrites leave the optimized model no fp16 tensor of its own to show (both masks gone here)."""
    import graphopt

    _, report = graphopt.optimize(_two_layers_sharing_one_condition(FLOAT_MIN), gpu="none", precision="fp16",
                                  verify=True)
    assert report.verify["ok"] and report.verify["rtol"] == 1e-2 and report.rewrites.get(RULE) == 2
