"""graphopt's custom ops (domain ``graphopt``, version 1): schemas, NumPy references, function bodies.

A thin facade over the op families (``cbr``, ``gemm_act``, ``layer_norm``, ``rms_norm``, ``gelu``,
``attention``), the shared activation registry and
``attach_functions``. See /work/notes/ops_contract.md for the contract.

>>> from graphopt.ops import get_schema
>>> get_schema("CBR").overload({"activation": "Relu"}, [True, True, True, True])
'relu_b_r'
"""

from __future__ import annotations

from graphopt.errors import RuleError
from graphopt.ops import attention as _attention
from graphopt.ops import cbr as _cbr
from graphopt.ops import gelu as _gelu
from graphopt.ops import gemm_act as _gemm_act
from graphopt.ops import layer_norm as _layer_norm
from graphopt.ops import rms_norm as _rms_norm
from graphopt.ops.activations import ACTIVATIONS, Activation
from graphopt.ops.functions import attach_functions
from graphopt.ops.schema import DOMAIN, VERSION, OpSchema

_SCHEMAS: dict[str, OpSchema] = {s.name: s for s in (_attention.SCHEMA, _cbr.SCHEMA, _gelu.SCHEMA, _gemm_act.SCHEMA,
                                                      _layer_norm.SCHEMA, _rms_norm.SCHEMA)}


def get_schema(op_type: str) -> OpSchema:
    """The schema of graphopt op ``op_type``; RuleError naming the op and the known ones when unknown."""
    schema = _SCHEMAS.get(op_type)
    if schema is None:
        raise RuleError(f"unknown graphopt op {op_type!r}; known ops: {', '.join(sorted(_SCHEMAS))}")
    return schema


def schemas() -> list[OpSchema]:
    """All graphopt op schemas, sorted by name."""
    return [_SCHEMAS[name] for name in sorted(_SCHEMAS)]


__all__ = ["ACTIVATIONS", "Activation", "DOMAIN", "VERSION", "OpSchema", "attach_functions",
           "get_schema", "schemas"]
