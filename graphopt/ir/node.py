"""``Node``: one operator of the IR.

A node keeps its non-graph attributes as ``onnx.AttributeProto`` (so types, doc strings and unusual
encodings round-trip without loss) and exposes them as Python values through ``attr``. Graph-valued
attributes (If/Loop/Scan bodies) are held as nested ``Graph`` objects so passes can recurse into them.
Inputs and outputs are plain tensor names; they are changed only through ``Graph`` methods, which keep
the producer/consumer links consistent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

if TYPE_CHECKING:  # pragma: no cover
    from graphopt.ir.graph import Graph


def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


class Node:
    """An ONNX operator: ``op_type`` in ``domain`` reading ``inputs`` and writing ``outputs``."""

    __slots__ = (
        "name",
        "op_type",
        "domain",
        "inputs",
        "outputs",
        "doc_string",
        "overload",
        "_attrs",
        "_extra",
        "_pos",
        "_has_sub",
        "graph",
    )

    def __init__(
        self,
        op_type: str,
        inputs: list[str],
        outputs: list[str],
        *,
        name: str,
        domain: str = "",
        doc_string: str = "",
        overload: str = "",
    ):
        self.name = name
        self.op_type = op_type
        self.domain = domain
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.doc_string = doc_string
        self.overload = overload
        # name -> AttributeProto, or Graph / list[Graph] for graph-valued attributes; insertion-ordered.
        self._attrs: dict[str, Any] = {}
        # Fields of NodeProto this class does not model (metadata_props, device configurations, ...),
        # kept verbatim so they round-trip.
        self._extra: onnx.NodeProto | None = None
        self._pos: tuple[int, ...] = (0,)
        self._has_sub = False  # any graph-valued attribute (fast path for walk())
        self.graph: "Graph | None" = None

    # -- attributes -------------------------------------------------------------------------
    @property
    def key(self) -> str:
        return self.name

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr_names(self) -> list[str]:
        return sorted(self._attrs)

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute as a Python value (str, int, float, lists, ndarray, Graph), or ``default``."""
        if name not in self._attrs:
            return default
        value = self._attrs[name]
        if not isinstance(value, AttributeProto):
            return value
        if value.type == AttributeProto.TENSOR:
            return numpy_helper.to_array(value.t)
        if value.type == AttributeProto.TENSORS:
            return [numpy_helper.to_array(t) for t in value.tensors]
        if value.type in (AttributeProto.SPARSE_TENSOR, AttributeProto.SPARSE_TENSORS, AttributeProto.TYPE_PROTO, AttributeProto.TYPE_PROTOS):
            return helper.get_attribute_value(value)
        return _decode(helper.get_attribute_value(value))

    def attr_proto(self, name: str) -> AttributeProto | None:
        value = self._attrs.get(name)
        return value if isinstance(value, AttributeProto) else None

    def attrs_dict(self) -> dict[str, Any]:
        """Non-graph attributes as Python values, in attribute order (for copying onto a new node)."""
        return {k: self.attr(k) for k, v in self._attrs.items() if isinstance(v, AttributeProto)}

    def set_attr(self, name: str, value: Any) -> None:
        from graphopt.ir.graph import Graph  # local: node.py is imported by graph.py

        if isinstance(value, AttributeProto):
            proto = AttributeProto()
            proto.CopyFrom(value)
            proto.name = name
            self._attrs[name] = proto
            return
        if isinstance(value, Graph) or (isinstance(value, list) and value and all(isinstance(v, Graph) for v in value)):
            self._attrs[name] = value
            self._has_sub = True
            if self.graph is not None:
                self.graph._adopt_subgraphs(self)
            return
        if isinstance(value, np.ndarray):
            value = numpy_helper.from_array(value)
        if isinstance(value, np.generic):
            value = value.item()
        self._attrs[name] = helper.make_attribute(name, value)

    def del_attr(self, name: str) -> None:
        self._attrs.pop(name, None)
        self._has_sub = any(not isinstance(v, AttributeProto) for v in self._attrs.values())

    def subgraphs(self) -> list["Graph"]:
        if not self._has_sub:
            return []
        out: list[Graph] = []
        for value in self._attrs.values():
            if isinstance(value, list):
                out.extend(value)
            elif not isinstance(value, AttributeProto):
                out.append(value)
        return out

    def subgraph_items(self) -> Iterator[tuple[str, Any]]:
        for name, value in self._attrs.items():
            if not isinstance(value, AttributeProto):
                yield name, value

    # -- misc --------------------------------------------------------------------------------
    @property
    def qualified_op(self) -> str:
        return f"{self.domain}.{self.op_type}" if self.domain else self.op_type

    def __repr__(self) -> str:
        return f"Node({self.name!r}: {self.qualified_op}({', '.join(self.inputs)}) -> {', '.join(self.outputs)})"
