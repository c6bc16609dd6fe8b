"""``refine_symbolic_dims``: the dims onnx's shape inference leaves unknown (fresh ``unk__N`` names, or no
dim at all) where onnxruntime's symbolic shape inference proves them, by value or by a graph input's dim name.

onnx's inference gives a tensor whose shape is computed at run time (a Reshape's target made of
``Shape -> Gather -> Concat``, a Range's bound, the ``Where(Equal(shape, -1), 1, shape)`` of a TorchScript
``expand``) fresh names that say nothing about the inputs' dims. onnxruntime's ``SymbolicShapeInference`` (the
pass its transformer optimizer runs) evaluates that arithmetic with sympy over the input dims' names, and
without ``auto_merge`` it never assumes two dims equal. Only what it proves is taken: an int, or a name that
is a dim of a graph input (not its own fresh names, nor expressions such as ``seq + 1``), and only where the
IR's dim is unknown; a tensor whose rank or known dims disagree with the IR keeps what the IR has. Without
sympy, or when the inference fails, nothing changes: inference is an aid, never a reason to refuse a model.

Its public driver (``infer_shapes``) saves the half-inferred model into the working directory when any shape
stays unknown (most real exports), so the three steps it runs are called here directly.
"""

from __future__ import annotations

import onnx

from graphopt.ir.graph import Graph
from graphopt.ir.shapes import inference_model

INT_MAX = 2**31 - 1


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


def _input_dim_names(graph: Graph) -> set[str]:
    names = set()
    for t in graph.inputs:
        for d in graph.shape(t) or ():
            if isinstance(d, str) and not d.startswith("unk__"):
                names.add(d)
    return names


def _proven(d, names: set[str]) -> bool:
    return isinstance(d, int) and d >= 0 or isinstance(d, str) and d in names


def refine_symbolic_dims(graph: Graph) -> int:
    """Record the dims symbolic inference proves where the root graph's value_info has them unknown; returns
    the number of tensors refined (0 when nothing is unknown, or nothing more is proven)."""
    if not needs_refining(graph):
        return 0
    inferred = symbolic_inference(inference_model(graph))
    if inferred is None:
        return 0
    names = _input_dim_names(graph)
    changed = 0
    for vi in inferred.graph.value_info:
        old = graph.shape(vi.name)
        if old is None or not any(_unknown(d) for d in old) or not vi.type.HasField("tensor_type"):
            continue
        dims = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else None
        if dims is None or len(dims) != len(old):
            continue
        new = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]
        if any(not _unknown(o) and o != n for o, n in zip(old, new)):
            continue  # it disagrees with what the IR knows: keep the IR's
        merged = [n if _unknown(o) and _proven(n, names) else o for o, n in zip(old, new)]
        if merged != list(old):
            graph.set_value_info(vi.name, graph.dtype(vi.name), merged)
            changed += 1
    return changed

