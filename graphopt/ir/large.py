"""Models near or over protobuf's 2 GB limit: shape inference and onnx.checker without the weights.

python-protobuf cannot serialize (or even size: ``ByteSize`` raises ``EncodeError``) a message over
2 GB, and onnx's shape inference and checker serialize the model they are given. Neither needs the
weights' bytes, only their names, types and dims; so a *weightless* copy is built (every tensor's
data replaced by an external reference to a sparse placeholder file, which onnx's checker wants to
exist as a regular file), and inference and checks run on that. Nothing here copies a weight.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import onnx
from google.protobuf.message import EncodeError

from graphopt.ir.convert import copy_field
from graphopt.ir.external import has_lazy, is_lazy, iter_tensors, read_lazy

#: Above this many bytes of tensor data a model cannot be serialized whole (protobuf's limit).
LARGE_MODEL_BYTES = 2**31 - 2**24
#: Above this many bytes of tensor data, inference and checks run on a weightless copy anyway: onnx
#: serializes and parses the model it is given several times over (a peak of 4x the weights).
WEIGHTLESS_ABOVE = 64 * 2**20
#: Tensors smaller than this stay in the weightless copy (shape constants feed data propagation).
KEEP_INLINE_BYTES = 2**20
_PLACEHOLDER = "graphopt-weights.placeholder"


#: Data types whose raw_data is not (element count) x itemsize bytes: strings and the 4-bit packed types.
_PACKED = {onnx.TensorProto.STRING, onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
_FP4 = getattr(onnx.TensorProto, "FLOAT4E2M1", None)
if _FP4 is not None:
    _PACKED.add(_FP4)


def fixed_itemsize(data_type: int) -> int | None:
    """Bytes per element of a fixed-size ONNX data type; None for strings, 4-bit types and unknown ones."""
    if data_type in _PACKED:
        return None
    try:
        return int(onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize)
    except Exception:  # noqa: BLE001 - a type this onnx cannot map: measure the bytes instead
        return None


def raw_length(t: onnx.TensorProto) -> int:
    """``len(t.raw_data)`` without reading raw_data where the dims tell it: upb hands out a fresh copy
    of a bytes field on every read (GPT-2 124M: 650 MB copied each time a size was asked, 0.2-1 s,
    six times per optimize). For fixed-size types the length is the element count times the itemsize:
    ``load_model`` refuses a tensor whose raw_data disagrees with its dims (``check_tensor``), and the
    tensors graphopt makes come from ``numpy_helper``. Other types are measured."""
    if not t.HasField("raw_data"):
        return 0
    size = fixed_itemsize(t.data_type)
    return len(t.raw_data) if size is None else math.prod(t.dims) * size


def _data_bytes(t: onnx.TensorProto) -> int:
    """Bytes of data one tensor holds (raw, or 8 per typed value; an external reference counts 0).
    Not ``ByteSize()``: upb encodes a message to size it."""
    if t.HasField("raw_data"):
        return raw_length(t)
    return 8 * (len(t.float_data) + len(t.int32_data) + len(t.int64_data) + len(t.double_data) + len(t.uint64_data))


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of raw data the main graph's initializers hold (external references count 0)."""
    return sum(raw_length(t) for t in model.graph.initializer)


def tensor_bytes(model: onnx.ModelProto) -> int:
    """Bytes of tensor data held in the model (raw and typed fields; external references count 0)."""
    return sum(_data_bytes(t) for t in iter_tensors(model.graph))


def size_bound(model: onnx.ModelProto) -> int:
    """An upper bound of ``model.ByteSize()`` that never serializes the weights.

    Why not ``ByteSize()``: the upb protobuf backend has no cached sizes and encodes the whole
    message to size it, 2.6 s (mostly page faults) for GPT-2 124M's 650 MB, and the optimizer asked
    three times (``bench/results/optimizer_speed.md``). Everything but the main graph's initializers
    is sized exactly (a field-by-field copy without them); each initializer is bounded from its
    fields' lengths (raw bytes as they are, a typed value at most 10 bytes, 64 bytes of framing).
    Raises ``EncodeError`` only when the structure alone is over protobuf's limit. A model with
    little weight data is sized exactly (encoding it costs less than copying its structure)."""
    inits = model.graph.initializer
    if initializer_bytes(model) < WEIGHTLESS_ABOVE:
        return model.ByteSize()
    total = without_initializers(model).ByteSize()
    for t in inits:
        total += 64 + len(t.name) + len(t.doc_string) + 11 * len(t.dims) + raw_length(t)
        total += 10 * (len(t.float_data) + len(t.int32_data) + len(t.int64_data) + len(t.double_data) + len(t.uint64_data))
        total += sum(len(v) + 6 for v in t.string_data)
        total += sum(len(e.key) + len(e.value) + 12 for e in t.external_data)
    return total


def is_large(model: onnx.ModelProto, limit: int | None = None) -> bool:
    """True when the model is too big for protobuf (or above ``limit`` bytes of tensor data), or keeps
    weights in their files (lazy references): then inference and checks run on the weightless copy."""
    limit = LARGE_MODEL_BYTES if limit is None else limit
    if has_lazy(model):  # weights left in their files: never serialize them
        return True
    try:
        size = size_bound(model)
    except EncodeError:
        return True
    if size > LARGE_MODEL_BYTES:  # possibly over protobuf's limit, whatever ``limit`` says
        return True
    if size * _MAX_COUNTED_PER_BYTE <= limit:  # tensor_bytes cannot pass the limit: no walk over every tensor
        return False
    return tensor_bytes(model) > limit or size > limit


#: ``tensor_bytes`` counts at most this many bytes per byte of the serialized model: raw data one for
#: one, a typed (packed) value 8 for the 1 byte or more it takes serialized.
_MAX_COUNTED_PER_BYTE = 8


def small_bytes(model: onnx.ModelProto, limit: int | None = None) -> bytes | None:
    """``model`` serialized (deterministically: the bytes ``graphopt.ir.datafile.serialize`` writes)
    when ``is_large(model, limit)`` is False, else None; the same answer as ``is_large``.

    Why: upb sizes a message by encoding it, so ``is_large`` followed by onnx's own ``SerializeToString``
    (shape inference, the checker, the writer) encoded a small model twice, 0.02 s each on the 20k-node
    GPT-2; here one encoding is the size and the bytes to hand on. A model with enough raw data to be
    worth bounding without encoding (``size_bound``) is asked ``is_large`` first, as before."""
    limit = LARGE_MODEL_BYTES if limit is None else limit
    if has_lazy(model):
        return None
    if initializer_bytes(model) >= WEIGHTLESS_ABOVE:
        return None if is_large(model, limit) else model.SerializeToString(deterministic=True)
    try:  # size_bound is exact (ByteSize) on this branch: the encoding's length is that size
        data = model.SerializeToString(deterministic=True)
    except EncodeError:
        return None
    size = len(data)
    if size > LARGE_MODEL_BYTES:
        return None
    if size * _MAX_COUNTED_PER_BYTE <= limit:
        return data
    return None if tensor_bytes(model) > limit or size > limit else data


def _weightless_tensor(t: onnx.TensorProto, offset: int) -> tuple[onnx.TensorProto, int]:
    out = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=list(t.dims))
    size = 1
    for d in t.dims:
        size *= d
    try:
        length = size * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:
        length = size
    out.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", _PLACEHOLDER), ("offset", str(offset)), ("length", str(length))):
        out.external_data.add(key=k, value=v)
    return out, offset + length


def without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every field but the main graph's initializers (none of the weights)."""
    out = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            copy_field(out, field.name, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            copy_field(out.graph, field.name, value)
    return out


def materialize(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when it holds no lazy reference (``graphopt.ir.external.keep_lazy``), else a copy
    with their bytes read in (for the code that needs every value: the fp16 conversion)."""
    if not has_lazy(model):
        return model
    out = without_initializers(model)
    out.graph.initializer.extend(read_lazy(t) if is_lazy(t) else t for t in model.graph.initializer)
    return out


def weightless(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """(a copy of ``model`` whose top-level initializers reference a placeholder file instead of
    holding data, the placeholder's size). Built field by field: no weight is copied."""
    out = without_initializers(model)
    stubs = WeightlessInitializers()
    out.graph.initializer.extend(stubs(t) for t in model.graph.initializer)
    return out, stubs.offset


class WeightlessInitializers:
    """``stub(t)``: ``t`` itself when it is small (shape constants feed data propagation), else a
    reference into the placeholder file at the next offset (``offset``: the placeholder's size so far).
    What ``weightless`` does to each initializer, for ``graphopt.ir.convert.to_model``'s
    ``initializer_map`` too, so that the IR goes to a weightless model without copying a weight."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self, t: onnx.TensorProto) -> onnx.TensorProto:
        if t.data_location == onnx.TensorProto.EXTERNAL or _data_bytes(t) >= KEEP_INLINE_BYTES:
            stub, self.offset = _weightless_tensor(t, self.offset)
            return stub
        return t


def check_weightless(model: onnx.ModelProto, full: bool) -> None:
    """onnx.checker on the weightless copy, from a temp folder holding a sparse placeholder file (the
    checker wants external data to be a regular file; a sparse file takes no disk space)."""
    light, size = weightless(model)
    with tempfile.TemporaryDirectory(prefix="graphopt-check-") as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(light.SerializeToString())
        with open(Path(tmp) / _PLACEHOLDER, "wb") as f:
            os.ftruncate(f.fileno(), size)
        onnx.checker.check_model(str(path), full_check=full)
