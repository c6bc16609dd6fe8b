"""Layout-aware lowering choice (graphopt.tune.layout_choice): NHWC regions and the conversions at
their edges, on small CNNs built in code, profiled with fake candidates and a fake timer (CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphopt.ir import from_model, to_model
from graphopt.lowering.contract import Candidate, Signature
from graphopt.ops import attach_functions
from graphopt.tune.gpus import DeviceInfo
from graphopt.tune.layout_choice import (LAYOUT_ATTR, NCHW, NHWC, Option, conversion_ms, layout_line, significant,
                                         solve_graph)
from graphopt.tune.candidate_run import FakeTimer
from graphopt.tune.profiler import Profiler
from graphopt.tune.select import select_lowerings
from tests.conftest import run_graphopt, run_ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _coverage_util import G, feeds, optimize  # noqa: E402

H200 = DeviceInfo(0, "NVIDIA H200", "h200", (9, 0), "13.0", "13.0", "14.2.0")
NHWC_LAYOUTS = ("NHWC", "NHWC", "", "NHWC", "NHWC")  # X, W, B, R, Y: what cuDNN's fused conv declares


class LayoutCand(Candidate):
    """A fake lowering: ``ms`` is its simulated time; a ``cudnn`` one declares NHWC, others NCHW."""

    def source_hash(self):
        return "src-" + self.name

    def layouts(self, sig):
        return NHWC_LAYOUTS if self.name == "cudnn" else ()

    def build(self, sig, arch):
        ms = float(self.param("ms"))
        return lambda inputs, outputs: ms


def ok_checker(sig, launch):
    return None


def candidates(dw: tuple[float, float], dense: tuple[float, float] = (0.02, 0.01)):
    """Fake candidates per conv kind: (NCHW ``direct`` ms, NHWC ``cudnn`` ms) for depthwise / dense."""

    def make(sig: Signature):
        direct, cudnn = dw if sig.attr("group", 1) > 1 else dense
        return [LayoutCand("direct", (("ms", direct),)), LayoutCand("cudnn", (("ms", cudnn),))]

    return make


def profiled(graph, cands):
    with Profiler(cands, timer=FakeTimer(3), checker=ok_checker, device=H200, cache=None, isolate=False) as prof:
        return select_lowerings(graph, "h200", profile=prof, devices=[H200], progress=False)


def _conv(g: G, t, cin, cout, k, group=1, name=None):
    return g.op("Conv", [t, g.rand([cout, cin // group, k, k]), g.rand([cout], "b")], name=name,
                kernel_shape=[k, k], pads=[k // 2] * 4, group=group)


def chain_model() -> onnx.ModelProto:
    """x -> Conv1x1+Relu -> depthwise Conv3x3+Relu -> Conv1x1 -> GlobalAveragePool -> Flatten."""
    g = G(opset=17)
    x = g.input("x", [1, 32, 28, 28])
    a = g.op("Relu", [_conv(g, x, 32, 32, 1, name="c1")])
    b = g.op("Relu", [_conv(g, a, 32, 32, 3, group=32, name="dw")])
    c = _conv(g, b, 32, 32, 1, name="c2")
    g.output(g.op("Flatten", [g.op("GlobalAveragePool", [c])]))
    return g.model()


def residual_model() -> onnx.ModelProto:
    """A stem, a MaxPool, a residual block (its Add fused into the CBR as R), two branches joined by
    an Add, the 4-D result a graph output."""
    g = G(opset=17)
    x = g.input("x", [1, 16, 16, 16])
    p = g.op("MaxPool", [g.op("Relu", [_conv(g, x, 16, 32, 3, name="stem")])], kernel_shape=[2, 2], strides=[2, 2])
    a = g.op("Relu", [_conv(g, p, 32, 32, 1, name="a")])
    r = g.op("Relu", [g.op("Add", [_conv(g, a, 32, 32, 3, name="b"), p])])
    left = g.op("Relu", [_conv(g, r, 32, 32, 1, name="left")])
    right = g.op("Relu", [_conv(g, r, 32, 32, 3, name="right")])
    g.output(g.op("Add", [left, right], name="join"))
    return g.model()


def fused(model):
    graph, _ = optimize(model)
    return graph


def cbr_nodes(graph):
    return [n for n in graph.nodes() if n.op_type == "CBR"]


def chosen(graph):
    return [(n.attr("lowering"), n.attr(LAYOUT_ATTR)) for n in cbr_nodes(graph)]


def edges(rep):
    return [(c["tensor"], c["producer"], c["consumer"], c["from"], c["to"]) for c in rep.conversions]


def conv_ms(shape):
    return conversion_ms(shape, 4)


CONV = conv_ms((1, 32, 28, 28))  # one conversion of the chain's activations


# --------------------------------------------------------------------------- the chain


def test_nchw_slightly_faster_alone_but_two_conversions_picks_nhwc():
    graph = fused(chain_model())
    c1, dw, c2 = cbr_nodes(graph)
    # the depthwise conv's NCHW kernel wins alone by less than the two conversions it forces
    rep = profiled(graph, candidates(dw=(0.010, 0.010 + 1.5 * CONV)))
    assert chosen(graph) == [("cudnn", NHWC)] * 3
    row = next(r for r in rep.rows if r.node == dw.name)
    assert row.lowering == "cudnn" and row.layout == NHWC
    assert "layout: cudnn:ms=" in row.reason and "instead of the fastest direct:ms=0.01" in row.reason
    # what remains: the graph input into the NHWC region; GlobalAveragePool's 1x1 output needs none
    assert edges(rep) == [("x", "", c1.name, NCHW, NHWC)]
    assert rep.conversions[0]["ms"] == pytest.approx(CONV)
    assert rep.layout_summary == layout_line(rep.conversions)
    assert rep.layout_summary.startswith("layout: 1 conversion remains (estimated ")


def test_much_faster_nchw_is_kept_and_exactly_the_edge_conversions_are_reported():
    graph = fused(chain_model())
    c1, dw, c2 = cbr_nodes(graph)
    rep = profiled(graph, candidates(dw=(0.002, 0.050)))
    assert chosen(graph) == [("cudnn", NHWC), ("direct", NCHW), ("cudnn", NHWC)]
    row = next(r for r in rep.rows if r.node == dw.name)
    assert "layout:" not in row.reason  # its own fastest
    assert edges(rep) == [
        ("x", "", c1.name, NCHW, NHWC),
        (c1.outputs[0], c1.name, dw.name, NHWC, NCHW),
        (dw.outputs[0], dw.name, c2.name, NCHW, NHWC),
    ]
    assert sum(c["ms"] for c in rep.conversions) == pytest.approx(3 * CONV)


@pytest.mark.parametrize("margin, want", [(-0.1, "cudnn"), (+0.1, "direct")])
def test_the_break_even_is_two_conversions(margin, want):
    """NHWC depthwise wins up to exactly the two conversions it saves, and loses beyond them."""
    graph = fused(chain_model())
    profiled(graph, candidates(dw=(0.010, 0.010 + (2 + margin) * CONV)))
    assert chosen(graph)[1][0] == want


def test_a_region_of_nchw_convs_converts_only_at_its_edges():
    """Dense convs faster in NCHW, the depthwise faster in NHWC: one region, no flip-flopping."""
    graph = fused(chain_model())
    rep = profiled(graph, candidates(dw=(0.010, 0.0095), dense=(0.010, 0.011)))
    assert chosen(graph) == [("direct", NCHW)] * 3
    assert rep.conversions == [] and rep.layout_summary == "layout: no layout conversions remain"


def dense_chain_model() -> onnx.ModelProto:
    """x -> three 3x3 Conv+Relu -> GlobalAveragePool -> Flatten."""
    g = G(opset=17)
    t = g.input("x", [1, 32, 28, 28])
    for i in range(3):
        t = g.op("Relu", [_conv(g, t, 32, 32, 3, name=f"c{i}")])
    g.output(g.op("Flatten", [g.op("GlobalAveragePool", [t])]))
    return g.model()


def test_a_region_that_pays_only_as_a_whole_is_found():
    """Each conv is a little faster in NHWC, less than a conversion: greedy from the NCHW input keeps
    NCHW and no single change helps, yet the three together save more than the one conversion."""
    graph = fused(dense_chain_model())
    gain = 0.6 * CONV
    rep = profiled(graph, candidates(dw=(1.0, 1.0), dense=(0.010, 0.010 - gain)))
    assert chosen(graph) == [("cudnn", NHWC)] * 3
    assert edges(rep) == [("x", "", cbr_nodes(graph)[0].name, NCHW, NHWC)]


def test_a_region_that_does_not_pay_stays_nchw():
    graph = fused(dense_chain_model())
    rep = profiled(graph, candidates(dw=(1.0, 1.0), dense=(0.010, 0.010 - 0.3 * CONV)))
    assert chosen(graph) == [("direct", NCHW)] * 3 and rep.conversions == []


# --------------------------------------------------------------------------- residual, pooling, Add


def test_pooling_and_residual_stay_in_the_region():
    graph = fused(residual_model())
    rep = profiled(graph, candidates(dw=(1.0, 1.0), dense=(0.02, 0.01)))
    assert [layout for _, layout in chosen(graph)] == [NHWC] * 5
    stem = cbr_nodes(graph)[0]
    out = graph.outputs[0]
    # MaxPool, the residual input R and the joining Add follow the region: only its two edges convert
    assert edges(rep) == [("x", "", stem.name, NCHW, NHWC), (out, "join", "", NHWC, NCHW)]
    assert rep.conversions[0]["shape"] == [1, 16, 16, 16] and rep.conversions[1]["shape"] == [1, 32, 8, 8]


def test_an_add_of_two_layouts_converts_one_operand():
    graph = fused(residual_model())
    right = cbr_nodes(graph)[-1]

    def make(sig):  # every conv NHWC except the right branch's 3x3 (no residual input): NCHW only
        if sig.input_shapes[1] == (32, 32, 3, 3) and len(sig.input_shapes) == 3:
            return [LayoutCand("direct", (("ms", 0.001),))]
        return [LayoutCand("direct", (("ms", 0.5),)), LayoutCand("cudnn", (("ms", 0.01),))]

    rep = profiled(graph, make)
    assert chosen(graph)[-1] == ("direct", NCHW)
    join = [e for e in edges(rep) if e[2] == "join"]
    assert join == [(right.outputs[0], right.name, "join", NCHW, NHWC)]  # the Add runs in its first operand's layout


# --------------------------------------------------------------------------- the file


def test_recorded_attributes_are_deterministic():
    model = chain_model()
    outs = []
    for _ in range(2):
        graph = fused(model)
        profiled(graph, candidates(dw=(0.010, 0.011)))
        outs.append(attach_functions(to_model(graph)).SerializeToString())
    assert outs[0] == outs[1]
    assert b"lowering_layout" in outs[0]


def test_optimized_file_runs_in_onnxruntime_and_matches():
    model = residual_model()
    graph = fused(model)
    profiled(graph, candidates(dw=(1.0, 1.0)))
    opt = attach_functions(to_model(graph))
    onnx.checker.check_model(opt)
    assert all(n.op_type != "CBR" or any(a.name == LAYOUT_ATTR for a in n.attribute) for n in opt.graph.node)
    f = feeds(model)
    for got, want in zip(run_ort(opt, f), run_ort(model, f)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_layout_attribute_is_not_part_of_the_signature_and_stale_ones_go():
    graph = fused(chain_model())
    profiled(graph, candidates(dw=(0.010, 0.011)))
    sig_before = [n.attrs_dict() for n in cbr_nodes(graph)]
    for n in cbr_nodes(graph):
        n.set_attr(LAYOUT_ATTR, "bogus")
    rep = profiled(graph, candidates(dw=(0.010, 0.011)))
    assert [n.attrs_dict() for n in cbr_nodes(graph)] == sig_before
    assert "lowering_layout" not in rep.rows[0].signature


def test_heuristic_path_records_layouts_and_writes_a_valid_model():
    graph = fused(residual_model())
    rep = select_lowerings(graph, "a100", devices=[])
    assert rep.mode == "heuristic"
    assert all(layout in (NCHW, NHWC) for _, layout in chosen(graph))
    onnx.checker.check_model(attach_functions(to_model(graph)))
    assert rep.layout_summary.startswith("layout:")


def test_cli_heuristic_writes_a_valid_model_and_explains_the_conversions(tmp_path):
    src = tmp_path / "m.onnx"
    model = residual_model()
    onnx.save(model, src)
    r = run_graphopt("optimize", src, "--gpu", "a100", "--precision", "fp16", "--explain",
                     "--report", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    out = onnx.load(tmp_path / "m.opt.onnx")
    onnx.checker.check_model(out)
    layouts = [helper.get_attribute_value(a).decode() for n in out.graph.node if n.op_type == "CBR"
               for a in n.attribute if a.name == LAYOUT_ATTR]
    assert len(layouts) == 5 and set(layouts) <= {NCHW, NHWC}
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    assert report["layout_summary"] in r.stdout
    for c in report["layout_conversions"]:
        assert f"{c['from']} -> {c['to']}" in r.stdout
    assert src.read_bytes() == model.SerializeToString()  # the input is not modified
    again = run_graphopt("optimize", src, "-o", tmp_path / "again.onnx", "--gpu", "a100", "--precision", "fp16")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again.onnx").read_bytes() == (tmp_path / "m.opt.onnx").read_bytes()


def test_cli_fp32_heuristic_model_matches_onnxruntime(tmp_path):
    src = tmp_path / "m.onnx"
    model = chain_model()
    onnx.save(model, src)
    r = run_graphopt("optimize", src, "--gpu", "a100")
    assert r.returncode == 0, r.stderr
    out = onnx.load(tmp_path / "m.opt.onnx")
    f = feeds(model)
    for got, want in zip(run_ort(out, f), run_ort(model, f)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- the model itself


def test_conversion_cost_and_significance():
    assert not significant((8, 512))  # rank 2
    assert not significant((8, 512, 1, 1))  # one spatial position: the same memory either way
    assert not significant((8, 1, 32, 32))  # one channel
    assert significant((8, 16, 4, 4)) and significant(None)
    assert conversion_ms((8, 512, 1, 1), 2) == 0.0
    big, small = conversion_ms((32, 64, 112, 112), 2), conversion_ms((1, 64, 112, 112), 2)
    assert big > 5 * small > 0  # the bytes dominate at bs32
    assert conversion_ms((1, 64, 112, 112), 4) > small


def _graph(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                          initializer=list(inits))
    return from_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_an_op_that_reads_nchw_ends_the_region():
    """Reshape of a 4-D NHWC tensor needs it in NCHW (a real transpose): counted; Relu is not."""
    shape = [1, 8, 4, 4]
    graph = _graph([helper.make_node("Relu", ["x"], ["a"], name="conv1"),  # stands in for a custom node
                    helper.make_node("Relu", ["a"], ["b"], name="relu"),
                    helper.make_node("Reshape", ["b", "s"], ["y"], name="reshape")],
                   [("x", shape)], [("y", [1, 128])], [onnx.numpy_helper.from_array(np.array([1, 128]), "s")])
    opts = {"conv1": [Option("cudnn", "cudnn", "", 0.001, ("NHWC", "NHWC"))]}
    plan = solve_graph(graph, opts, lambda t: tuple(shape) if t in ("x", "a", "b") else (1, 128))
    assert [(c.tensor, c.consumer, c.src, c.dst) for c in plan.conversions] == [
        ("x", "conv1", NCHW, NHWC), ("b", "reshape", NHWC, NCHW)]
    assert plan.total_ms == pytest.approx(0.001 + 2 * conversion_ms(shape, 4))


def test_vendor_candidates_declare_their_layouts_without_a_gpu():
    from graphopt.kernels.registry import candidate_from_key, signature_of

    sig = signature_of("CBR", [(1, 32, 8, 8), (32, 32, 1, 1), (32,), None], ["float16"] * 3 + [""],
                       {"kernel_shape": [1, 1], "activation": "Relu"})
    assert candidate_from_key("CBR", "cudnn").layouts(sig) == ("NHWC", "NHWC", "NHWC", "NHWC", "NHWC")
    assert candidate_from_key("CBR", "cublaslt").layouts(sig)[0] == "NHWC"
    assert candidate_from_key("CBR", "direct:opt=1").layouts(sig) == ()  # own kernels: NCHW
    assert candidate_from_key("CBR", "cudnn_nchw:plan=eng1").layouts(sig) == ("NCHW",) * 5


def test_each_consumer_in_another_layout_converts_and_a_graph_output_reads_nchw():
    """One NHWC tensor read by an NHWC node, an NCHW node and the graph's output: two conversions."""
    shape = [1, 8, 4, 4]
    graph = _graph([helper.make_node("Relu", ["x"], ["t"], name="a"),
                    helper.make_node("Relu", ["t"], ["u"], name="nhwc_user"),
                    helper.make_node("Relu", ["t"], ["v"], name="nchw_user")],
                   [("x", shape)], [("t", shape), ("u", shape), ("v", shape)])
    nhwc = ("NHWC", "NHWC")
    opts = {"a": [Option("cudnn", "cudnn", "", 0.001, nhwc)], "nhwc_user": [Option("cudnn", "cudnn", "", 0.001, nhwc)],
            "nchw_user": [Option("direct", "direct", "", 0.001, ())]}
    plan = solve_graph(graph, opts, lambda t: tuple(shape))
    assert [(c.tensor, c.producer, c.consumer, c.src, c.dst) for c in plan.conversions] == [
        ("x", "", "a", NCHW, NHWC), ("t", "a", "nchw_user", NHWC, NCHW),
        ("t", "a", "", NHWC, NCHW), ("u", "nhwc_user", "", NHWC, NCHW)]


def test_a_model_without_cnn_nodes_has_no_layout_line():
    g = G(opset=17)
    x = g.input("x", [4, 16])
    g.output(g.op("Relu", [g.op("Add", [g.op("MatMul", [x, g.rand([16, 8])]), g.rand([8], "b")])]))
    graph = fused(g.model())
    rep = select_lowerings(graph, "a100", devices=[])
    assert any(r.op == "GemmAct" for r in rep.rows)
    assert rep.layout_summary == "" and rep.conversions == [] and all(r.layout == "" for r in rep.rows)
    assert not any(n.attr(LAYOUT_ATTR) for n in graph.nodes())


@pytest.mark.parametrize("b_is_constant", [True, False])
def test_a_weight_layout_is_chosen_for_a_constant_and_never_for_an_activation(b_is_constant):
    """cublaslt_bt declares B ``colmajor``: fine for a weight (converted once when the plan is built),
    refused for an activation (a transpose on every run), even when it is the fastest option."""
    w = onnx.numpy_helper.from_array(np.ones((16, 33), np.float32), "w")
    graph = _graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],  # stands in for a GemmAct
                   [("x", [8, 16])] + ([] if b_is_constant else [("w", [16, 33])]), [("y", [8, 33])],
                   [w] if b_is_constant else [])
    bt = Option("cublaslt_bt", "cublaslt_bt", "", 0.001, ("", "colmajor"))
    plain = Option("cublaslt", "cublaslt", "", 0.01, ())
    plan = solve_graph(graph, {"mm": [bt, plain]}, lambda t: {"x": (8, 16), "w": (16, 33), "y": (8, 33)}[t])
    assert plan.choice["mm"] is (bt if b_is_constant else plain)
    assert plan.conversions == []
    assert candidate_key_layouts("cublaslt_bt") == ("", "colmajor")
    assert candidate_key_layouts("cublaslt_pad") == ("", "colmajor")  # B as cublaslt_bt stores it
    assert candidate_key_layouts("cublaslt_pad", trans_b=True) == ()  # B already rows K apart: as given


def candidate_key_layouts(key, trans_b=False):
    from graphopt.kernels.registry import candidate_from_key, signature_of

    if trans_b:
        sig = signature_of("GemmAct", [(8, 16), (33, 16)], ["float16", "float16"], {"mode": "gemm", "transB": 1})
    else:
        sig = signature_of("GemmAct", [(8, 16), (16, 33)], ["float16", "float16"], {"mode": "matmul"})
    return candidate_from_key("GemmAct", key).layouts(sig)


class StemLikeCand(LayoutCand):
    """A fake lowering that reads X in NCHW and writes Y in NHWC (as the ``stem`` family's ``y=nhwc``)."""

    def layouts(self, sig):
        return ("NCHW", "NCHW", "NHWC", "NHWC", "NHWC") if self.name == "stem" else super().layouts(sig)


def test_a_node_that_reads_nchw_and_writes_nhwc_removes_the_input_conversion():
    """The chain's first conv with a stem-like option (NCHW in, NHWC out, a little slower than cuDNN's
    NHWC plan): taking it saves the graph input's conversion, so the whole graph has none. Near miss:
    slower than cuDNN by more than that conversion, cuDNN stays and the input is converted."""
    for extra, want, conversions in ((0.5, "stem", 0), (1.5, "cudnn", 1)):
        graph = fused(chain_model())
        c1 = cbr_nodes(graph)[0]

        def make(sig, extra=extra):
            cands = [StemLikeCand("cudnn", (("ms", 0.010),)), StemLikeCand("direct", (("ms", 0.050),))]
            if sig.attr("group", 1) == 1 and sig.input_shapes[0] == (1, 32, 28, 28) and sig.attr("kernel_shape") == (1, 1):
                cands.append(StemLikeCand("stem", (("ms", 0.010 + extra * CONV),)))
            return cands

        rep = profiled(graph, make)
        assert c1.attr("lowering") == want and c1.attr(LAYOUT_ATTR) == NHWC
        assert len(rep.conversions) == conversions, edges(rep)
