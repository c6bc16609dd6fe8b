"""graphopt's custom ops (domain ``graphopt``, version 1): schemas, NumPy references, function bodies.

A thin facade over the op families (``cbr``, ``gemm_act``, ``gated_mlp``, ``layer_norm``, ``rms_norm``, ``rope``, ``group_norm``, ``gelu``,
``attention``), the shared activation registry and
``attach_functions``. See /work/notes/ops_contract.md for the contract. ``register_schema`` adds an
op from outside this package (docs/adding_a_fused_op.md walks through one).

>>> from graphopt.ops import get_schema
>>> get_schema("CBR").overload({"activation": "Relu"}, [True, True, True, True])
'relu_b_r'
"""

from __future__ import annotations

from graphopt.errors import RuleError
from graphopt.ops import attention as _attention
from graphopt.ops import cbr as _cbr
from graphopt.ops import gated_mlp as _gated_mlp
from graphopt.ops import gelu as _gelu
from graphopt.ops import gemm_act as _gemm_act
from graphopt.ops import group_norm as _group_norm
from graphopt.ops import layer_norm as _layer_norm
from graphopt.ops import rms_norm as _rms_norm
from graphopt.ops import rope as _rope
from graphopt.ops.activations import ACTIVATIONS, Activation
from graphopt.ops.functions import attach_functions
from graphopt.ops.schema import DOMAIN, LOWERING_ATTRIBUTES, VERSION, OpSchema

_SCHEMAS: dict[str, OpSchema] = {s.name: s for s in (_attention.SCHEMA, _cbr.SCHEMA, _gated_mlp.SCHEMA, _gelu.SCHEMA,
                                                      _gemm_act.SCHEMA, _group_norm.SCHEMA, _layer_norm.SCHEMA,
                                                      _rms_norm.SCHEMA, _rope.SCHEMA)}
_BUILTIN = frozenset(_SCHEMAS)


def _origin(schema: OpSchema) -> str:
    return getattr(schema._reference, "__module__", "?")


def register_schema(schema: OpSchema) -> OpSchema:
    """Make ``schema`` a graphopt op: rules may build it, ``attach_functions`` adds its body, and the
    profiler's checker uses its reference. Call it at import time of the module that defines the
    op, so the profiler's worker process (which imports that module to unpickle a candidate) sees
    it too. Registering again from the same module (a reload) replaces it; another module's op of
    the same name is a ``RuleError``."""
    if not isinstance(schema, OpSchema):
        raise TypeError(f"register_schema needs an OpSchema, got {type(schema).__name__}")
    old = _SCHEMAS.get(schema.name)
    if old is not None and old is not schema and (schema.name in _BUILTIN or _origin(old) != _origin(schema)):
        raise RuleError(f"graphopt op {schema.name!r} is already defined (by {_origin(old)}); give the new op another name")
    _SCHEMAS[schema.name] = schema
    return schema


def unregister_schema(name: str) -> None:
    """Remove an op added with ``register_schema`` (tests); the built-in ops cannot be removed."""
    if name in _BUILTIN:
        raise RuleError(f"graphopt op {name!r} is built in and cannot be unregistered")
    _SCHEMAS.pop(name, None)


def get_schema(op_type: str) -> OpSchema:
    """The schema of graphopt op ``op_type``; RuleError naming the op and the known ones when unknown."""
    schema = _SCHEMAS.get(op_type)
    if schema is None:
        raise RuleError(f"unknown graphopt op {op_type!r}; known ops: {', '.join(sorted(_SCHEMAS))}")
    return schema


def schemas() -> list[OpSchema]:
    """All graphopt op schemas, sorted by name."""
    return [_SCHEMAS[name] for name in sorted(_SCHEMAS)]


__all__ = ["ACTIVATIONS", "Activation", "DOMAIN", "LOWERING_ATTRIBUTES", "VERSION", "OpSchema", "attach_functions",
           "get_schema", "register_schema", "schemas", "unregister_schema"]
