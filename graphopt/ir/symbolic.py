"""``proven_shape``: a tensor's dims where onnx's shape inference left some unknown (fresh ``unk__N`` names,
or no dim at all), filled in with what onnxruntime's symbolic shape inference proves, for the fusion rules'
proofs (the causal mask's lengths, a residual's dims).

onnx's inference gives a tensor whose shape is computed at run time (a Reshape's target made of
``Shape -> Gather -> Concat``, a Range's bound, the ``Where(Equal(shape, -1), 1, shape)`` of a TorchScript
``expand``) fresh names that say nothing about the inputs' dims. onnxruntime's ``SymbolicShapeInference`` (the
pass its transformer optimizer runs) evaluates that arithmetic with sympy over the input dims' names, and
without ``auto_merge`` it never assumes two dims equal. Only what it proves is taken: an int, or a name that
is a dim of a graph input (not its own fresh names, nor expressions such as ``seq + 1``), and only where the
IR's dim is unknown; a tensor whose rank or known dims disagree with the IR keeps what the IR has. Without
sympy, or when the inference fails, nothing is proven: inference is an aid, never a reason to refuse a model.

It costs about 50 us a node (1.2 s on the 20k-node GPT-2, whose proofs never need it), so it runs only when a
proof asks (``proven_shape``), on the graph as the cleanup left it: ``SymbolicDims`` forks a child holding that
graph before the rules start (``graphopt.ir.ahead.Forked``), which computes when first asked; where no child can
be forked it runs in-process before the rules. Once a proof has asked, the answer goes into the IR's value_info
after the rules (``SymbolicDims.record``), so the tuner's signatures see the dims the proofs relied on. A tensor a
rule created after the start is not in the answer: its IR shape is what ``proven_shape`` gives.

onnxruntime's public driver (``infer_shapes``) saves the half-inferred model into the working directory when
any shape stays unknown (most real exports), so the three steps it runs are called here directly.
"""

from __future__ import annotations

import json
import os
import weakref

import onnx

from graphopt.ir.ahead import Forked
from graphopt.ir.graph import Graph
from graphopt.ir.shapes import inference_model

INT_MAX = 2**31 - 1
_ACTIVE: "weakref.WeakKeyDictionary[Graph, SymbolicDims]" = weakref.WeakKeyDictionary()


def _unknown(d) -> bool:
    return d is None or isinstance(d, str) and d.startswith("unk__")


def needs_refining(graph: Graph) -> bool:
    """Whether a root-graph tensor has a dim onnx's inference left unknown."""
    for name in graph.value_info_names():
        shape = graph.shape(name)
        if shape is not None and any(_unknown(d) for d in shape):
            return True
    return False


def symbolic_inference(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` with the value_info onnxruntime's symbolic inference proves (partial where some shapes
    stay unknown), or None (no sympy, an onnxruntime without the tool, or the inference failed)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:  # sympy or the tool missing
        return None
    try:
        sym = SymbolicShapeInference(INT_MAX, False, False, 0)  # int_max, auto_merge, guess_output_rank, verbose
        sym._preprocess(model)
        while sym.run_:
            sym._infer_impl()
        sym._update_output_from_vi()
        return sym.out_mp_
    except Exception:  # noqa: BLE001 - an op it does not know, a version whose internals differ
        return None


def proven_dims(graph: Graph, inferred: onnx.ModelProto | None) -> dict[str, list]:
    """{tensor: dims} for every root-graph tensor whose IR dims have an unknown one that ``inferred`` (a
    symbolic inference of ``graph``) proves: an int, or a graph input's dim name."""
    if inferred is None:
        return {}
    names = {d for t in graph.inputs for d in graph.shape(t) or () if isinstance(d, str) and not _unknown(d)}
    proven = {}
    for vi in inferred.graph.value_info:
        old = graph.shape(vi.name)
        if old is None or not any(_unknown(d) for d in old) or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims) != len(old):
            continue
        new = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]
        if any(not _unknown(o) and o != n for o, n in zip(old, new)):
            continue  # it disagrees with what the IR knows: keep the IR's
        merged = [n if _unknown(o) and (isinstance(n, int) and n >= 0 or n in names) else o for o, n in zip(old, new)]
        if merged != list(old):
            proven[vi.name] = merged
    return proven


def _computed(graph: Graph) -> dict[str, list]:
    return proven_dims(graph, symbolic_inference(inference_model(graph)))


def _computed_when_asked(graph: Graph, go: int, unused: int) -> bytes:
    """In the child: wait until the parent asks (a byte on ``go``), then compute; a parent that closes ``go``
    without asking gets nothing computed (the child leaves at once)."""
    os.close(unused)  # the parent's end: EOF on ``go`` once the parent closes its copy
    if not os.read(go, 1):
        return b""
    return json.dumps(_computed(graph)).encode()


class SymbolicDims:
    """The symbolic dims of one graph as ``start`` found it, computed on first use (``dims``).

    ``start`` forks a child that holds the graph as it is then (copy-on-write: nothing is copied) and waits;
    the first ``dims`` call wakes it and reads its answer. So a run whose proofs never ask pays a fork, and one
    that asks gets the answer for the graph before the rules changed it, either way. Where no child can be
    forked, ``start`` computes it in-process."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._child = Forked()
        self._go: int | None = None
        self._dims: dict[str, list] | None = None
        self._asked = False  # whether a proof asked: only then is the answer recorded, by either route

    def start(self) -> None:
        if not needs_refining(self.graph):
            self._dims = {}
            return
        go, ask = os.pipe()
        if self._child.fork(lambda: _computed_when_asked(self.graph, go, ask)):
            self._go = ask
        else:
            os.close(ask)
            self._dims = _computed(self.graph)  # no safe fork here: now, before the rules change the graph
        os.close(go)

    def dims(self) -> dict[str, list]:
        self._asked = True
        if self._dims is None:
            data = None
            try:
                os.write(self._go, b"g")
                data = self._child.answer()
            except OSError:  # the child is gone: nothing proven
                pass
            self._close_go()
            try:
                self._dims = json.loads(data) if data else {}
            except ValueError:
                self._dims = {}
        return self._dims

    def _close_go(self) -> None:
        if self._go is not None:
            os.close(self._go)
            self._go = None

    def close(self) -> None:
        self._close_go()  # a waiting child sees EOF and leaves
        self._child.cancel()

    def record(self) -> int:
        """Once a proof asked, give the graph's value_info what was proven of the tensors still in it, so that
        what comes after the rules (the tuner's signatures) sees the dims the rules' proofs relied on. Returns the
        number of tensors recorded; none when no proof asked (nothing was computed)."""
        g, count = self.graph, 0
        for name, dims in (self._dims if self._asked else {}).items():
            old = g.shape(name)
            if old is not None and len(old) == len(dims) and any(_unknown(d) for d in old) and g.defines(name):
                g.set_value_info(name, g.dtype(name), [n if _unknown(o) else o for o, n in zip(old, dims)])
                count += 1
        return count


class symbolic_dims_ahead:
    """``with symbolic_dims_ahead(graph):`` the rules' proofs on ``graph`` read ``proven_shape``'s answers."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.dims = SymbolicDims(graph)

    def __enter__(self) -> SymbolicDims:
        self.dims.start()
        _ACTIVE[self.graph] = self.dims
        return self.dims

    def __exit__(self, *exc) -> None:
        _ACTIVE.pop(self.graph, None)
        self.dims.close()
        if exc[0] is None:
            self.dims.record()


def proven_shape(g: Graph, tensor: str) -> tuple | None:
    """``g.shape(tensor)``, with the dims onnx left unknown that symbolic inference proves (inside
    ``symbolic_dims_ahead``; elsewhere, or for a tensor of a subgraph, the IR's shape as it is)."""
    shape = g.shape(tensor)
    if shape is None or not any(_unknown(d) for d in shape) or g.parent is not None:
        return shape
    active = _ACTIVE.get(g)
    proven = active.dims().get(tensor) if active is not None else None
    return tuple(proven) if proven is not None and len(proven) == len(shape) else shape
