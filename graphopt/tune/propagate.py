"""Concrete shapes at the tuning dims: the custom nodes' input shapes when the graph inputs take
the sizes tuning runs at.

A dynamic export's shape arithmetic (TorchScript's ``Shape -> Gather -> Concat -> Reshape`` head
split) leaves ONNX shape inference with fresh ``unk__N`` dims that no ``--shape`` binds; a
signature built from them would be tuned at a made-up size (attention at 1x1x1x16). With the graph
inputs fixed to the tuning sizes, data propagation computes those shapes, so each custom node's
signature carries the real sizes. Shape arithmetic that data propagation cannot follow (a causal
mask built with Range / Where / Expand) is folded on the copy: first only the small tensors feeding
the nodes whose shapes stay unknown (``_fold_breaks``), and when that leaves a wanted tensor
unknown, the whole copy with the cleanup passes. On the 20k-node GPT-2 export the first way takes
two more inferences (0.3 s) where the cleanup passes took 1.1 s (converting the copy to the IR and
folding 1,700 Shapes); both give the same shapes, the values being facts either way.
"""

from __future__ import annotations

from typing import Callable, Mapping

import onnx

from graphopt.ir.shapes import infer, with_values
from graphopt.passes.shape_values import ShapeValues

#: Rounds of ``_fold_breaks`` (fold, infer again) before the cleanup passes take over.
BREAK_ROUNDS = 8


TENSOR_REMOVING_PASSES = ("eliminate_identity_reshape", "fold_transposes", "merge_duplicates")


def concrete_shapes(graph, dims: Mapping[str, int], default: Callable[[str | None], int],
                    inputs: Mapping[str, list[int]] | None = None, wanted=(),
                    last_resort: bool = True) -> dict[str, tuple[int, ...]]:
    """Tensor name -> static shape, from shape inference (through the graphopt ops' function bodies)
    on a copy of ``graph`` whose inputs have concrete dims: ``inputs[name]`` when given, else each
    symbolic dim from ``dims``, else ``default(dim name)``. When inference alone leaves a tensor of
    ``wanted`` unknown, the copy's shape arithmetic is folded first (slower: it evaluates the
    constant subgraphs). With ``wanted``, only those tensors are looked up and returned. Without
    ``last_resort``, the cleanup passes are not run on the copy (what ``_fold_breaks`` leaves unknown
    stays so). Best effort: {} when inference fails."""
    from graphopt.ir import from_model, refine_shapes
    from graphopt.ir.shapes import inference_model
    from graphopt.ops import attach_functions
    from graphopt.passes import run_cleanup

    try:
        model = _concrete_model(graph, dims, default, inputs, weightless=True)  # inference and _fold_breaks read no weight
        inits = {t.name for t in model.graph.initializer}
        inferred = infer(model)
        only = set(wanted) or None
        out = _static(inferred, only, skip_initializers=only is not None and only.isdisjoint(inits))
        if any(t not in out for t in wanted):
            out = _fold_breaks(graph, model, inferred, only)
        if last_resort and any(t not in out for t in wanted):
            model = _concrete_model(graph, dims, default, inputs)  # (_fold_breaks changed the first copy)
            g = from_model(model)
            refine_shapes(g, inferred)  # to_model(g) is ``model`` again: its inference is at hand
            # fold what data propagation cannot follow; the passes that make a tensor read another
            # one's value instead (a wanted name would vanish) stay off
            run_cleanup(g, refine=True, max_rounds=16, disable=TENSOR_REMOVING_PASSES)
            folded = attach_functions(inference_model(g))  # only inferred
            out = _static(infer(folded), only)
    except Exception:  # noqa: BLE001 - an aid, never a reason to fail
        return {}
    return out


def _concrete_model(graph, dims: Mapping[str, int], default: Callable[[str | None], int],
                    inputs: Mapping[str, list[int]] | None, weightless: bool = False) -> onnx.ModelProto:
    """``graph`` as a model with its function bodies, every graph input at concrete dims, no value_info
    (symbolic entries would only be kept, not refined) and output shapes left to inference.
    ``weightless``: large weights as placeholders (``graphopt.ir.shapes.inference_model``), for a copy
    that is only inferred, never evaluated."""
    from graphopt.ir import to_model
    from graphopt.ir.shapes import inference_model
    from graphopt.ops import attach_functions

    model = attach_functions(inference_model(graph) if weightless else to_model(graph))
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type"):
            continue
        shape = vi.type.tensor_type.shape
        given = (inputs or {}).get(vi.name)
        if given is not None and len(given) == len(shape.dim):
            values = [int(v) for v in given]
        else:
            values = [d.dim_value if d.HasField("dim_value") else
                      int(dims.get(d.dim_param, default(d.dim_param or None))) for d in shape.dim]
        for d, v in zip(shape.dim, values):
            d.Clear()
            d.dim_value = v
    del model.graph.value_info[:]
    for out in model.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    return model


def _static(inferred: onnx.ModelProto, only: set[str] | None = None,
            skip_initializers: bool = False) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, for every tensor (of ``only``, when given) whose inferred shape is static;
    ``skip_initializers`` when the caller knows that none of ``only`` is one (no walk over the weights)."""
    out: dict[str, tuple[int, ...]] = {} if skip_initializers else {
        t.name: tuple(t.dims) for t in inferred.graph.initializer if only is None or t.name in only}
    for infos in (inferred.graph.value_info, inferred.graph.output):
        for vi in infos:  # 20k entries, three times a run: each protobuf field is read once
            name = vi.name
            if only is not None and name not in only:
                continue
            t = vi.type
            if not t.HasField("tensor_type"):
                continue
            tt = t.tensor_type
            if not tt.HasField("shape"):
                continue
            dims = []
            for d in tt.shape.dim:
                if not d.HasField("dim_value"):
                    break
                dims.append(d.dim_value)
            else:
                out[name] = tuple(dims)
    return out


def _fold_breaks(graph, model: onnx.ModelProto, inferred: onnx.ModelProto, only: set[str]) -> dict[str, tuple[int, ...]]:
    """The static shapes of ``only`` after folding, on ``model`` (the caller's copy, changed in
    place), the small computable inputs of every root node whose output shapes inference left
    unknown (a Range's bounds, an Expand's shape), then inferring again; a few rounds. ``inferred``
    is ``model`` inferred. The values come from ``graph``, whose nodes are ``model``'s."""
    known = _known(inferred)
    values = ShapeValues(graph, known)
    for _ in range(BREAK_ROUNDS):
        fold: dict[str, object] = {}
        for node in graph.nodes():
            if all(t in known for t in node.outputs if t):
                continue  # inference has its shapes: nothing blocks here
            for t in node.inputs:
                if t and t not in fold and not graph.is_constant(t) and values.small(t):
                    v = values.value(t)
                    if v is not None:
                        fold[t] = v
        # fold every output of a folded tensor's producer (its other outputs were computed with it)
        fold.update((t, v) for t, v in values.values.items() if t not in fold and _sibling_of(graph, t, fold))
        if not fold or not with_values(model, fold):
            break
        inferred = infer(model)
        known = _known(inferred)
        if all(t in known for t in only):
            break
        values.update(known)
    return {t: known[t] for t in only if t in known}


def _known(inferred: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Every static shape of the inferred model, the graph inputs' (concrete) ones too: a Shape of an input is computable."""
    out = _static(inferred)
    for vi in inferred.graph.input:
        tt = vi.type.tensor_type
        if vi.name not in out and vi.type.HasField("tensor_type") and tt.HasField("shape") and all(
                d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    return out


def _sibling_of(graph, tensor: str, fold) -> bool:
    node = graph.producer(tensor)
    return node is not None and any(o in fold for o in node.outputs if o)
