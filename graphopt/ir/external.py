"""External-data safety: tensor data files may never reach outside the model's folder.

onnx's own loader has had path-traversal bugs (CVE-2024-27318 and its symlink/hardlink follow-ups),
and its checks differ between versions, so graphopt validates every external reference itself before
any byte is read: the location must be a relative path with no ``..`` component, every path component
must be a real folder or file (no symlink anywhere under the model folder), the file must be a regular
file with a single hard link, and offset + length must lie inside it. Only then is the data read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import Iterator

import onnx
from onnx import AttributeProto

from graphopt.errors import UnsafeExternalData

_KNOWN_KEYS = {"location", "offset", "length", "checksum", "basepath"}


def iter_graphs(gproto: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every nested subgraph, iteratively (deep nesting cannot overflow the stack)."""
    stack = [gproto]
    while stack:
        g = stack.pop()
        yield g
        for n in g.node:
            for a in n.attribute:
                if a.type == AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    stack.extend(a.graphs)


def iter_sparse(gproto: onnx.GraphProto) -> Iterator[onnx.SparseTensorProto]:
    """Every SparseTensorProto of a graph: sparse initializers and sparse attributes (Constant's
    ``sparse_value``), in all nested subgraphs."""
    for g in iter_graphs(gproto):
        yield from g.sparse_initializer
        for n in g.node:
            for a in n.attribute:
                if a.type == AttributeProto.SPARSE_TENSOR:
                    yield a.sparse_tensor
                elif a.type == AttributeProto.SPARSE_TENSORS:
                    yield from a.sparse_tensors


def iter_tensors(gproto: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of a graph: initializers, Constant/attribute tensors, and the values and
    indices of every sparse tensor, in all nested subgraphs."""
    for g in iter_graphs(gproto):
        yield from g.initializer
        for n in g.node:
            for a in n.attribute:
                if a.type == AttributeProto.TENSOR:
                    yield a.t
                elif a.type == AttributeProto.TENSORS:
                    yield from a.tensors
    for s in iter_sparse(gproto):
        yield s.values
        yield s.indices


def model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from iter_tensors(model.graph)
    for f in model.functions:
        for n in f.node:
            for a in n.attribute:
                if a.type == AttributeProto.TENSOR:
                    yield a.t


def is_external(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL


def resolve_location(base_dir: Path, tensor: onnx.TensorProto, source: str) -> tuple[Path, int, int | None]:
    """Validate one tensor's external reference; returns (file, offset, length or None)."""
    info: dict[str, str] = {}
    for entry in tensor.external_data:
        if entry.key not in _KNOWN_KEYS:
            raise UnsafeExternalData(
                f"{source}: tensor {tensor.name!r} has unknown external-data key {entry.key!r}; only {sorted(_KNOWN_KEYS)} are allowed"
            )
        info[entry.key] = entry.value
    location = info.get("location", "")
    what = f"{source}: tensor {tensor.name!r} external data {location!r}"
    if not location:
        raise UnsafeExternalData(f"{source}: tensor {tensor.name!r} is marked external but has no location")
    if "\x00" in location:
        raise UnsafeExternalData(f"{what} contains a NUL byte")
    if location.startswith(("/", "\\")) or os.path.isabs(location) or (len(location) > 1 and location[1] == ":"):
        raise UnsafeExternalData(f"{what} is an absolute path; external data must be relative to the model's folder")
    parts = PurePosixPath(location.replace("\\", "/")).parts
    if any(p == ".." for p in parts):
        raise UnsafeExternalData(f"{what} contains '..'; external data must stay inside the model's folder")
    if "basepath" in info:
        raise UnsafeExternalData(f"{what} sets 'basepath', which graphopt does not follow")
    base_real = Path(os.path.realpath(base_dir))
    current = base_real
    for i, part in enumerate(parts):
        if part in ("", "."):
            continue
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            raise UnsafeExternalData(f"{what} is missing (looked for {current})") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeExternalData(f"{what}: {current} is a symbolic link; copy the data file into the model's folder")
        last = i == len(parts) - 1
        if not last and not stat.S_ISDIR(st.st_mode):
            raise UnsafeExternalData(f"{what}: {current} is not a folder")
        if last:
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeExternalData(f"{what}: {current} is not a regular file")
            if st.st_nlink > 1:
                raise UnsafeExternalData(f"{what}: {current} is a hard link shared with another file; copy it instead")
            size = st.st_size
    if os.path.commonpath([str(base_real), os.path.realpath(current)]) != str(base_real):
        raise UnsafeExternalData(f"{what} resolves outside the model's folder")
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise UnsafeExternalData(f"{what} has a non-integer offset or length") from None
    if offset < 0 or (length is not None and length < 0):
        raise UnsafeExternalData(f"{what} has a negative offset or length")
    end = offset + (length if length is not None else 0)
    if offset > size or end > size:
        raise UnsafeExternalData(f"{what}: offset {offset} + length {length} lies beyond the file's {size} bytes")
    return current, offset, length


def load_external(model: onnx.ModelProto, base_dir: Path, source: str) -> list[Path]:
    """Validate, then read every external tensor's bytes into ``raw_data`` (in place); returns the
    data files read."""
    files: list[Path] = []
    for t in model_tensors(model):
        if not is_external(t):
            continue
        path, offset, length = resolve_location(base_dir, t, source)
        if path not in files:
            files.append(path)
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read() if length is None else f.read(length)
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
        t.raw_data = data
    return files


def check_external(model: onnx.ModelProto, base_dir: Path, source: str) -> list[Path]:
    """Validate every external reference without reading; returns the data files used."""
    files: list[Path] = []
    for t in model_tensors(model):
        if is_external(t):
            path, _, _ = resolve_location(base_dir, t, source)
            if path not in files:
                files.append(path)
    return files
