"""A custom-op node's ``Signature`` at concrete sizes: symbolic dims bound from ``--shape``, unbound
dims given documented defaults, and shapes the graph does not know inferred or propagated.

See ``graphopt.tune.select`` (the module docstring) for the rules; this module holds the steps.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from graphopt.kernels.registry import signature_of
from graphopt.lowering.contract import Signature

DOMAIN = "graphopt"
DEFAULT_DIM = 1
SEQ_DIM = 128


@functools.lru_cache(maxsize=None)  # a handful of dtypes, asked for every input of every node
def _dtype_name(dtype: int | None) -> str:
    if dtype is None:
        return "unknown"
    try:
        import numpy as np
        from onnx import helper

        return np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).name
    except Exception:  # noqa: BLE001 - a dtype NumPy has no name for
        import onnx

        return onnx.TensorProto.DataType.Name(dtype).lower()


def bind_dims_sources(graph, shapes: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, str]]:
    """Symbolic dim name -> (value, the tensor in ``shapes`` it was read off)."""
    bound: dict[str, tuple[int, str]] = {}
    for name in sorted(shapes or {}):
        concrete = [int(d) for d in shapes[name]]
        info = graph.value_info(name)
        declared = info.shape if info is not None else None
        if declared is None or len(declared) != len(concrete):
            continue
        for d, v in zip(declared, concrete):
            if isinstance(d, str) and d and d not in bound:
                bound[d] = (v, name)
    return bound


def bind_dims(graph, shapes: Mapping[str, Sequence[int]] | None) -> dict[str, int]:
    """Symbolic dim name -> value, read off the tensors in ``shapes`` whose declared dims are symbolic."""
    return {d: v for d, (v, _) in bind_dims_sources(graph, shapes).items()}


def default_dim(name: str | None) -> tuple[int, str]:
    """The documented default for an unbound dim, and why: ``SEQ_DIM`` for a name containing "seq"."""
    if isinstance(name, str) and "seq" in name.lower():
        return SEQ_DIM, "default (SEQ_DIM)"
    return DEFAULT_DIM, "default (DEFAULT_DIM)"


def _concrete(shape, dims: Mapping[str, int], notes: list[str], defaulted: dict | None = None) -> tuple[int, ...] | None:
    if shape is None:
        return None
    out = []
    for d in shape:
        if isinstance(d, int) and d >= 0:
            out.append(d)
        elif isinstance(d, str) and d in dims:
            out.append(dims[d])
        else:
            value, _ = default_dim(d)
            label = repr(d) if isinstance(d, str) and d else "unknown dim"
            note = f"{label}={value} (default)"
            if note not in notes:
                notes.append(note)
            if defaulted is not None:
                defaulted.setdefault(d if isinstance(d, str) and d else "?", value)
            out.append(value)
    return tuple(out)


def node_signature(
    graph, node, dims: Mapping[str, int] | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
    defaulted: dict | None = None,
) -> tuple[Signature, list[str]]:
    """The ``Signature`` of one custom-op node, and notes on any dims that were defaulted.

    ``graph`` is the (sub)graph holding the node; absent optional inputs get shape ``None`` and
    dtype ``""``; the ``lowering*`` attributes are left out. ``defaulted`` (when given) collects
    ``dim name -> default value`` for every dim that took a default (``"?"`` for unnamed dims).
    """
    notes: list[str] = []
    in_shapes, dtypes = [], []
    for t in node.inputs:
        if not t:
            in_shapes.append(None)
            dtypes.append("")
            continue
        info = graph.value_info(t)
        shape = tuple(shapes[t]) if shapes and t in shapes else (info.shape if info is not None else None)
        in_shapes.append(_concrete(shape, dims or {}, notes, defaulted))
        dtypes.append(_dtype_name(info.dtype if info is not None else None))
    attrs = {k: v for k, v in node.attrs_dict().items() if not k.startswith("lowering")}
    sig = signature_of(node.op_type, in_shapes, dtypes, attrs)
    return sig, notes


def custom_nodes(graph) -> list[tuple[Any, Any]]:
    return [(g, n) for g, n in graph.walk() if n.domain == DOMAIN]


def infer_missing_shapes(graph, nodes=None) -> int:
    """Run ONNX shape inference (through the custom ops' function bodies) when a custom-op input
    has no known shape; merge what it finds into ``graph``. Returns the number of value_infos added.

    Best effort: a model that shape inference cannot handle keeps the shapes it has.
    """
    nodes = custom_nodes(graph) if nodes is None else nodes
    missing = any(t and g.value_info(t).shape is None for g, n in nodes for t in n.inputs)
    if not missing or not hasattr(graph, "merge_value_info"):
        return 0
    try:
        from graphopt.ir.shapes import infer, inference_model
        from graphopt.ops import attach_functions

        inferred = infer(attach_functions(inference_model(graph))).graph  # (a big model: built weightless)
    except Exception:  # noqa: BLE001 - an aid, never a reason to fail
        return 0
    return int(graph.merge_value_info(inferred.value_info))


def propagated_shapes(graph, nodes, dims: Mapping[str, int], shapes, ahead=None) -> dict[str, tuple[int, ...]]:
    """Concrete shapes of the custom nodes' inputs at these dims, when some input dim is neither
    static nor a dim the graph inputs declare (and so bound by ``dims``); else {} (nothing to do).
    ``ahead`` (a ``graphopt.tune.shapes_ahead.ShapesAhead``) answers from the child that computed
    them while the cleanup passes and the rules ran, when it has every one of them."""
    unbound = unbound_test(graph)
    wanted = [t for g, n in nodes for t in n.inputs if t and g is graph and unbound(g.value_info(t).shape)]
    if not wanted:
        return {}
    known = ahead.lookup(dims, shapes, wanted) if ahead is not None else None
    if known is None and ahead is not None:  # a tensor a rule made (a packed Q/K/V view): from its input's
        table = ahead.known(dims, shapes)
        if table is not None:
            got = {t: table.get(t) or reshaped(graph, t, table) for t in wanted}
            known = got if all(got.values()) else None
    if known is None:  # no child computed these dims, or it left one of them unknown: here, then
        from graphopt.tune.propagate import concrete_shapes

        known = concrete_shapes(graph, dims, default_size, shapes, wanted)
    return {t: known[t] for t in wanted if t in known}


def reshaped(graph, t: str, table: Mapping[str, tuple[int, ...]]) -> tuple[int, ...] | None:
    """The static shape of ``t`` = Reshape(x, a constant target) where ``table`` has x's
    (``passes._shape_ops.reshaped_dims``: what inference of that one node gives); else None."""
    from graphopt.passes._shape_ops import reshaped_dims

    node = graph.producer(t)
    if node is None or node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or node.inputs[0] not in table:
        return None
    target = graph.constant_value(node.inputs[1])
    if target is None:
        return None
    dims = reshaped_dims(table[node.inputs[0]], np.asarray(target).reshape(-1), int(node.attr("allowzero", 0)))
    return None if dims is None else tuple(dims)


def unbound_test(graph) -> Callable[[Any], bool]:
    """``unbound(shape)``: True for a shape that is unknown or has a dim that is neither static nor a
    dim the graph inputs declare (and so bound by ``--shape`` or a default): the shapes that
    ``propagated_shapes`` looks up at concrete sizes."""
    declared = {d for name in graph.inputs for d in (graph.value_info(name).shape or ()) if isinstance(d, str)}

    def unbound(shape) -> bool:
        return shape is None or any(not (isinstance(d, int) and d >= 0) and d not in declared for d in shape)

    return unbound


def default_size(name: str | None) -> int:
    """The value an unbound dim takes at tuning sizes (``default_dim``'s, without the reason)."""
    return default_dim(name)[0]
