"""Helpers shared by the Conv folding passes (private)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from graphopt.ir import Graph, Node
from graphopt.passes._util import Trace, report

_FLOAT_KINDS = (np.float16, np.float32, np.float64)


def conv_constants(graph: Graph, conv: Node) -> tuple[np.ndarray, np.ndarray | None] | str:
    """The constant weight and bias (None when absent) of a standard ``Conv``, or why there are none."""
    if conv.op_type != "Conv" or conv.domain != "":
        return f"{conv.qualified_op} is not a standard Conv"
    if len(conv.inputs) < 2 or not conv.inputs[1]:
        return "the Conv has no weight input"
    w = graph.constant_value(conv.inputs[1])
    if w is None:
        return f"Conv weight {conv.inputs[1]!r} is not a constant"
    if w.dtype.type not in _FLOAT_KINDS or w.ndim < 3:
        return f"Conv weight {conv.inputs[1]!r} is not a float tensor of rank >= 3"
    b = None
    if len(conv.inputs) > 2 and conv.inputs[2]:
        b = graph.constant_value(conv.inputs[2])
        if b is None:
            return f"Conv bias {conv.inputs[2]!r} is not a constant"
        if b.shape != (w.shape[0],):
            return f"Conv bias {conv.inputs[2]!r} has shape {b.shape}, expected ({w.shape[0]},)"
    return w, b


def copied_attrs(node: Node) -> dict[str, Any]:
    """The node's attributes, copied exactly (as their protos), for a replacement node spec."""
    attrs: dict[str, Any] = {}
    for name in node.attr_names():
        proto = node.attr_proto(name)
        attrs[name] = proto if proto is not None else node.attr(name)
    return attrs


def overflows(graph: Graph, conv: Node, weight: np.ndarray, bias: np.ndarray | None) -> str | None:
    """Why the folded ``weight``/``bias`` (float64) cannot be stored in the Conv weight's dtype: a finite
    value that the cast would turn into inf. Folding it would change the model's results."""
    dtype = graph.constant_value(conv.inputs[1]).dtype
    limit = np.finfo(dtype).max
    for role, value in (("weight", weight), ("bias", bias)):
        if value is not None and np.any(np.isfinite(value) & (np.abs(value) > limit)):
            return f"the folded {role} of {conv.name!r} overflows {dtype} (values beyond {limit:.3g})"
    return None


def replace_conv(
    graph: Graph,
    conv: Node,
    absorbed: Node,
    weight: np.ndarray,
    bias: np.ndarray | None,
    *,
    pass_name: str,
) -> Node:
    """Replace ``conv`` and the node it feeds (``absorbed``) by one Conv with the new ``weight`` and
    ``bias`` (cast to the original weight's dtype), writing ``absorbed``'s first output."""
    dtype = graph.constant_value(conv.inputs[1]).dtype
    w_name = graph.add_initializer(np.ascontiguousarray(weight.astype(dtype)), name_hint=f"{conv.name}_W")
    inputs = [conv.inputs[0], w_name]
    if bias is not None:
        inputs.append(graph.add_initializer(np.ascontiguousarray(bias.astype(dtype)), name_hint=f"{conv.name}_B"))
    note = f"graphopt:{pass_name} folded {absorbed.op_type} {absorbed.name!r}"
    (new,) = graph.replace_subgraph(
        [conv, absorbed],
        [
            dict(
                op_type="Conv",
                inputs=inputs,
                outputs=[absorbed.outputs[0]],
                attrs=copied_attrs(conv),
                name=conv.name,
                doc_string=f"{conv.doc_string}\n{note}" if conv.doc_string else note,
            )
        ],
    )
    return new


def per_channel(shape: tuple[int, ...], rank: int, channels: int) -> str | None:
    """None when a constant of ``shape`` broadcast against a [N, channels, spatial...] tensor of
    ``rank`` varies along the channel axis only (or not at all) and keeps the tensor's shape."""
    if len(shape) > rank:
        return f"its rank {len(shape)} exceeds the Conv output rank {rank}"
    full = (1,) * (rank - len(shape)) + tuple(shape)
    if full[0] != 1 or any(d != 1 for d in full[2:]) or full[1] not in (1, channels):
        return f"shape {list(shape)} does not broadcast along the {channels} channels only (needs [1,{channels}{',1' * (rank - 2)}], a trailing-ones suffix of it, or a scalar)"
    return None


def channel_vector(value: np.ndarray, channels: int) -> np.ndarray:
    """A per-channel constant (checked by ``per_channel``) as a float64 vector of length ``channels``."""
    return np.broadcast_to(np.asarray(value, dtype=np.float64).reshape(-1), (channels,)).copy()


def along_channels(vector: np.ndarray, rank: int) -> np.ndarray:
    """``vector`` reshaped to multiply a Conv weight of ``rank`` along its output channels."""
    return vector.reshape((-1,) + (1,) * (rank - 1))


def fold_into_convs(graph: Graph, ops: tuple[str, ...], match: Callable[[Graph, Node], Any], name: str,
                    trace: Trace) -> int:
    """The driver of a fold into a Conv: for every standard node of ``ops``, ``match(graph, node)`` gives
    ``(conv, new_w, new_b)``, a reason it does not fold (reported) or None (not a candidate, silent);
    a fold whose values overflow the weights' dtype is reported and left. Returns the number of folds."""
    changes = 0
    for g, node in graph.find(*ops):  # through the op index, not a walk over every node
        if node.op_type not in ops or node.domain != "" or node not in g:
            continue
        found = match(g, node)
        if found is None:
            continue
        if isinstance(found, str):
            report(trace, name, node, found)
            continue
        conv, new_w, new_b = found
        reason = overflows(g, conv, new_w, new_b)
        if reason:
            report(trace, name, node, reason)
            continue
        replace_conv(g, conv, node, new_w, new_b, pass_name=name)
        changes += 1
    return changes
