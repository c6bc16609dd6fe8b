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
    decoding a plain numeric initializer or Constant node's ``value`` tensor (their headers give what
    decoding would)."""
    g: Graph | None = graph
    while g is not None and tensor not in g._producer:
        if tensor in g._inits:
            proto = g._inits[tensor]
            plain = proto.data_type in _PLAIN_DATA_TYPES and not is_external(proto)
            if tensor in g._inputs or not (is_lazy(proto) or plain):
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


def _plain_data_types() -> frozenset[int]:
    """The ``TensorProto`` data types that decode to a NumPy type of a ``_PLAIN_KINDS`` kind."""
    plain = set()
    for data_type in onnx.TensorProto.DataType.values():
        try:
            if np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).kind in _PLAIN_KINDS:
                plain.add(data_type)
        except Exception:  # UNDEFINED and types NumPy has no dtype for: never plain
            pass
    return frozenset(plain)


#: Computed once: ``plain_value_tensor`` is asked for every Constant (7,350 on a 20k-node GPT-2), and
#: building a NumPy dtype per node to read its kind cost 0.01 s of ``constants_to_initializers``.
_PLAIN_DATA_TYPES = _plain_data_types()


def plain_value_tensor(node: Node) -> onnx.TensorProto | None:
    """The ``value`` tensor of a ``Constant`` node when ``_constant_node_value`` takes its value from
    it and it is of a plain numeric type held in the model (not external): the tensor whose header
    ``_constant_tensor_info`` reads. None for anything else (another form, strings, exotic or
    external tensors): the caller decodes as before."""
    if node.op_type != "Constant" or node.domain != "":
        return None
    proto = node.attr_proto("value")  # the first form _constant_node_value looks for
    if proto is None or proto.type != onnx.AttributeProto.TENSOR:
        return None
    t = proto.t
    return t if t.data_type in _PLAIN_DATA_TYPES and not is_external(t) else None


def _constant_tensor_info(node: Node) -> tuple[np.dtype, tuple[int, ...]] | None:
    """(dtype, shape) of ``plain_value_tensor(node)``, read from the tensor's header: what decoding it
    (``numpy_helper.to_array``) gives, without decoding (7,350 Constants on a 20k-node GPT-2 cost
    0.04 s of decoding). None when there is no such tensor: the caller decodes as before."""
    t = plain_value_tensor(node)
    if t is None:
        return None
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)), tuple(int(d) for d in t.dims)


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
