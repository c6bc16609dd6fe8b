"""``ValueInfo``: what the IR knows about a tensor (element type and shape), and its reading from an
ONNX ``TypeProto``."""

from __future__ import annotations

from dataclasses import dataclass

import onnx


@dataclass(frozen=True)
class ValueInfo:
    """What is known about a tensor: element type (``onnx.TensorProto`` enum) and shape."""

    dtype: int | None
    shape: tuple[int | str | None, ...] | None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) and d >= 0 for d in self.shape)


def value_info_of_type(type_proto: onnx.TypeProto) -> ValueInfo:
    if not type_proto.HasField("tensor_type"):
        return ValueInfo(None, None)
    tt = type_proto.tensor_type
    dtype = tt.elem_type or None
    if not tt.HasField("shape"):
        return ValueInfo(dtype, None)
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        which = d.WhichOneof("value")  # one call instead of two HasField (a hot path)
        if which == "dim_value":
            dims.append(int(d.dim_value))
        elif which == "dim_param":
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return ValueInfo(dtype, tuple(dims))
