"""``ShapeValues``: the values of small tensors that follow from the constants and from shapes known
elsewhere (for example inferred at concrete input sizes), without changing the graph.

``fold_shape`` and ``fold_constants`` compute the same values by rewriting the graph; this is the
read-only form, for a caller that wants a handful of values on a graph it must not touch (the
tuning-size shape propagation, ``graphopt.tune.propagate``). Only tensors of at most
``MAX_ELEMENTS`` elements whose shape is known are evaluated, so the walk up from a tensor stays in
the shape arithmetic (``Shape -> Gather -> Concat``, a Range's bounds, a causal mask's shape) and
never climbs the data path of the model.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from graphopt.ir import Graph

from graphopt.passes._evaluate import NotFoldable, evaluate
from graphopt.passes._util import opset_version
from graphopt.passes.fold_constants import DEFAULT_LIMIT_BYTES, NEVER_FOLD

#: Largest tensor (elements) evaluated: shape arithmetic, not activations.
MAX_ELEMENTS = 4096
#: Deepest chain of producers followed up from one tensor (deeper: not computed).
MAX_DEPTH = 64


class ShapeValues:
    """Values of the root graph's small tensors, given ``shapes`` (tensor -> static shape) for the
    tensors whose ``Shape``/``Size`` is read. Computed values are kept across ``update`` calls (they
    are facts); a tensor that could not be computed is tried again once more shapes are known."""

    def __init__(self, graph: Graph, shapes: Mapping[str, tuple[int, ...]]):
        self.graph = graph
        self.shapes = shapes
        self.opset = opset_version(graph)
        self.values: dict[str, np.ndarray] = {}
        self._failed: set[str] = set()

    def update(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """New known shapes: what failed before may be computable now."""
        self.shapes = shapes
        self._failed.clear()

    def small(self, tensor: str) -> bool:
        """Whether ``tensor``'s shape is known and it has at most ``MAX_ELEMENTS`` elements."""
        shape = self.shapes.get(tensor)
        return shape is not None and math.prod(shape) <= MAX_ELEMENTS

    def value(self, tensor: str, depth: int = 0) -> np.ndarray | None:
        """The value of ``tensor`` (a constant, or a small tensor computed from constants and known
        shapes), else None."""
        if tensor in self.values:
            return self.values[tensor]
        if tensor in self._failed or depth > MAX_DEPTH:
            return None
        g = self.graph
        if g.is_constant(tensor):
            return g.constant_value(tensor)
        self._failed.add(tensor)  # (also breaks a cycle; removed again on success)
        node = g.producer(tensor)
        if (node is None or not self.small(tensor) or node.domain != "" or node.op_type in NEVER_FOLD
                or node.subgraphs()):
            return None
        if node.op_type in ("Shape", "Size"):
            results = self._shape_of(node)
        else:
            ins = {}
            for t in node.inputs:
                if t:
                    ins[t] = self.value(t, depth + 1)
                    if ins[t] is None:
                        return None
            try:
                results = evaluate(node, ins, self.opset, DEFAULT_LIMIT_BYTES)
            except NotFoldable:
                return None
        if results is None:
            return None
        for name, result in zip([t for t in node.outputs if t], results):
            self.values[name] = result
            self._failed.discard(name)
        return self.values.get(tensor)

    def _shape_of(self, node) -> list[np.ndarray] | None:
        """``Shape(x)`` (with its opset-15 ``start``/``end``) or ``Size(x)`` of a tensor whose shape is known."""
        shape = self.shapes.get(node.inputs[0]) if node.inputs and node.inputs[0] else None
        if shape is None or len(node.outputs) != 1:
            return None
        if node.op_type == "Size":
            return [np.array(math.prod(shape), dtype=np.int64)]
        start, end = int(node.attr("start", 0)), node.attr("end")
        return [np.array(list(shape)[start: None if end is None else int(end)], dtype=np.int64)]
