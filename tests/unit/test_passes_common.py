"""Shared helpers for the cleanup-pass tests (no tests here).

Each test builds a small model with ``onnx.helper``, runs a pass on the IR, and checks that the
graph lints, the saved model passes the full ONNX checker, onnxruntime gives the same outputs as
the original on random inputs, and a second run of the pass changes nothing.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graphopt.ir import from_model, to_model

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17, value_info=()):
    """A ModelProto from helper-made nodes; ``inputs``/``outputs`` are (name, shape[, elem]) tuples
    or ValueInfoProtos; ``inits`` is a dict or list of (name, array)."""

    def vi(spec):
        if isinstance(spec, onnx.ValueInfoProto):
            return spec
        name, shape, *elem = spec
        return helper.make_tensor_value_info(name, elem[0] if elem else F, shape)

    items = inits.items() if isinstance(inits, dict) else inits
    graph = helper.make_graph(
        nodes,
        "test",
        [vi(s) for s in inputs],
        [vi(s) for s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in items],
        value_info=[vi(s) for s in value_info],
    )
    opsets = [helper.make_opsetid("", opset)]
    m = helper.make_model(graph, opset_imports=opsets, ir_version=max(4, helper.find_min_ir_version_for(opsets)))
    if any(not isinstance(s, onnx.ValueInfoProto) and s[1] is None for s in outputs):
        # Outputs given with shape None get their type from ONNX shape inference.
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
        for out in m.graph.output:
            if not out.type.tensor_type.HasField("shape") and out.name in known:
                out.type.CopyFrom(known[out.name].type)
    return m


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def run(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def feeds_for(m: onnx.ModelProto, rng=None) -> dict:
    """Random float32 (or bool False) values for every graph input that is not an initializer."""
    rng = rng if rng is not None else np.random.default_rng(0)
    inits = {t.name for t in m.graph.initializer}
    out = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        if tt.elem_type == TensorProto.BOOL:
            out[vi.name] = np.zeros(shape, dtype=bool)
        else:
            out[vi.name] = rand(rng, *shape)
    return out


def check_pass(pass_fn, m: onnx.ModelProto, expected: int | None = None, *, rng=None, rtol=1e-5, atol=1e-5, feeds=None, **kwargs):
    """Run ``pass_fn`` on ``m``; assert it made ``expected`` changes (at least one when None), the
    result lints and passes the full checker, outputs (names and values) equal the original's, and
    a second run changes nothing. Returns (graph, optimized ModelProto)."""
    g = from_model(m)
    changes = pass_fn(g, **kwargs)
    if expected is None:
        assert changes >= 1
    else:
        assert changes == expected, f"{pass_fn.__name__} made {changes} changes, expected {expected}"
    g.lint()
    out = to_model(g)
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == [o.name for o in m.graph.output]
    feeds = feeds if feeds is not None else feeds_for(m, rng)
    for a, b in zip(run(m, feeds), run(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)
    again = from_model(out)
    assert pass_fn(again, **kwargs) == 0, f"{pass_fn.__name__} is not idempotent"
    return g, out


def untouched(pass_fn, m: onnx.ModelProto, **kwargs) -> list[str]:
    """Assert ``pass_fn`` changes nothing on ``m`` (same serialized model) and return the traced reasons."""
    g = from_model(m)
    before = to_model(g).SerializeToString()
    reasons: list[str] = []
    assert pass_fn(g, trace=lambda p, n, r: reasons.append(r), **kwargs) == 0
    assert to_model(g).SerializeToString() == before
    return reasons


def load(m: onnx.ModelProto):
    return from_model(m)


def ops(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in m.graph.node]
