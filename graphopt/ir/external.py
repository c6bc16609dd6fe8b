"""External-data safety: tensor data files may never reach outside the model's folder.

onnx's own loader has had path-traversal bugs (CVE-2024-27318 and its symlink/hardlink follow-ups),
and its checks differ between versions, so graphopt validates every external reference itself before
any byte is read: the location must be a relative path with no ``..`` component, every path component
must be a real folder or file (no symlink anywhere under the model folder), the file must be a regular
file with a single hard link, and offset + length must lie inside it. Only then is the data read.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Iterator

import numpy as np
import onnx
from onnx import AttributeProto, numpy_helper

from graphopt.errors import UnsafeExternalData

_KNOWN_KEYS = {"location", "offset", "length", "checksum", "basepath"}
_TENSOR, _TENSORS, _GRAPH, _GRAPHS = AttributeProto.TENSOR, AttributeProto.TENSORS, AttributeProto.GRAPH, AttributeProto.GRAPHS
_SPARSE_TENSOR, _SPARSE_TENSORS = AttributeProto.SPARSE_TENSOR, AttributeProto.SPARSE_TENSORS


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
    return iter(scan_tensors(gproto)[1])


def iter_tensors(gproto: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of a graph: initializers, Constant/attribute tensors, and the values and
    indices of every sparse tensor, in all nested subgraphs."""
    return iter(scan_tensors(gproto)[0])


def scan_tensors(gproto: onnx.GraphProto) -> tuple[list[onnx.TensorProto], list[onnx.SparseTensorProto]]:
    """(every TensorProto, every SparseTensorProto) of a graph and its nested subgraphs, from one walk
    over the graphs' attributes (the one home of that walk: ``iter_tensors`` and ``iter_sparse`` read
    it too). For each graph in the order of ``iter_graphs``: its initializers, then its nodes'
    tensor attributes in node order; the sparse tensors' values and indices come last. Loading walks
    20k nodes' attributes once for its external-data, tensor and sparse checks (0.03-0.07 s a walk on
    the 20k-node GPT-2)."""
    tensors: list[onnx.TensorProto] = []
    sparse: list[onnx.SparseTensorProto] = []
    stack = [gproto]
    while stack:
        g = stack.pop()
        tensors.extend(g.initializer)
        sparse.extend(g.sparse_initializer)
        for n in g.node:
            for a in n.attribute:
                kind = a.type
                if kind == _TENSOR:
                    tensors.append(a.t)
                elif kind == _TENSORS:
                    tensors.extend(a.tensors)
                elif kind == _SPARSE_TENSOR:
                    sparse.append(a.sparse_tensor)
                elif kind == _SPARSE_TENSORS:
                    sparse.extend(a.sparse_tensors)
                elif kind == _GRAPH:
                    stack.append(a.g)
                elif kind == _GRAPHS:
                    stack.extend(a.graphs)
    for s in sparse:
        tensors.append(s.values)
        tensors.append(s.indices)
    return tensors, sparse


def function_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """The tensor attributes of the model's function bodies (what ``model_tensors`` adds to the graph's)."""
    for f in model.functions:
        for n in f.node:
            for a in n.attribute:
                if a.type == AttributeProto.TENSOR:
                    yield a.t


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


def load_external(model: onnx.ModelProto, base_dir: Path, source: str, lazy_above: int | None = None,
                  graph_tensors: list[onnx.TensorProto] | None = None) -> list[Path]:
    """Validate, then read every external tensor's bytes into ``raw_data`` (in place); returns the
    data files read. With ``lazy_above``, when the model's external data add up to more than that many
    bytes, the main graph's initializers of at least ``LAZY_TENSOR_BYTES`` stay references (``keep_lazy``):
    their bytes are read only when a pass asks for the value and streamed when the model is saved.
    ``graph_tensors``: ``iter_tensors(model.graph)`` as a list, when the caller has it (``scan_tensors``)."""
    files: list[Path] = []
    if lazy_above is not None:
        refs = [(t, resolve_location(base_dir, t, source)) for t in model.graph.initializer if is_external(t)]
        total = sum(_span(path, offset, length) for _, (path, offset, length) in refs)
        if total > lazy_above:
            for t, (path, offset, length) in refs:
                span = _span(path, offset, length)
                # a span that does not fit the dims is read, so that check_tensor refuses it as before
                if span >= LAZY_TENSOR_BYTES and span == _dims_bytes(t):
                    keep_lazy(t, base_dir)
                    if path not in files:
                        files.append(path)
    tensors = model_tensors(model) if graph_tensors is None else [*graph_tensors, *function_tensors(model)]
    for t in tensors:
        if not is_external(t) or is_lazy(t):
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


# ------------------------------------------------------------------------------------ lazy references
#: A main-graph initializer at least this large is left in its file by ``load_external(lazy_above=...)``.
LAZY_TENSOR_BYTES = 2**20
#: The key that marks a lazy reference: the validated folder its ``location`` is relative to. Input
#: models may not set it (``resolve_location`` refuses it), so every reference carrying it was made here.
_BASE_KEY = "basepath"
_CHUNK = 16 * 2**20


def _span(path: Path, offset: int, length: int | None) -> int:
    return length if length is not None else max(os.path.getsize(path) - offset, 0)


def _dims_bytes(t: onnx.TensorProto) -> int | None:
    """Bytes the dims of ``t`` need as raw data; None for types not stored one element per byte group."""
    if t.data_type in _NOT_BYTE_SIZED:
        return None
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except Exception:
        return None
    return int(np.prod([int(d) for d in t.dims], dtype=np.int64)) * itemsize


_NOT_BYTE_SIZED = {onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING,
                   *(getattr(onnx.TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2") if hasattr(onnx.TensorProto, n))}


def keep_lazy(t: onnx.TensorProto, base_dir: Path) -> None:
    """Mark the (validated) external tensor ``t`` as a lazy reference into ``base_dir``."""
    entry = t.external_data.add()
    entry.key = _BASE_KEY
    entry.value = os.path.realpath(base_dir)


def is_lazy(t: onnx.TensorProto) -> bool:
    return is_external(t) and any(e.key == _BASE_KEY for e in t.external_data)


def has_lazy(model: onnx.ModelProto) -> bool:
    return any(is_lazy(t) for t in model.graph.initializer)


def lazy_location(t: onnx.TensorProto) -> tuple[Path, int, int]:
    """(file, offset, length) of a lazy reference, validated again (the file may have changed since)."""
    plain = onnx.TensorProto()
    plain.CopyFrom(t)
    del plain.external_data[:]
    base = ""
    for e in t.external_data:
        if e.key == _BASE_KEY:
            base = e.value
        else:
            plain.external_data.add(key=e.key, value=e.value)
    path, offset, length = resolve_location(Path(base), plain, base)
    return path, offset, _span(path, offset, length)


def read_lazy(t: onnx.TensorProto) -> onnx.TensorProto:
    """A copy of the lazy reference ``t`` holding its bytes (``raw_data``)."""
    path, offset, length = lazy_location(t)
    out = onnx.TensorProto()
    out.CopyFrom(t)
    del out.external_data[:]
    out.data_location = onnx.TensorProto.DEFAULT
    with open(path, "rb") as f:
        f.seek(offset)
        out.raw_data = f.read(length)
    if len(out.raw_data) != length:
        raise UnsafeExternalData(f"{path}: tensor {t.name!r} was cut short (the data file changed while graphopt ran)")
    return out


_PLAIN_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BOOL,
                *(getattr(onnx.TensorProto, f"{s}INT{b}") for s in ("", "U") for b in (8, 16, 32, 64))}


def lazy_array(t: onnx.TensorProto) -> np.ndarray:
    """The value of the lazy reference ``t``, read straight into one (read-only) array."""
    if t.data_type not in _PLAIN_TYPES:
        return numpy_helper.to_array(read_lazy(t))
    path, offset, length = lazy_location(t)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
    dims = tuple(int(d) for d in t.dims)
    count = int(np.prod(dims, dtype=np.int64))
    if count * dtype.itemsize != length:
        raise UnsafeExternalData(f"{path}: tensor {t.name!r} holds {length} bytes, its dims {list(dims)} need "
                                 f"{count * dtype.itemsize}")
    arr = np.fromfile(path, dtype=dtype, count=count, offset=offset)
    if arr.size != count:
        raise UnsafeExternalData(f"{path}: tensor {t.name!r} was cut short (the data file changed while graphopt ran)")
    arr = arr.reshape(dims)
    arr.setflags(write=False)
    return arr


def stream_lazy(t: onnx.TensorProto, length: int) -> Iterator[bytes | int]:
    """The bytes of the lazy reference ``t`` in chunks, never all at once. A hole of the source file (a
    sparse file) comes as an int, the number of zero bytes to skip, so the copy stays sparse too."""
    path, offset, have = lazy_location(t)
    if have != length:
        raise UnsafeExternalData(f"{path}: tensor {t.name!r} holds {have} bytes, its dims need {length}")
    end = offset + length
    with open(path, "rb") as f:
        fd = f.fileno()
        at = offset
        while at < end:
            data_at = _seek(fd, at, getattr(os, "SEEK_DATA", None))
            if data_at is None:  # no holes known: plain reads
                data_at, hole_at = at, end
            elif data_at >= end:
                yield end - at
                return
            else:
                hole_at = min(_seek(fd, data_at, getattr(os, "SEEK_HOLE", None)) or end, end)
            if data_at > at:
                yield data_at - at
            f.seek(data_at)
            at = data_at
            while at < hole_at:
                chunk = f.read(min(_CHUNK, hole_at - at))
                if not chunk:
                    raise UnsafeExternalData(f"{path}: tensor {t.name!r} was cut short (the data file changed while graphopt ran)")
                yield chunk
                at += len(chunk)


def _seek(fd: int, at: int, whence: int | None) -> int | None:
    """``lseek(fd, at, whence)``; None where SEEK_DATA/SEEK_HOLE are unknown. Past the last data
    (ENXIO) it answers the file's size."""
    if whence is None:
        return None
    try:
        return os.lseek(fd, at, whence)
    except OSError as e:
        if e.errno == errno.ENXIO:
            return os.fstat(fd).st_size
        return None


def check_external(model: onnx.ModelProto, base_dir: Path, source: str,
                   graph_tensors: list[onnx.TensorProto] | None = None) -> list[Path]:
    """Validate every external reference without reading; returns the data files used.
    ``graph_tensors``: as for ``load_external``."""
    files: list[Path] = []
    for t in model_tensors(model) if graph_tensors is None else [*graph_tensors, *function_tensors(model)]:
        if is_external(t):
            path, _, _ = resolve_location(base_dir, t, source)
            if path not in files:
                files.append(path)
    return files
