"""No-op Casts go in cleanup; RMSNorm and attention absorb the fp16 -> fp32 -> fp16 precision Casts
exporters write around them; ``--explain`` names the Cast that blocked a match."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

sys.path.insert(0, str(Path(__file__).parent))
from _coverage_util import G, optimize, ops, same_outputs  # noqa: E402

from graphopt.ir import from_model  # noqa: E402
from graphopt.passes import eliminate_noop_cast  # noqa: E402

F, H = TensorProto.FLOAT, TensorProto.FLOAT16
D = 24


def rmsnorm(elem=F, up=True, down=True, w_elem=None, out_extra=False, noop_casts=False):
    """LlamaRMSNorm as exporters write it: [Cast up] Pow ReduceMean Add Sqrt Div(1,.) Mul [Cast down] Mul(w)."""
    g = G(opset=17)
    np_t = np.float16 if elem == H else np.float32
    x = g.input("x", [2, 5, D], elem)
    xf = g.op("Cast", [x], name="upcast", to=F) if up else x
    if noop_casts:  # TorchScript's float->float casts in an fp32 export
        xf = g.op("Cast", [xf], name="noop", to=F)
    var = g.op("ReduceMean", [g.op("Pow", [xf, g.const(2.0)])], axes=[-1])
    rs = g.op("Div", [g.const(1.0), g.op("Sqrt", [g.op("Add", [var, g.const(1e-6)])])])
    h = g.op("Mul", [xf, rs])
    if down:
        h = g.op("Cast", [h], name="downcast", to=elem)
    elif noop_casts:
        h = g.op("Cast", [h], name="noop2", to=F)
    w = g.rand([D], "w", dtype=np.float16 if (w_elem or elem) == H else np.float32)
    y = g.op("Mul", [w, h])
    g.output(y)
    if out_extra:
        g.output(xf)
    return g.model()


def test_noop_casts_are_removed_and_rmsnorm_fuses():
    m = rmsnorm(up=False, down=False, noop_casts=True)
    g, report = optimize(m)
    assert ops(g) == ["graphopt.RMSNorm"]
    same_outputs(m, g)


def test_noop_cast_pass_keeps_real_conversions_and_graph_output_names():
    g = G()
    x = g.input("x", [3, 4], F)
    a = g.op("Cast", [x], to=F)
    b = g.op("Cast", [g.op("Relu", [a])], to=H)
    y = g.op("Cast", [g.op("Relu", [x])], to=F)  # a graph output: the producer takes its name
    g.output(b)
    g.output(y)
    m = g.model()
    ir = from_model(onnx.shape_inference.infer_shapes(m))
    assert eliminate_noop_cast(ir) == 2
    ir.lint()
    assert [n.op_type for n in ir.nodes()].count("Cast") == 1  # the fp32 -> fp16 one
    assert eliminate_noop_cast(ir) == 0
    same_outputs(m, ir)


def test_noop_cast_with_unknown_input_type_stays():
    g = G()
    x = g.input("x", [3, 4], F)
    g.output(g.op("Cast", [x], to=F))
    m = g.model()
    ir = from_model(m)
    ir._io_info.pop("x")  # noqa: SLF001  (an input whose type the IR does not know)
    reasons = []
    assert eliminate_noop_cast(ir, trace=lambda p, n, r: reasons.append(r)) == 0
    assert "unknown" in reasons[0]


def test_fp16_rmsnorm_absorbs_its_precision_casts():
    m = rmsnorm(elem=H)
    g, report = optimize(m)
    assert ops(g) == ["graphopt.RMSNorm"], report.near_misses
    node = g.nodes()[0]
    assert node.inputs[0] == "x" and g.dtype(node.outputs[0]) in (H, None)
    same_outputs(m, g, rtol=2e-2, atol=2e-2)


def test_fp16_rmsnorm_upcast_read_elsewhere_still_fuses():
    m = rmsnorm(elem=H, out_extra=True)
    g, _ = optimize(m)
    assert sorted(ops(g)) == ["Cast", "graphopt.RMSNorm"]
    same_outputs(m, g, rtol=2e-2, atol=2e-2)


def test_fp16_rmsnorm_with_its_downcast_a_graph_output_is_refused():
    m = rmsnorm(elem=H)
    down = next(n for n in m.graph.node if n.name == "downcast").output[0]
    m.graph.output.add().CopyFrom(m.graph.output[0])
    m.graph.output[1].name = down
    g, report = optimize(m, explain=True)
    assert "graphopt.RMSNorm" not in ops(g)
    assert any("graph output" in r.reason for r in report.near_misses if r.rule.startswith("rmsnorm_cast"))
    same_outputs(m, g)


def test_rmsnorm_blocked_by_a_real_cast_names_it_in_explain():
    # An fp32 model whose norm input passes through an fp16 round trip: no rule may drop it.
    g = G(opset=17)
    x = g.input("x", [2, 5, D], F)
    xr = g.op("Cast", [g.op("Cast", [x], name="tohalf", to=H)], name="tofloat", to=F)
    var = g.op("ReduceMean", [g.op("Pow", [x, g.const(2.0)])], axes=[-1])
    h = g.op("Div", [xr, g.op("Sqrt", [g.op("Add", [var, g.const(1e-6)])])])
    g.output(g.op("Mul", [h, g.rand([D], "w")]))
    m = g.model()
    ir, report = optimize(m, explain=True)
    assert "graphopt.RMSNorm" not in ops(ir)
    reasons = [str(n) for n in report.near_misses if n.rule.startswith("rmsnorm")]
    assert any("Cast 'tofloat' (float16 -> float)" in r for r in reasons), reasons


def attention(variant="upcast", mask=True, elem=H):
    """Eager attention in fp16 with its softmax in fp32 (``variant='upcast'``) or a Cast to fp32
    before an fp32 mask (``'upmask'``)."""
    g = G(opset=17)
    np_t = np.float16 if elem == H else np.float32
    q = g.input("q", [2, 3, 5, 8], elem)
    kt = g.input("kt", [2, 3, 8, 5], elem)
    v = g.input("v", [2, 3, 5, 8], elem)
    s = g.op("Mul", [g.op("MatMul", [q, kt]), g.const(0.35, dtype=np_t)])
    if variant == "upmask":
        m = g.input("m", [2, 1, 5, 5], F)
        s = g.op("Add", [g.op("Cast", [s], name="up", to=F), m])
    else:
        if mask:
            s = g.op("Add", [s, g.input("m", [2, 1, 5, 5], elem)])
        s = g.op("Cast", [s], name="up", to=F)
    p = g.op("Cast", [g.op("Softmax", [s], axis=-1)], name="down", to=elem)
    g.output(g.op("MatMul", [p, v]))
    return g.model()


def test_fp16_attention_absorbs_softmax_precision_casts():
    for mask in (True, False):
        m = attention(mask=mask)
        g, report = optimize(m)
        assert ops(g) == ["graphopt.Attention"], report.near_misses
        same_outputs(m, g, rtol=2e-2, atol=2e-2)


def test_fp16_attention_with_fp32_mask_after_the_upcast():
    m = attention(variant="upmask")
    g, report = optimize(m)
    assert ops(g) == ["Cast", "graphopt.Attention"], report.near_misses
    same_outputs(m, g, rtol=2e-2, atol=2e-2)


def test_fp32_attention_with_noop_casts_fuses_via_cleanup():
    m = attention(elem=F)
    g, _ = optimize(m)
    assert ops(g) == ["graphopt.Attention"]
    same_outputs(m, g)


def test_attention_upcast_with_a_second_consumer_is_refused():
    m = attention()
    # the fp32 probabilities are also a graph output
    sm = next(n for n in m.graph.node if n.op_type == "Softmax")
    m.graph.output.add().CopyFrom(m.graph.output[0])
    m.graph.output[1].name = sm.output[0]
    m.graph.output[1].type.tensor_type.elem_type = F
    g, report = optimize(m, explain=True)
    assert "graphopt.Attention" not in ops(g)
    assert any("graph output" in r.reason for r in report.near_misses if r.rule.startswith("attention"))


def test_exact_round_trip_casts_go_and_lossy_ones_stay():
    g = G()
    x = g.input("x", [3, 4], H)
    up = g.op("Cast", [g.op("Relu", [x])], name="up", to=F)
    back = g.op("Cast", [up], name="back", to=H)          # fp16 -> fp32 -> fp16: exact, removed
    y = g.input("y", [3, 4], F)
    lossy = g.op("Cast", [g.op("Cast", [y], name="down", to=H)], name="up2", to=F)  # fp32 -> fp16 -> fp32 stays
    g.output(g.op("Neg", [back]))
    g.output(lossy)
    m = g.model()
    ir = from_model(onnx.shape_inference.infer_shapes(m))
    assert eliminate_noop_cast(ir) == 1
    ir.lint()
    names = [n.name for n in ir.nodes()]
    assert "back" not in names and "up" in names and {"down", "up2"} <= set(names)  # 'up' is dead code now
    same_outputs(m, ir)
