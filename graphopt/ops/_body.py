"""A small builder for FunctionProto bodies shared by the op families.

onnx.helper builds single nodes; what it lacks is the bookkeeping every body needs: fresh
deterministic tensor names, attribute references (``ref_attr_name``), and scalar constants whose
element type matches the function's input at any opset. That bookkeeping lives here, once.
"""

from __future__ import annotations

import onnx
from onnx import AttributeProto, TensorProto, helper

from graphopt.errors import RuleError

# Overload-key tokens for non-float32 element types (float32 is the default and has no token).
DTYPE_TOKENS: dict[int, str] = {
    TensorProto.FLOAT16: "f16",
    TensorProto.DOUBLE: "f64",
    TensorProto.BFLOAT16: "bf16",
}
TOKEN_DTYPES: dict[str, int] = {v: k for k, v in DTYPE_TOKENS.items()}


def dtype_token(dtype: int | None) -> str | None:
    """The overload token for ``dtype``; ``None`` for float32 / unknown. Raises for non-float types."""
    if dtype is None or dtype == TensorProto.FLOAT:
        return None
    if dtype not in DTYPE_TOKENS:
        name = TensorProto.DataType.Name(dtype) if dtype in TensorProto.DataType.values() else str(dtype)
        raise RuleError(f"graphopt ops support float16, bfloat16, float32 and float64 tensors, not {name}")
    return DTYPE_TOKENS[dtype]


def ref_attr(name: str, ref_name: str, attr_type: int) -> AttributeProto:
    """An attribute that takes its value from the calling node's attribute ``ref_name``."""
    attr = AttributeProto()
    attr.name = name
    attr.ref_attr_name = ref_name
    attr.type = attr_type
    return attr


class Body:
    """Accumulates the nodes of one function body for a default-domain ``opset``.

    ``dtype`` is the element type baked into constants (from the overload key) or ``None``:
    then constants are float32, cast to the input's type with ``CastLike`` from opset 15 on.
    """

    def __init__(self, opset: int, dtype: int | None = None):
        self.opset = opset
        self.dtype = dtype
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0

    def tmp(self, hint: str) -> str:
        """A fresh tensor name (deterministic: a counter, never an id or a hash)."""
        self._count += 1
        return f"_{hint}_{self._count}"

    def node(self, op: str, inputs: list[str], output: str | None = None, *,
             refs: dict[str, tuple[str, int]] | None = None, **attrs) -> str:
        """Append ``op``; ``refs`` maps attribute name -> (caller's attribute, AttributeProto type).

        Returns the (single) output name.
        """
        out = output or self.tmp(op.lower())
        node = helper.make_node(op, inputs, [out], name=f"{op.lower()}_{len(self.nodes)}", **attrs)
        for aname in sorted(refs or {}):
            ref_name, attr_type = refs[aname]
            node.attribute.append(ref_attr(aname, ref_name, attr_type))
        self.nodes.append(node)
        return out

    def _float_tensor(self, value: float, dtype: int) -> TensorProto:
        return helper.make_tensor("value", dtype, [], [float(value)])

    def _cast_like(self, name: str, like: str) -> str:
        """Give a float32 scalar the element type of ``like`` (or the key's dtype)."""
        if self.dtype is not None and self.dtype != TensorProto.FLOAT:
            return self.node("Cast", [name], to=self.dtype)
        if self.opset >= 15:
            return self.node("CastLike", [name, like])
        return name  # below opset 15 without a dtype in the key the body is float32-only

    def const(self, value: float, like: str) -> str:
        """A scalar constant with the element type of tensor ``like``."""
        if self.dtype is not None and self.dtype != TensorProto.FLOAT:
            return self.node("Constant", [], value=self._float_tensor(value, self.dtype))
        if self.opset >= 15:  # a float64 literal: CastLike rounds it correctly for every float type
            return self.node("CastLike", [self.node("Constant", [], value=self._float_tensor(value, TensorProto.DOUBLE)), like])
        return self.node("Constant", [], value=self._float_tensor(value, TensorProto.FLOAT))

    def const_ref(self, ref_name: str, like: str) -> str:
        """A scalar tensor holding the caller's float attribute ``ref_name``, typed like ``like``."""
        if self.opset >= 12:
            c = self.node("Constant", [], refs={"value_float": (ref_name, AttributeProto.FLOAT)})
            return self._cast_like(c, like)
        # Constant has no value_float before opset 12, and a TENSOR attribute cannot reference a
        # FLOAT one. Selu(1; gamma=v) = v * 1 exactly (the x > 0 branch), so it turns the float
        # attribute into a tensor with only opset-6 ops.
        one = self.const(1.0, like)
        return self.node("Selu", [one], refs={"gamma": (ref_name, AttributeProto.FLOAT)})

    def function(self, name: str, overload: str, inputs: list[str], outputs: list[str],
                 attributes: list[str], doc: str, domain: str) -> onnx.FunctionProto:
        """Wrap the accumulated nodes into a FunctionProto importing the default domain at ``opset``."""
        fn = helper.make_function(domain, name, inputs, outputs, self.nodes,
                                  [helper.make_opsetid("", self.opset)], attributes=attributes, doc_string=doc)
        fn.overload = overload
        return fn
