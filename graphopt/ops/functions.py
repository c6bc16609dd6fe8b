"""``attach_functions``: give every graphopt node of a model the FunctionProto it needs.

With the bodies in ``model.functions`` any ONNX runtime (stock onnxruntime included) and
``onnx.checker`` (full check, which infers shapes through the functions) accept the model.
"""

from __future__ import annotations

from typing import Iterator

import onnx
from onnx import helper

from graphopt.errors import RuleError, UnsupportedModel
from graphopt.ops.schema import DOMAIN, VERSION

# Overloaded model-local functions (NodeProto.overload) need IR version 10.
MIN_IR_VERSION = 10
# Erf, needed by Gelu bodies, exists from opset 9.
MIN_OPSET = 9
# From this opset the bodies use CastLike, so they are polymorphic and need no dtype in the key.
CASTLIKE_OPSET = 15


def _walk(graph: onnx.GraphProto) -> Iterator[tuple[onnx.GraphProto, onnx.NodeProto]]:
    """(graph, node) for ``graph`` and every nested If/Loop/Scan body, depth-first, in file order."""
    for node in graph.node:
        yield graph, node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _walk(sub)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every nested subgraph, depth-first, in file order."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            kind = attr.type  # the type first: reading ``graphs`` made an empty list per attribute
            if kind == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif kind == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graphs(sub)


def _node_attrs(node: onnx.NodeProto) -> dict:
    """A node's attributes as plain Python values (strings decoded, int lists as lists)."""
    out = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, (list, tuple)):
            value = list(value)
        out[attr.name] = value
    return out


def _coerce_float_attrs(node: onnx.NodeProto, schema) -> None:
    """Rewrite INT attributes that the schema declares float (``clip_min=0`` from a rule) as FLOAT.

    The body references them as FLOAT (Constant value_float, LeakyRelu alpha, Gemm alpha), and a
    reference to an attribute of another type is invalid.
    """
    for i, attr in enumerate(node.attribute):
        if attr.type == onnx.AttributeProto.INT and schema.attributes.get(attr.name, (None,))[0] is float:
            node.attribute[i].CopyFrom(helper.make_attribute(attr.name, float(attr.i)))


def default_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain (ai.onnx) opset; UnsupportedModel when it imports none."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    raise UnsupportedModel("model imports no default-domain (ai.onnx) opset; graphopt ops need one")


class _DtypeLookup:
    """Element types of tensors, from declared types first and shape inference only if needed.

    Below opset 15 a body with numeric constants must know its element type; this is the only
    place that asks, and it runs onnx shape inference at most once per model.
    """

    def __init__(self, model: onnx.ModelProto, names: set[str]):
        self._model = model
        self._names = names  # every name a caller may ask about
        self._types: dict[str, int] | None = None
        self._inferred = False

    def _collect(self, model: onnx.ModelProto) -> dict[str, int]:
        """The types of ``self._names``: the first declaration of each in graph order."""
        types: dict[str, int] = {}
        names = self._names
        for g in _graphs(model.graph):
            for init in g.initializer:
                name = init.name
                if name in names:
                    types.setdefault(name, init.data_type)
            for infos in (g.input, g.value_info, g.output):
                for vi in infos:  # 20k entries on GPT-2 20k: only the names asked have their type read
                    name = vi.name
                    if name in names:
                        elem = vi.type.tensor_type.elem_type  # 0 when the type is no tensor (a default message)
                        if elem:
                            types.setdefault(name, elem)
        return types

    def __call__(self, names: list[str]) -> int | None:
        if self._types is None:
            self._types = self._collect(self._model)
        for attempt in range(2):
            for name in names:
                if name and name in self._types:
                    return self._types[name]
            if attempt == 0 and not self._inferred:
                self._inferred = True
                try:
                    inferred = onnx.shape_inference.infer_shapes(self._model)
                except Exception:  # inference is a best effort here; float32 is the fallback
                    return None
                for name, dtype in self._collect(inferred).items():
                    self._types.setdefault(name, dtype)
        return None


def attach_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Add exactly the FunctionProtos the model's graphopt nodes need; modifies and returns ``model``.

    For every graphopt-domain node (root graph and all If/Loop/Scan subgraphs) this validates the
    attributes (RuleError naming the node when invalid), sets ``node.overload`` to the schema's
    key, and collects the (op, overload) pairs. Stale graphopt functions are replaced by fresh
    bodies for the model's default opset, sorted by (name, overload) after the other domains'
    functions (whose order is kept). It imports graphopt:1 and raises ir_version to >= 10.
    Idempotent: a second call leaves the model byte-identical.
    """
    from graphopt.ops import get_schema  # here, not at module level: the facade imports this module

    opset = default_opset(model)
    if opset < MIN_OPSET:
        raise UnsupportedModel(f"model opset {opset} is below {MIN_OPSET}, the lowest graphopt function bodies "
                               "support; convert it first with onnx.version_converter")
    ours = [(graph, node) for graph, node in _walk(model.graph) if node.domain == DOMAIN]
    lookup = _DtypeLookup(model, {name for _, node in ours for name in node.input}) if opset < CASTLIKE_OPSET else None
    needed: dict[tuple[str, str], None] = {}
    for graph, node in ours:
        where = f"node {node.name or '(unnamed)'!r} ({DOMAIN}.{node.op_type}) in graph {graph.name!r}"
        try:
            schema = get_schema(node.op_type)
        except RuleError as exc:
            raise RuleError(f"{where}: {exc}") from None
        attrs = _node_attrs(node)
        present = [bool(name) for name in node.input]
        reason = schema.validate(attrs, present)
        if reason:
            raise RuleError(f"{where}: {reason}; fix the rule or pass that builds it")
        for name in schema.explicit_defaults:
            if name not in attrs:
                attrs[name] = schema.attributes[name][1]
                node.attribute.append(helper.make_attribute(name, attrs[name]))
        def dtype_of(node=node):  # below opset 15 (CastLike) a body with typed constants keys on it
            return lookup([name for name in node.input if name])

        try:
            key = schema.validated_overload(attrs, present, dtype_of if lookup is not None else None)
        except RuleError as exc:
            raise RuleError(f"{where}: {exc}") from None
        node.overload = key
        _coerce_float_attrs(node, schema)
        needed[(node.op_type, key)] = None

    kept = [f for f in model.functions if f.domain != DOMAIN]
    fresh = [get_schema(name).function(key, opset) for name, key in sorted(needed)]
    del model.functions[:]
    model.functions.extend(kept + fresh)

    if needed:
        for imp in model.opset_import:
            if imp.domain == DOMAIN:
                imp.version = VERSION
                break
        else:
            model.opset_import.append(helper.make_opsetid(DOMAIN, VERSION))
        if model.ir_version < MIN_IR_VERSION:
            model.ir_version = MIN_IR_VERSION
    return model


__all__ = ["attach_functions", "default_opset"]
