"""Writing a model with its weights in one external-data file beside it, without holding them twice.

``stage_model`` stages the model (and its data file) in a ``graphopt.files.Staged``: the structure is a
copy of everything but the top-level initializers, which become stubs pointing into the data file; the
bytes are streamed one tensor at a time from the caller's model, and a weight still in the input's data
file (a lazy reference, ``graphopt.ir.external``) is copied from there chunk by chunk, its holes kept.
"""

from __future__ import annotations

import math
from pathlib import Path

import onnx

from graphopt.errors import WriteFailed
from graphopt.files import Staged
from graphopt.ir.external import is_external, is_lazy, iter_tensors, lazy_location, stream_lazy
from graphopt.ir.large import fixed_itemsize, materialize, raw_length, without_initializers

PROTOBUF_LIMIT = 2**31 - 1


def serialize(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString(deterministic=True)


def stage_model(staged: Staged, model: onnx.ModelProto, dest: Path, data_path: Path, external_data, size_threshold: int,
                 min_external_tensor_bytes: int, serialized: bytes | None = None) -> None:
    """Stage ``model`` at ``dest`` (and its weights at ``data_path`` when they go external).
    ``serialized``: ``serialize(model)``, already made by the caller (only a model without lazy
    references has it), used when the model goes in one file."""
    total = sum(raw_length(t) for t in iter_tensors(model.graph))
    total += sum(lazy_location(t)[2] for t in model.graph.initializer if is_lazy(t))
    use_external = external_data if external_data is not None else total > size_threshold
    if not use_external:
        if serialized is not None:
            data = serialized
        else:
            model = materialize(model)  # weights left in their files are read in (below the 2 GB limit)
            data = serialize(model)
        if len(data) > PROTOBUF_LIMIT:
            raise WriteFailed(f"{dest}: the model is over 2 GB; save it with external data")
        staged.add(dest, [data])
        return
    # The structure is a copy of everything but the top-level initializers, which become stubs that
    # point into the data file; their bytes are streamed from the caller's model one tensor at a time
    # (no second copy of the weights, and the caller's model is left untouched).
    structure = without_initializers(model)
    plan: list = []  # (tensor proto to stream | raw bytes, offset, length)
    offset = 0

    def place(length: int) -> int:
        nonlocal offset
        offset += (-offset) % 64  # align every tensor to 64 bytes
        start = offset
        offset += length
        return start

    for t in model.graph.initializer:
        length = _data_length(t)
        if is_lazy(t):  # a weight left in the input's data file: copied from there, chunk by chunk
            length = length if length is not None else lazy_location(t)[2]
        elif is_external(t) or length is None or length < min_external_tensor_bytes:
            structure.graph.initializer.append(t)
            continue
        start = place(length)
        stub = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=list(t.dims), doc_string=t.doc_string)
        stub.metadata_props.extend(t.metadata_props)
        stub.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", data_path.name), ("offset", str(start)), ("length", str(length))):
            stub.external_data.add(key=k, value=v)
        structure.graph.initializer.append(stub)
        plan.append((t, start, length))
    for t in iter_tensors(structure.graph):  # subgraph initializers, Constant and attribute tensors (copies)
        if is_external(t):  # the stubs above (and any other reference)
            continue
        if not t.HasField("raw_data"):
            if t.data_type in (onnx.TensorProto.STRING,) or not t.dims:
                continue
            # typed fields (float_data, ...): convert to raw bytes so they can move out of the proto
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t), t.name))
        if len(t.raw_data) < min_external_tensor_bytes:
            continue
        raw = t.raw_data
        start = place(len(raw))
        onnx.external_data_helper.set_external_data(t, location=data_path.name, offset=start, length=len(raw))
        t.data_location = onnx.TensorProto.EXTERNAL
        t.ClearField("raw_data")
        plan.append((raw, start, len(raw)))

    def chunks():
        at = 0
        for item, start, length in plan:
            if start > at:
                yield b"\0" * (start - at)
            at = start + length
            if not isinstance(item, bytes) and is_lazy(item):
                yield from stream_lazy(item, length)
                continue
            raw = item if isinstance(item, bytes) else _raw_bytes(item)
            if len(raw) != length:
                raise WriteFailed(f"{dest}: tensor {item.name!r} holds {len(raw)} bytes, its dims need {length}; "
                                  "nothing was written")
            yield raw

    staged.add(data_path, chunks())
    staged.add(dest, [serialize(structure)])


def _data_length(t: onnx.TensorProto) -> int | None:
    """Bytes the tensor's data takes as raw_data, without touching the data (None: not movable)."""
    if t.data_type == onnx.TensorProto.STRING or not t.dims and not t.HasField("raw_data"):
        return None
    if t.HasField("raw_data"):
        return raw_length(t)
    itemsize = fixed_itemsize(t.data_type)
    return None if itemsize is None else math.prod(t.dims) * itemsize


def _raw_bytes(t: onnx.TensorProto) -> bytes:
    if t.HasField("raw_data"):
        return t.raw_data
    return onnx.numpy_helper.to_array(t).tobytes()
