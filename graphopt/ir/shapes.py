"""``refine_shapes``: run onnx shape inference (with data propagation) on the IR again and take in
what it now proves, so that folding a Shape makes the shapes behind it static too."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from graphopt.ir.convert import to_model
from graphopt.ir.graph import Graph
from graphopt.ir.values import value_info_of_type
from graphopt.ir.large import WEIGHTLESS_ABOVE, WeightlessInitializers, raw_length, small_bytes, weightless


def infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx shape inference with data propagation; best effort (a failure returns ``model``). A model
    with more than ``WEIGHTLESS_ABOVE`` bytes of weights is inferred from its weightless copy
    (``graphopt.ir.large``): onnx serializes the model it is given, which cost GPT-2 124M 7.8 s here
    (3.5 s of it serializing 650 MB of weights that inference never reads). The result is then that
    copy, inferred: read its ``value_info``, not its weights."""
    try:
        data = small_bytes(model, WEIGHTLESS_ABOVE)  # the size check's encoding is what onnx is handed
        model_in = weightless(model)[0] if data is None else data
        return onnx.shape_inference.infer_shapes(model_in, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # shape inference is an aid, never a reason to refuse a valid model
        return model


def inference_model(graph: Graph) -> onnx.ModelProto:
    """``to_model(graph)`` for shape inference: with more than ``WEIGHTLESS_ABOVE`` bytes of weights,
    built weightless from the IR (``infer`` would make that copy anyway; built here, no weight is
    copied: GPT-2 124M's 650 MB took 0.9 s a call to copy into the model first)."""
    big = sum(raw_length(graph.initializer(n)) for n in graph.initializer_names()) >= WEIGHTLESS_ABOVE
    return to_model(graph, WeightlessInitializers() if big else None)


def with_values(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> int:
    """Turn the main-graph nodes whose every output has a value in ``values`` into initializers, in
    place (``model`` is the caller's own copy); returns the number of nodes replaced. A tensor whose
    producer also makes a tensor without a value stays computed."""
    drop = [k for k, n in enumerate(model.graph.node) if any(n.output) and all(o in values for o in n.output if o)]
    names = [o for k in drop for o in model.graph.node[k].output if o]
    for k in reversed(drop):
        del model.graph.node[k]
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(values[o]), o) for o in names)
    return len(drop)


def refine_shapes(graph: Graph, inferred: onnx.ModelProto | None = None) -> int:
    """Infer the root graph's shapes again and record every tensor whose inferred shape is more
    static than what the IR has (a new entry, or a known dim where it had a symbol or nothing).
    Returns the number of tensors whose value_info was added or made more static.

    ``inferred``: the result of ``infer`` on the model ``graph`` was just built from (the caller
    has it already), instead of inferring ``to_model(graph)`` once more."""
    if inferred is None:
        model = inference_model(graph)
        inferred = infer(model)
        if inferred.graph.value_info == model.graph.value_info:
            # The model's value_info is the IR's own entries: inference proved nothing new (on the
            # 20k-node GPT-2, every time). One comparison in C instead of the loop over 11,829 entries.
            return 0
    changed = 0
    for vi in inferred.graph.value_info:
        t = vi.type  # read once: upb makes a new object on every read (20k entries)
        known = graph.value_info_proto(vi.name)
        if known is not None and known.type == t:
            continue  # what the IR has already (most tensors): nothing to convert or compare
        if not t.HasField("tensor_type") or not t.tensor_type.elem_type or not t.tensor_type.HasField("shape"):
            continue  # inference proved no dtype or no shape
        old = graph.value_info(vi.name)
        if old.shape is not None and _known(old.shape) >= _known(value_info_of_type(t).shape):
            continue  # (a tensor the IR knows nothing of takes the inferred entry without converting it)
        if graph.refine_value_info(vi):
            changed += 1
    return changed


def _known(shape) -> int:
    return sum(1 for d in shape if isinstance(d, int) and d >= 0)
