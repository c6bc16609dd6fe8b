"""Loading and saving models: validation on the way in, atomic writes on the way out.

``load_model`` turns every problem a user can cause into a one-line ``GraphoptError`` that names the
file: a missing or empty file, bytes that are not an ONNX model, a truncated file, unsupported opsets
or ir_versions, bad tensor data, unsafe external data, and graphs that are not DAGs.

``save_model`` never leaves a partial file at the destination: it writes a temporary file in the same
folder and renames it into place (``os.replace`` is atomic on POSIX). Models whose tensors exceed the
2 GB protobuf limit are written with their large tensors in one external-data file beside the model,
written the same way. onnx's ``save_model(save_as_external_data=True)`` writes the data file in place,
non-atomically, which is why this module writes the bytes itself.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from graphopt.errors import (
    InputNotFound,
    InvalidGraph,
    InvalidModel,
    OutputRefused,
    UnsupportedModel,
    WriteFailed,
)
from graphopt.files import Staged, atomic_write, regular_file
from graphopt.ir.convert import from_model, to_model
from graphopt.ir.external import check_external, is_external, load_external, scan_tensors
from graphopt.ir.graph import Graph
from graphopt.ir.datafile import PROTOBUF_LIMIT, serialize, stage_model

if TYPE_CHECKING:
    from graphopt.ir.ahead import InferAhead

MIN_OPSET = 9
MAX_OPSET = onnx.defs.onnx_opset_version()
MIN_IR_VERSION = 3
MAX_IR_VERSION = onnx.IR_VERSION
DEFAULT_EXTERNAL_THRESHOLD = 2**31 - 2**24  # leave headroom for the graph structure
# If/Loop/Scan bodies nested deeper than this are refused (no RecursionError, ever). python-protobuf (upb)
# parses at most 100 nested messages, and it copies through its parser (CopyFrom, extend), so a deeper
# model could be neither rebuilt nor saved nor re-read: each level costs 3 messages (graph, node, attribute),
# and value_info types and tensor attributes need a few more below the innermost graph.
MAX_NESTING = 30
KNOWN_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training", "com.microsoft", "graphopt"}


def _read_bytes(path: Path) -> bytes:
    """The model file's bytes: a regular file only (a device or FIFO would read forever or block), and no
    larger than protobuf can parse."""
    st = regular_file(path, "model")
    if st.st_size > PROTOBUF_LIMIT:
        raise InvalidModel(f"{path}: {st.st_size} bytes, over protobuf's 2 GB limit for one file; "
                           "save the model with its weights as external data")
    try:
        with open(path, "rb") as f:
            return f.read(PROTOBUF_LIMIT + 1)
    except OSError as e:
        raise InputNotFound(f"{path}: cannot read ({e.strerror})") from None


def parse_model(data: bytes, source: str) -> onnx.ModelProto:
    if not data:
        raise InvalidModel(f"{source}: the file is empty; expected an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        if "MaxDepth" in str(e) or "recursion" in str(e).lower():
            raise UnsupportedModel(
                f"{source}: the model is nested too deep for protobuf to parse (its limit is 100 nested messages, "
                "about 30 levels of If/Loop/Scan subgraphs); flatten the subgraph nesting"
            ) from None
        raise InvalidModel(f"{source}: not an ONNX model or truncated ({type(e).__name__}); re-export the model") from None
    if model.ir_version == 0 or not model.HasField("graph"):
        raise InvalidModel(f"{source}: not an ONNX model (no ir_version or graph); is this the right file?")
    return model


def check_header(model: onnx.ModelProto, source: str) -> None:
    if not MIN_IR_VERSION <= model.ir_version <= MAX_IR_VERSION:
        raise UnsupportedModel(
            f"{source}: ir_version {model.ir_version} is not supported (graphopt reads {MIN_IR_VERSION}..{MAX_IR_VERSION}); "
            "re-export with a current exporter"
        )
    default = [op.version for op in model.opset_import if op.domain in ("", "ai.onnx")]
    if not default:
        raise UnsupportedModel(f"{source}: the model imports no default-domain opset")
    if not MIN_OPSET <= default[0] <= MAX_OPSET:
        raise UnsupportedModel(
            f"{source}: opset {default[0]} is not supported (graphopt handles {MIN_OPSET}..{MAX_OPSET}); "
            "convert it with onnx.version_converter first"
        )
    local = {(f.domain, f.name) for f in model.functions}
    domains = {op.domain for op in model.opset_import}
    seen_graphs: set[int] = set()
    for g, node, attributes in _iter_nodes(model.graph, source):
        if id(g) not in seen_graphs:
            seen_graphs.add(id(g))
            _check_text(source, "graph", g.name, [g.name, *(v.name for v in (*g.input, *g.output, *g.value_info)),
                                                  *(t.name for t in g.initializer)])
        # each field read once: upb makes a new Python string on every read (20k nodes)
        name, op_type, domain = node.name, node.op_type, node.domain
        _check_text(source, "node", name, [name, op_type, domain, *node.input, *node.output,
                                           *(a.name for a in attributes)])
        if domain not in KNOWN_DOMAINS and (domain, op_type) not in local:
            raise UnsupportedModel(
                f"{source}: node {name or op_type!r} uses op {domain}.{op_type}, "
                "a custom domain with no function definition in the model; graphopt cannot run or verify it"
            )
        if domain not in domains and domain not in ("", "ai.onnx"):
            raise InvalidModel(f"{source}: node {name or op_type!r} uses domain {domain!r}, which the model does not import")


def _check_text(source: str, kind: str, owner, texts) -> None:
    """ONNX's string fields must be UTF-8. onnx's protos are proto2, so python-protobuf hands back
    ``bytes`` instead of refusing invalid UTF-8; catch that here, once, rather than as a TypeError later."""
    for t in texts:
        if isinstance(t, bytes):
            label = owner.decode("utf-8", "backslashreplace") if isinstance(owner, bytes) else owner
            raise InvalidModel(f"{source}: {kind} {label!r} has a name or field that is not valid UTF-8 "
                               f"({t.decode('utf-8', 'backslashreplace')!r}); the file is corrupt, re-export the model")


def _iter_nodes(gproto: onnx.GraphProto, source: str):
    """(graph, node, the node's attributes) for every node, subgraphs after their graph's nodes. The
    attributes are read once for the caller and for finding subgraphs (upb makes a Python object for
    each attribute on every read: 0.017 s a walk over a 20k-node model)."""
    stack = [(gproto, 0)]
    while stack:
        g, depth = stack.pop()
        if depth > MAX_NESTING:
            raise UnsupportedModel(f"{source}: subgraphs are nested too deep (If/Loop/Scan more than {MAX_NESTING} "
                                   "levels); graphopt refuses such models, flatten the subgraph nesting")
        for n in g.node:
            attributes = list(n.attribute)
            yield g, n, attributes
            for a in attributes:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append((a.g, depth + 1))
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack.extend((s, depth + 1) for s in a.graphs)


_FIELD_FOR_TYPE = {
    onnx.TensorProto.FLOAT: "float_data",
    onnx.TensorProto.COMPLEX64: "float_data",
    onnx.TensorProto.DOUBLE: "double_data",
    onnx.TensorProto.COMPLEX128: "double_data",
    onnx.TensorProto.INT64: "int64_data",
    onnx.TensorProto.UINT64: "uint64_data",
    onnx.TensorProto.UINT32: "uint64_data",
    onnx.TensorProto.STRING: "string_data",
}


def check_tensor(t: onnx.TensorProto, source: str) -> None:
    """Dims must be non-negative, their product must not overflow, and the data must match them."""
    count = 1
    for d in t.dims:
        if d < 0:
            raise InvalidModel(f"{source}: tensor {t.name!r} has a negative dimension {d}")
        count *= d
        if count >= 2**62:
            raise InvalidModel(f"{source}: tensor {t.name!r} has dimensions {list(t.dims)} whose product overflows")
    if is_external(t):
        return
    if t.data_type == onnx.TensorProto.UNDEFINED:
        raise InvalidModel(f"{source}: tensor {t.name!r} has no data type")
    if t.HasField("raw_data"):
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        except Exception:
            return  # exotic types (4-bit, float8 variants): leave them to onnx
        bits = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
        expected = (count + 1) // 2 if t.data_type in bits else count * itemsize
        if len(t.raw_data) != expected:
            raise InvalidModel(
                f"{source}: tensor {t.name!r} has {len(t.raw_data)} bytes of raw_data but dims {list(t.dims)} need {expected}"
            )
        return
    field = _FIELD_FOR_TYPE.get(t.data_type, "int32_data")
    n = len(getattr(t, field))
    if t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
        n //= 2
    if n != count and not (n == 0 and count == 0):
        raise InvalidModel(f"{source}: tensor {t.name!r} has {n} values but dims {list(t.dims)} need {count}")


def check_sparse(sp: onnx.SparseTensorProto, source: str) -> None:
    """A sparse tensor's dense dims must be non-negative without overflow, and its indices must fit
    them (onnx.checker's own sparse check does the index part once the data is in memory)."""
    name = sp.values.name
    count = 1
    for d in sp.dims:
        if d < 0:
            raise InvalidModel(f"{source}: sparse tensor {name!r} has a negative dimension {d}")
        count *= d
        if count >= 2**62:
            raise InvalidModel(f"{source}: sparse tensor {name!r} has dimensions {list(sp.dims)} whose product overflows")
    if is_external(sp.values) or is_external(sp.indices):
        return  # not loaded (load_external_data=False): the references themselves were validated
    try:
        onnx.checker.check_sparse_tensor(sp)
    except Exception as e:  # ValidationError, or the C++ checker's own exception types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InvalidModel(f"{source}: sparse tensor {name!r} is malformed: {first[:200]}") from None


def load_model(model_or_path: "str | os.PathLike | onnx.ModelProto", *, load_external_data: bool = True,
               base_dir: "str | os.PathLike | None" = None, lazy_above: int | None = None,
               ahead: "InferAhead | None" = None) -> Graph:
    """Load and validate a model into a ``Graph``. The input file is only read, never modified.

    With ``lazy_above`` (bytes), a model with more external data than that keeps its large weights in
    their files (``graphopt.ir.external.load_external``): ``Graph.constant_value`` reads one when a pass
    needs its value, and ``save_model`` streams them into the output's data file.

    ``ahead`` (``graphopt.ir.ahead.InferAhead``) starts the input's shape inference in a child while
    the IR is built. A model with all its data in the file is handed over right after parsing, the
    child checking its header first (``_HeaderCheck``); any other once it is validated."""
    if isinstance(model_or_path, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(model_or_path)
        source = "<model>"
        folder = Path(base_dir) if base_dir is not None else Path.cwd()
    else:
        path = Path(model_or_path)
        source = str(path)
        model = parse_model(_read_bytes(path), source)
        folder = Path(base_dir) if base_dir is not None else path.resolve().parent
    header = _HeaderCheck(ahead, model, source)
    try:
        tensors, sparse = scan_tensors(model.graph)  # one walk for the three checks below
        if header.ahead and any(is_external(t) for t in (*tensors, *(x for sp in sparse for x in (sp.values, sp.indices)))):
            header.here()  # inference needs the data loaded first: infer once it is (below)
        if load_external_data:
            data_files = load_external(model, folder, source, lazy_above, graph_tensors=tensors)
        else:
            data_files = check_external(model, folder, source, graph_tensors=tensors)
        for t in tensors:
            check_tensor(t, source)
        for sp in sparse:
            check_sparse(sp, source)
        if ahead is not None and not header.ahead:
            ahead.start(model)
        try:
            graph = from_model(model)
            graph.lint()
        except InvalidGraph as e:
            raise InvalidGraph(f"{source}: {e}") from None
    except Exception:
        header.confirm()  # a bad header is the error to report, not what it led to
        raise
    header.confirm()
    graph.source_path = None if isinstance(model_or_path, onnx.ModelProto) else str(Path(model_or_path))
    graph.data_files = [str(p) for p in data_files]
    graph.source_model = model  # the validated input, external data loaded (or lazy); verify compares against it
    return graph


class _HeaderCheck:
    """The header check of ``load_model``, done by ``ahead``'s child where it can be (``ahead`` true):
    the parent then builds the IR meanwhile and only ``confirm``s the child's verdict, running
    ``check_header`` itself when the child cannot vouch (the error is the same either way). Without a
    child it runs here, first, as always."""

    def __init__(self, ahead: "InferAhead | None", model: onnx.ModelProto, source: str) -> None:
        self._job = ahead, model, source
        self.ahead = ahead is not None and ahead.start(model, check=lambda m: check_header(m, source))
        if not self.ahead:
            check_header(model, source)

    def here(self) -> None:
        """Stop the child and check in this process now."""
        ahead, model, source = self._job
        ahead.cancel()
        self.ahead = False
        check_header(model, source)

    def confirm(self) -> None:
        ahead, model, source = self._job
        if self.ahead and not ahead.check_passed():
            self.ahead = False
            check_header(model, source)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _atomic_write(dest: Path, chunks) -> None:
    atomic_write(Path(dest), chunks)


def data_file_for(path: "str | os.PathLike") -> Path:
    """The external-data file ``save_model`` writes beside the model at ``path`` (when it writes one)."""
    dest = Path(path)
    return dest.with_name(dest.name + ".data")


def save_model(
    graph_or_model: "Graph | onnx.ModelProto",
    path: "str | os.PathLike",
    *,
    external_data: bool | None = None,
    size_threshold: int | None = None,
    protect: "list[str | os.PathLike]" = (),
    min_external_tensor_bytes: int = 1024,
    staged: "Staged | None" = None,
    serialized: bytes | None = None,
) -> Path:
    """Write atomically. ``external_data=None`` picks external data only when the model would exceed
    ``size_threshold``. Paths in ``protect`` (the input model and its data files) are never overwritten:
    compared by device and inode, not by name. With ``staged`` the files are only staged there (the
    caller commits them together with its other outputs); otherwise they are committed here.
    ``serialized``: the model's bytes (``graphopt.ir.large.small_bytes``) when the caller has them,
    written as they are when the model goes in one file."""
    model = to_model(graph_or_model) if isinstance(graph_or_model, Graph) else graph_or_model
    size_threshold = DEFAULT_EXTERNAL_THRESHOLD if size_threshold is None else size_threshold
    dest = Path(path)
    data_path = data_file_for(dest)
    for p in protect:
        for target in (dest, data_path):
            if _same_file(target, Path(p)):
                raise OutputRefused(f"{target}: refusing to overwrite the input {p}; choose another output path with -o")
    try:
        folder_ok = not str(dest.parent) or dest.parent.is_dir()
    except OSError as e:  # PermissionError on a folder we may not even look into
        raise WriteFailed(f"{dest}: cannot write ({e.strerror or e}); nothing was written") from None
    if not folder_ok:
        raise WriteFailed(f"{dest}: folder {dest.parent} does not exist")
    if staged is None:
        with Staged() as own:
            stage_model(own, model, dest, data_path, external_data, size_threshold, min_external_tensor_bytes,
                        serialized)
            own.commit()
    else:
        stage_model(staged, model, dest, data_path, external_data, size_threshold, min_external_tensor_bytes,
                    serialized)
    return dest


@contextmanager
def on_disk(model: onnx.ModelProto) -> Iterator[Path]:
    """The path of ``model`` written with its weights as external data into a temporary folder, removed
    on exit: for onnxruntime, which cannot take a model over 2 GB (or one whose weights are still in
    their files) as bytes. The weights are streamed, never held twice."""
    with tempfile.TemporaryDirectory(prefix="graphopt-model-") as tmp:
        path = Path(tmp) / "model.onnx"
        save_model(model, path, external_data=True)
        yield path


def model_bytes(graph: Graph) -> bytes:
    return serialize(to_model(graph))


def as_numpy_dtype(elem_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
