"""Types for the tensors a rule's replacement makes with standard ONNX ops (the nested helpers of a
replacement, e.g. ``Slice(Shape(x), ...)``), which have no value_info of their own."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference


def type_standard_outputs(g, nodes) -> None:
    """Type the outputs of new standard-domain nodes that have no value_info (the nested helpers of a
    replacement, e.g. ``Slice(Shape(x), ...)``) by ONNX's inference of that one node: the types a later
    whole-model inference gives them, so optimizing the output again changes nothing. Why not the
    whole model: that is seconds on a 20k-node export, this is one node. Untyped where ONNX cannot say."""
    for node in nodes:
        if node.domain not in ("", "ai.onnx") or all(not t or g.value_info_proto(t) is not None for t in node.outputs):
            continue
        types, data = {}, {}
        for t in node.inputs:
            if not t or t in types:
                continue
            vi = g.value_info(t)
            if vi.dtype is None:
                break
            types[t] = helper.make_tensor_type_proto(vi.dtype, vi.shape)
            value = g.constant_value(t) if g.is_initializer(t) and vi.shape is not None and len(vi.shape) <= 1 else None
            if value is not None:
                data[t] = numpy_helper.from_array(np.asarray(value), t)
        else:
            try:
                schema = onnx.defs.get_schema(node.op_type, g.root.opset.get("", onnx.defs.onnx_opset_version()), "")
                proto = helper.make_node(node.op_type, list(node.inputs), list(node.outputs), **node.attrs_dict())
                inferred = shape_inference.infer_node_outputs(schema, proto, types, data)
            except Exception:  # noqa: BLE001 - no schema, or inference refuses: leave the tensor untyped
                continue
            g.merge_value_info(helper.make_value_info(name, tp) for name, tp in inferred.items())
