"""``ShapesAhead``: the tuning-size shapes (``graphopt.tune.propagate``) computed in a forked child
while the parent runs the cleanup passes and the fusion rules.

Why: on the 20k-node GPT-2 export those shapes take 0.5 s of onnx shape inference and folding (onnx
holds the GIL, so only another process overlaps them), and the parent spends about as long on the
cleanup passes and the rules, which they do not depend on. The child works on the graph as loaded:
every tensor whose shape has a dim no graph input declares is looked up at each bucket's concrete
sizes, the same ``concrete_shapes`` call lowering selection makes later on the rewritten graph,
minus its last resort (the cleanup passes on a copy, which the parent runs itself when needed).

Why the answer is the same: a tensor keeps its value, and so its shape, through cleanup and the
rules (a rewrite replaces nodes by equivalent ones; a name never changes what it holds), and a
static shape from inference at given input sizes is a fact about the tensor, whatever the graph
around it. So ``lookup`` answers only for exactly the dims and ``--shape`` values the child used, and
only when the child knows every wanted tensor; otherwise (a tensor a rule created, a shape only the
last resort finds, no child, a failed child) the caller computes in-process, as without this module.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Iterator, Mapping, Sequence

from graphopt.ir.ahead import Forked, worth_forking
from graphopt.tune.gpus import normalize_gpu_name
from graphopt.tune.propagate import concrete_shapes
from graphopt.tune.signatures import bind_dims, default_size, unbound_test

Shapes = Mapping[str, Sequence[int]]


def _shapes_key(shapes: Shapes | None) -> dict[str, list[int]]:
    return {name: [int(d) for d in dims] for name, dims in sorted((shapes or {}).items())}


def _dims_key(dims: Mapping[str, int]) -> list[list]:
    return [[name, int(v)] for name, v in sorted(dims.items())]


def unbound_tensors(graph) -> Iterator[str]:
    """The tensors the nodes of ``graph`` (not its subgraphs) make whose shape has a dim no graph input
    declares: what the child looks up (a superset of what lowering selection will want)."""
    unbound = unbound_test(graph)
    return (t for n in graph.nodes() for t in n.outputs if t and unbound(graph.value_info(t).shape))


class ShapesAhead(Forked):
    """Start with ``start(graph, gpu, shapes, profile)`` before the cleanup passes; ``lookup`` during
    lowering selection. A context manager: an answer never collected is killed and reaped."""

    def __init__(self) -> None:
        super().__init__()
        self._shapes: dict[str, list[int]] | None = None
        self._answer: list[tuple[list, dict[str, tuple[int, ...]]]] | None = None

    def start(self, graph, gpu: str, shapes: Shapes | None, profile) -> None:
        """Fork the child when lowering selection will need tuning-size shapes: a target GPU is named,
        some tensor's shape has a dim no graph input declares, and the model is small enough to fork
        beside (``worth_forking``). ``profile`` is the resolved shape profile (its buckets)."""
        try:
            if normalize_gpu_name(gpu) == "none":
                return
        except Exception:  # noqa: BLE001 -- an unknown name: lowering selection reports it
            return
        if self.running or graph.source_model is None or not worth_forking(graph.source_model):
            return
        if next(unbound_tensors(graph), None) is None:
            return
        base = bind_dims(graph, shapes)
        plans = [{**base, **bucket} for bucket in (profile.buckets() if profile is not None else []) or [{}]]

        def compute() -> bytes:  # (in the child, whose warnings would only repeat the parent's)
            warnings.simplefilter("ignore")
            wanted = list(unbound_tensors(graph))
            answer = [[_dims_key(dims), {t: list(s) for t, s in concrete_shapes(
                graph, dims, default_size, shapes, wanted, last_resort=False).items()}] for dims in plans]
            return json.dumps(answer).encode()

        if self.fork(compute):
            self._shapes = _shapes_key(shapes)

    def lookup(self, dims: Mapping[str, int], shapes: Shapes | None, wanted: Sequence[str]
               ) -> dict[str, tuple[int, ...]] | None:
        """The child's shapes of ``wanted`` at ``dims`` (and these ``--shape`` values), or None when it
        did not compute exactly these or left one of them unknown. Waits for the child the first
        time (``graphopt.ir.ahead.ANSWER_DEADLINE_S`` at most)."""
        known = self.known(dims, shapes)
        return known if known is not None and all(t in known for t in wanted) else None

    def known(self, dims: Mapping[str, int], shapes: Shapes | None) -> dict[str, tuple[int, ...]] | None:
        """Every shape the child computed at ``dims`` (and these ``--shape`` values), or None."""
        if self._answer is None:
            self._answer = self._collect()
        if self._shapes != _shapes_key(shapes):
            return None
        key = _dims_key(dims)
        return next((known for answer_dims, known in self._answer if answer_dims == key), None)

    def _collect(self) -> list[tuple[list, dict[str, tuple[int, ...]]]]:
        data = self.answer()
        try:
            parsed: Any = json.loads(data) if data is not None else []
            return [(dims, {t: tuple(int(d) for d in s) for t, s in known.items()}) for dims, known in parsed]
        except (ValueError, TypeError, AttributeError):  # cannot happen unless the pipe lied: in-process
            return []
