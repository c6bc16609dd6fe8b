"""Shared helpers for the coverage rule tests (no tests here): build fp32/fp16 graphs with
onnx.helper, run the optimize pipeline's cleanup + rules on them, and compare with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graphopt.ir import from_model, to_model
from graphopt.ops import attach_functions
from graphopt.passes import dead_code, run_cleanup
from graphopt.rewrite import apply_rules, load_rules

SHIPPED = load_rules()
NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


class G:
    """A tiny graph builder with typed inputs and deterministic names."""

    def __init__(self, opset: int = 17, seed: int = 0):
        self.opset, self.rng = opset, np.random.default_rng(seed)
        self.nodes, self.inits, self.inputs, self.outputs, self.n = [], [], [], [], 0

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def input(self, name, shape, elem=TensorProto.FLOAT):
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def const(self, value, hint="c", dtype=np.float32):
        n = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), n))
        return n

    def rand(self, shape, hint="w", dtype=np.float32, scale=0.5):
        return self.const(self.rng.standard_normal(shape) * scale, hint, dtype)

    def op(self, op_type, inputs, name=None, **attrs):
        out = self.name(op_type.lower() + "_out")
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name or self.name(op_type), **attrs))
        return out

    def output(self, t):
        self.outputs.append(t)

    def model(self):
        outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in self.outputs]
        graph = helper.make_graph(self.nodes, "test", self.inputs, outs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=10)
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        types = {vi.name: vi.type for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
        for out in m.graph.output:
            out.type.CopyFrom(types[out.name])
        onnx.checker.check_model(m, full_check=True)
        return m


def optimize(model, explain=False, rules=None):
    """Shape inference, cleanup, the rules, dead code: the pipeline's steps. Returns (graph, report)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = from_model(onnx.shape_inference.infer_shapes(m, data_prop=True))
    run_cleanup(g)
    report = apply_rules(g, rules if rules is not None else SHIPPED, explain=explain)
    dead_code(g)
    g.lint()
    return g, report


def feeds(model, seed=1):
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        if tt.elem_type == TensorProto.BOOL:
            out[vi.name] = rng.random(shape) > 0.3
        else:
            out[vi.name] = rng.standard_normal(shape).astype(NP[tt.elem_type])
    return out


def run(model, fd):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, fd)


def same_outputs(model, g, rtol=1e-4, atol=1e-5, seed=1):
    """The rewritten graph passes the full checker and computes what ``model`` did under onnxruntime."""
    out = attach_functions(to_model(g))
    onnx.checker.check_model(out, full_check=True)
    fd = feeds(model, seed)
    for e, a in zip(run(model, fd), run(out, fd)):
        assert e.shape == a.shape and e.dtype == a.dtype
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)
    return out


def ops(g) -> list[str]:
    return sorted(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in g.nodes())


def misses(report, prefix):
    return [m.reason for m in report.near_misses if m.rule.startswith(prefix)]
