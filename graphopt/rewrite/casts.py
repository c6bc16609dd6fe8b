"""Constraints and builders for the precision Casts exporters put around norms and attention.

An fp16 (or bf16) model exported from ``x.to(torch.float32)`` code computes a norm or a softmax
in float32 between two Casts: ``Cast(fp16 -> fp32) -> ... -> Cast(fp32 -> fp16)``. graphopt's
fused ops compute in float32 whatever their I/O dtype, so a rule may take the Casts into the op:
it reads the tensor before the up-cast and produces the type after the down-cast.

Constraints (``None`` when they hold, else the reason ``--explain`` prints):

* ``precision_upcast(x)``: x is the output of a Cast from float16/bfloat16 to float32;
* ``precision_cast(cast)``: the Cast node widens float16/bfloat16 to float32;
* ``precision_downcast(cast)``: the Cast node narrows float32 to float16/bfloat16;
* ``casts_back(down, x)``: the Cast node ``down`` converts to the type ``x``'s up-cast started from;
* ``same_dtype(a, b)``: tensors a and b have the same, known element type.

Builders: ``cast_input(x)`` (tensor: what the Cast that produced x reads), ``cast_to(t)``
(attributes ``to`` = t's element type, for a Cast the replacement adds).
"""

from __future__ import annotations

from onnx import TensorProto

from graphopt.rewrite.registry import BuildFailed, register_builder, register_constraint

NARROW = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
_NAMES = {v: k.lower() for k, v in TensorProto.DataType.items()}


def type_name(dtype: int | None) -> str:
    """'float16' for TensorProto.FLOAT16; 'unknown' for None."""
    return "unknown" if dtype is None else _NAMES.get(dtype, str(dtype))


def _cast_types(g, node) -> tuple[int | None, int]:
    src = g.dtype(node.inputs[0]) if node.inputs and node.inputs[0] else None
    return src, int(node.attr("to", 0))


def _why_not_widening(g, node) -> str | None:
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return f"{node.name!r} is {node.op_type}, not a Cast"
    src, to = _cast_types(g, node)
    if src in NARROW and to == TensorProto.FLOAT:
        return None
    return (f"Cast {node.name!r} converts {type_name(src)} to {type_name(to)}, not float16/bfloat16 "
            "to float32 (a precision up-cast)")


@register_constraint("precision_upcast", "t")
def precision_upcast(g, x):
    """x is produced by a Cast from float16/bfloat16 to float32."""
    node = g.producer(x) if x else None
    if node is None:
        return f"{x!r} is not produced by a Cast"
    return _why_not_widening(g, node)


@register_constraint("precision_cast", "n")
def precision_cast(g, node):
    """node is a Cast from float16/bfloat16 to float32."""
    return _why_not_widening(g, node)


@register_constraint("precision_downcast", "n")
def precision_downcast(g, node):
    """node is a Cast from float32 to float16/bfloat16."""
    src, to = _cast_types(g, node)
    if src == TensorProto.FLOAT and to in NARROW:
        return None
    return (f"Cast {node.name!r} converts {type_name(src)} to {type_name(to)}, not float32 to "
            "float16/bfloat16 (a precision down-cast)")


@register_constraint("casts_back", "nt")
def casts_back(g, down, x):
    """down converts to the element type that x's producing Cast read."""
    up = g.producer(x) if x else None
    if up is None or up.op_type != "Cast":
        return f"{x!r} is not produced by a Cast"
    src, _ = _cast_types(g, up)
    to = int(down.attr("to", 0))
    if src is None or src != to:
        return (f"Cast {down.name!r} converts to {type_name(to)}, but Cast {up.name!r} started from "
                f"{type_name(src)}")
    return None


@register_constraint("half_precision", "t")
def half_precision(g, x):
    """x's element type is float16 or bfloat16."""
    dt = g.dtype(x) if x else None
    if dt in NARROW:
        return None
    return f"{x!r} is {type_name(dt) if dt is not None else 'of unknown type'}, not float16/bfloat16"


@register_constraint("same_dtype", "tt")
def same_dtype(g, a, b):
    """a and b have the same known element type."""
    if a is None or b is None:
        return "an input is absent"
    da, db = g.dtype(a), g.dtype(b)
    if da is None or db is None:
        return f"the element type of {a if da is None else b!r} is unknown"
    if da != db:
        return f"{a!r} is {type_name(da)} but {b!r} is {type_name(db)}"
    return None


@register_builder("cast_input", "t", "tensor")
def cast_input(g, x):
    """The tensor the Cast that produced x reads."""
    node = g.producer(x) if x else None
    if node is None or node.op_type != "Cast" or not node.inputs or not node.inputs[0]:
        raise BuildFailed(f"{x!r} is not produced by a Cast")
    return node.inputs[0]


@register_builder("cast_to", "t", "attrs")
def cast_to(g, t):
    """Attributes {"to": t's element type} for a Cast the replacement adds."""
    dtype = g.dtype(t) if t else None
    if dtype is None:
        raise BuildFailed(f"the element type of {t!r} is unknown")
    return {"to": int(dtype)}
