"""Evaluate one node on constant inputs, after estimating its output size (private).

Used by ``fold_constants``. The node is copied into a throwaway one-node ``ModelProto`` (the IR has no
API for a detached model; this model never becomes part of the user's graph, so the rule that only
``graphopt.ir`` builds protobufs for the graph is kept), then:

1. ``onnx.shape_inference`` with data propagation computes the output types and shapes from the
   input shapes and the small inputs' values (shapes, repeats, pads, sizes, scales, Range bounds...).
   This is the size estimate made *before* anything runs: a node whose output is not fully known,
   or exceeds the cap, is never evaluated, so a ``ConstantOfShape`` of 2**40 elements costs a few
   microseconds and no memory.
2. onnxruntime (CPU, graph optimizations off, one thread so reductions are deterministic) runs the
   node. It is chosen over ``onnx.reference`` because it is the runtime the optimized model is
   verified against (folded values equal what it would compute at run time), it is compiled and
   fast on large constants, and it is already a base dependency. ``onnx.reference.ReferenceEvaluator``
   is the fallback for ops or types that onnxruntime's CPU provider lacks.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphopt.ir import Node
from graphopt.passes._shape_ops import evaluate_shape_op

# Element types a folded value may have: plain NumPy types that both evaluators and
# numpy_helper handle exactly (no bfloat16/float8/int4/strings).
_ALLOWED = {
    onnx.TensorProto.BOOL,
    onnx.TensorProto.INT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
}
# Inputs up to this many elements are embedded as initializers (so shape inference sees their
# values); larger ones are fed at run time and described by type and shape only.
_EMBED_ELEMENTS = 4096


class NotFoldable(Exception):
    """The node cannot (or must not) be evaluated; the message is the reason."""


def _elem_type(array: np.ndarray) -> int:
    try:
        return helper.np_dtype_to_tensor_dtype(array.dtype)
    except (KeyError, TypeError, ValueError):
        raise NotFoldable(f"input dtype {array.dtype} is not foldable") from None


def _build(node: Node, values: dict[str, np.ndarray], opset: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    inputs, inits, feeds = [], [], {}
    for name, array in values.items():
        et = _elem_type(array)
        if et not in _ALLOWED:
            raise NotFoldable(f"input {name!r} has element type {onnx.TensorProto.DataType.Name(et)}")
        if array.size <= _EMBED_ELEMENTS:
            inits.append(numpy_helper.from_array(array, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, et, list(array.shape)))
            feeds[name] = array
    proto = helper.make_node(node.op_type, list(node.inputs), list(node.outputs), name=node.name, domain=node.domain)
    for attr_name in node.attr_names():
        attr = node.attr_proto(attr_name)
        if attr is None:
            raise NotFoldable(f"attribute {attr_name!r} is a subgraph")
        if attr.ref_attr_name:
            raise NotFoldable(f"attribute {attr_name!r} refers to a function attribute")
        proto.attribute.append(attr)
    outputs = [helper.make_value_info(t, onnx.TypeProto()) for t in node.outputs if t]
    graph = helper.make_graph([proto], "fold", inputs, outputs, initializer=inits)
    opset_ids = [helper.make_opsetid("", opset)]
    ir_version = max(4, helper.find_min_ir_version_for(opset_ids))
    return helper.make_model(graph, opset_imports=opset_ids, ir_version=ir_version), feeds


def _infer(model: onnx.ModelProto) -> list[tuple[int, tuple[int, ...]]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=True, data_prop=True)
    except Exception as exc:  # any inference failure means: do not fold
        raise NotFoldable(f"shape inference failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    result = []
    for vi in inferred.graph.output:
        if not vi.type.HasField("tensor_type"):
            raise NotFoldable(f"output {vi.name!r} is not a tensor")
        tt = vi.type.tensor_type
        if tt.elem_type not in _ALLOWED:
            raise NotFoldable(f"output {vi.name!r} has an unfoldable or unknown element type")
        if not tt.HasField("shape") or any(not d.HasField("dim_value") or d.dim_value < 0 for d in tt.shape.dim):
            raise NotFoldable(f"output {vi.name!r} has a shape that is not known before evaluation")
        result.append((tt.elem_type, tuple(int(d.dim_value) for d in tt.shape.dim)))
    return result


def output_bytes(types: list[tuple[int, tuple[int, ...]]]) -> int:
    """Total size in bytes of outputs with the given (element type, shape); Python ints, no overflow."""
    total = 0
    for elem_type, shape in types:
        total += math.prod(shape) * helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    return total


def _run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(None, feeds)]


def _run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


def evaluate(node: Node, values: dict[str, np.ndarray], opset: int, limit_bytes: int) -> list[np.ndarray]:
    """The values of ``node``'s non-empty outputs, given every input's value in ``values``.

    Raises ``NotFoldable`` with the reason when the output size is unknown or over ``limit_bytes``
    (checked before anything is evaluated), or when evaluation fails or disagrees with inference.
    Small integer shape arithmetic (``graphopt.passes._shape_ops``) is computed with NumPy directly.
    """
    fast = evaluate_shape_op(node, values, opset)
    if fast is not None and sum(a.nbytes for a in fast) <= limit_bytes:
        return fast
    model, feeds = _build(node, values, opset)
    types = _infer(model)
    size = output_bytes(types)
    if size > limit_bytes:
        raise NotFoldable(f"its output would take {size} bytes, over the folding limit of {limit_bytes}")
    del model.graph.output[:]
    model.graph.output.extend(
        helper.make_tensor_value_info(t, et, list(shape)) for t, (et, shape) in zip([t for t in node.outputs if t], types)
    )
    try:
        results = _run_ort(model, feeds)
    except Exception:  # onnxruntime lacks a kernel for this op/type or opset: try the reference
        try:
            results = _run_reference(model, feeds)
        except Exception as exc:
            raise NotFoldable(f"evaluation failed: {type(exc).__name__}") from None
    for result, (et, shape) in zip(results, types):
        if tuple(result.shape) != shape or helper.np_dtype_to_tensor_dtype(result.dtype) != et:
            raise NotFoldable("the evaluated output disagrees with the inferred type or shape")
    return results
