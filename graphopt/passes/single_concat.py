"""``eliminate_single_concat``: remove a ``Concat`` of one input, a copy of it.

TorchScript exports of the LLaMA family write the key/value cache update ``torch.cat([past, k], dim=-2)``
with an empty past as a Concat of ``k`` alone, one copy of K and one of V per layer (and a consumer that
keeps the attention rules from seeing the keys' producer). A Concat of one tensor along a valid axis is
that tensor; the axis is checked where the rank is known (a Concat with an axis out of range is an
invalid model, left for onnxruntime to refuse).
"""

from __future__ import annotations

from graphopt.ir import Graph

from graphopt.passes._util import Trace, bypass_each

NAME = "eliminate_single_concat"


def _single_reason(g: Graph, node) -> str | None:
    """Why this Concat is not a copy of its one input (None: it is)."""
    if len(node.inputs) != 1 or not node.inputs[0]:
        return f"a Concat of {len(node.inputs)} inputs"
    if not node.has_attr("axis"):
        return "a Concat without its axis"
    shape = g.value_info(node.inputs[0]).shape
    axis = int(node.attr("axis"))
    if shape is not None and not -len(shape) <= axis < len(shape):
        return f"axis {axis} is out of range for rank {len(shape)}"
    return None


def eliminate_single_concat(graph: Graph, *, trace: Trace = None) -> int:
    """Remove every one-input Concat; returns the number removed."""
    return bypass_each(graph, "Concat", NAME, _single_reason, trace)
