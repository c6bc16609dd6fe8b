"""Small model builders shared by the robustness tests (onnx.helper only, deterministic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def conv_relu(opset: int = 13, seed: int = 0) -> onnx.ModelProto:
    """Conv(+bias) -> Relu: the smallest model a shipped rule fuses."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 7, 7])],
        [w, b],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def externalize(model: onnx.ModelProto, folder: Path, location: str, *, write: bool = True,
                offset: int = 0, length: int | None = None, extra: dict | None = None,
                tensor: str = "w") -> onnx.ModelProto:
    """Move initializer ``tensor``'s bytes to ``folder/location`` (unless ``write`` is False) and
    point the tensor at it with the given offset/length/extra keys. Returns the changed model."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    t = next(t for t in m.graph.initializer if t.name == tensor)
    raw = t.raw_data
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset), "length": str(len(raw) if length is None else length)}
    entries.update(extra or {})
    for k, v in entries.items():
        t.external_data.add(key=k, value=v)
    if write:
        target = folder / location
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"\0" * offset + raw)
    return m


def sparse_model(values: np.ndarray, indices: np.ndarray, dims: list[int], *, as_constant: bool) -> onnx.ModelProto:
    """y = x + dense(sparse): the sparse tensor is a sparse initializer or a Constant's sparse_value."""
    sp = helper.make_sparse_tensor(
        numpy_helper.from_array(values.astype(np.float32), "s"),
        numpy_helper.from_array(indices.astype(np.int64), "s_idx"),
        dims,
    )
    n = int(np.prod(dims)) if dims else 1
    nodes = []
    if as_constant:
        nodes.append(helper.make_node("Constant", [], ["s"], sparse_value=sp, name="const"))
    nodes.append(helper.make_node("Add", ["x", "s"], ["y"], name="add"))
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [max(n, 1)])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [max(n, 1)])],
        [],
        sparse_initializer=[] if as_constant else [sp],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
