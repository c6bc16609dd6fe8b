"""Constant values in the IR: what a ``Constant`` node holds (decoded, or its dtype and shape read from
the tensor's header without decoding), and ``constant_info``, the (dtype, shape) of a constant tensor
that ``Graph.constant_info`` answers without reading a weight still in its file."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from graphopt.ir.external import is_external, is_lazy
from graphopt.ir.node import Node

if TYPE_CHECKING:
    from graphopt.ir.graph import Graph


def constant_info(graph: Graph, tensor: str) -> tuple[np.dtype, tuple[int, ...]] | None:
    """(dtype, shape) of ``tensor`` when it is a constant (as ``constant_value`` decides), without
    reading a weight that is still in its file (a lazy reference: ``graphopt.ir.external``) nor
    decoding a Constant node's plain numeric ``value`` tensor."""
    g: Graph | None = graph
    while g is not None and tensor not in g._producer:
        if tensor in g._inits:
            proto = g._inits[tensor]
            if tensor in g._inputs or not is_lazy(proto):
                break
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(proto.data_type)), tuple(int(d) for d in proto.dims)
        if tensor in g._inputs:
            break
        g = g.parent
    if g is not None and tensor in g._producer:  # a Constant node's tensor: its header may answer
        info = _constant_tensor_info(g._nodes[g._producer[tensor]])
        if info is not None:
            return info
    value = graph.constant_value(tensor)
    return None if value is None else (np.asarray(value).dtype, tuple(np.shape(value)))


#: The dtype kinds ``_constant_tensor_info`` answers for: plain numeric NumPy types. Loading checks
#: such a tensor's data against its dims (``graphopt.ir.io.check_tensor``), so decoding it succeeds.
_PLAIN_KINDS = frozenset("biufc")


def _constant_tensor_info(node: Node) -> tuple[np.dtype, tuple[int, ...]] | None:
    """(dtype, shape) of a ``Constant`` node whose value ``_constant_node_value`` takes from a
    ``value`` tensor of a plain numeric type held in the model, read from the tensor's header: what
    decoding it (``numpy_helper.to_array``) gives, without decoding (``constants_to_initializers``
    asks this of every Constant: 7,350 on a 20k-node GPT-2, 0.04 s of decoding). None for anything
    else (another form, strings, exotic or external tensors): the caller decodes as before."""
    if node.op_type != "Constant" or node.domain != "":
        return None
    proto = node.attr_proto("value")  # the first form _constant_node_value looks for
    if proto is None or proto.type != onnx.AttributeProto.TENSOR or is_external(proto.t):
        return None
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(proto.t.data_type))
    except Exception:  # an unknown or undefined data type: decoding says what it says
        return None
    return (dtype, tuple(int(d) for d in proto.t.dims)) if dtype.kind in _PLAIN_KINDS else None


def _constant_node_value(node: Node) -> np.ndarray | None:
    if node.op_type != "Constant" or node.domain != "":
        return None
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if node.has_attr(key):
            v = node.attr(key)
            if key == "value_float" or key == "value_floats":
                return np.asarray(v, dtype=np.float32)
            if key == "value_int" or key == "value_ints":
                return np.asarray(v, dtype=np.int64)
            return np.asarray(v)
    return None
