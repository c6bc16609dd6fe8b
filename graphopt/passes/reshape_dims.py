"""``infer_reshape_dims``: the dims onnx's shape inference leaves unknown on a Reshape whose target is
computed at run time, where they follow from the target's entries.

TorchScript exports of the LLaMA family split the heads as ``x.view(*input_shape, -1, head_dim)``: the
target is ``Concat(Unsqueeze(Gather(Shape(h), 0)), Unsqueeze(Gather(Shape(h), 1)), [-1], [16])`` and x is
``[batch, seq, 32]``. onnx names the output's dims afresh (``[batch, seq, unk__8, 16]``, or all four
unknown), so the head count, 32 / 16 = 2, is lost, and with it every proof that reads it downstream
(the grouped-query rule, the shape folds). Each entry is read with ``dim_source`` (a constant, or dim j of
some tensor whose size is then known by value or by name); the one ``-1`` is x's element count over the
others', where the named dims cancel (``batch`` over ``batch``) and the integers divide. Fresh ``unk__``
names never cancel: two inference runs may reuse one for different dims. The result is recorded only where
it knows more than the value_info has; the pipeline's shape refinement then carries it downstream.
"""

from __future__ import annotations

import math
from collections import Counter

from onnx import helper

from graphopt.ir import Graph
from graphopt.passes._util import Trace, report
from graphopt.rewrite.dim_sources import dim_source, entry_size, known_size

NAME = "infer_reshape_dims"


def _entry_dim(g: Graph, entry, x_shape, k: int, allowzero: int):
    """The size entry k of the target stands for (an int or a name), -1 for the free one, None if unknown."""
    if entry == 0 and not allowzero:
        return x_shape[k] if k < len(x_shape) and known_size(x_shape[k]) else None
    return -1 if entry == -1 else entry_size(g, entry)


def resolved_dims(g: Graph, node) -> tuple | str:
    """The Reshape's output dims as far as its target's entries and its input's dims prove them (ints, or
    names), else the reason."""
    out = g.shape(node.outputs[0])
    x_shape = g.shape(node.inputs[0])
    if out is None or x_shape is None or len(node.inputs) < 2:
        return "the ranks of its input and output are unknown"
    allowzero = int(node.attr("allowzero", 0))
    dims = [_entry_dim(g, dim_source(g, node.inputs[1], k), x_shape, k, allowzero) for k in range(len(out))]
    if any(d is None for d in dims):
        return "an entry of its target is not a constant or a known dim"
    free = [k for k, d in enumerate(dims) if d == -1]
    if len(free) > 1:
        return "more than one -1 in its target"
    if free:
        if not all(known_size(d) for d in x_shape):
            return "its input has dims of unknown size"
        num, den = Counter(d for d in x_shape if isinstance(d, str)), Counter(d for d in dims if isinstance(d, str))
        ints_x = math.prod(d for d in x_shape if isinstance(d, int))
        ints_t = math.prod(d for d in dims if isinstance(d, int) and d != -1)
        if num != den or ints_t == 0 or ints_x % ints_t:
            return "its -1 does not follow from the element count (named dims that do not cancel)"
        dims[free[0]] = ints_x // ints_t
    return tuple(dims)


def infer_reshape_dims(graph: Graph, *, trace: Trace = None) -> int:
    """Record every Reshape output whose dims its target proves beyond what the value_info says; returns the
    number of tensors refined."""
    changes = 0
    for g, node in graph.find("Reshape"):
        if node.op_type != "Reshape" or node.domain != "" or node not in g:
            continue
        out = g.value_info(node.outputs[0])
        if out.shape is None or all(known_size(d) for d in out.shape):
            continue
        dims = resolved_dims(g, node)
        if isinstance(dims, str):
            report(trace, NAME, node, dims)
            continue
        if any(known_size(old) and old != new for old, new in zip(out.shape, dims)):
            report(trace, NAME, node, f"its target gives {list(dims)} where the value_info has {list(out.shape)}")
            continue
        if sum(map(known_size, dims)) > sum(map(known_size, out.shape)) and out.dtype is not None:
            # a graph output keeps its declared value_info (refine_value_info says False): no change then
            changes += g.refine_value_info(helper.make_tensor_value_info(node.outputs[0], out.dtype, list(dims)))
    return changes
