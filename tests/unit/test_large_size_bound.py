"""``graphopt.ir.large.size_bound``: an upper bound of a model's serialized size that never
serializes its weights (upb's ByteSize encodes the whole message: 2.6 s for GPT-2 124M)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphopt.ir import large


def _model(rng):
    w = numpy_helper.from_array(rng.standard_normal((64, 33)).astype(np.float32), "w")  # raw bytes
    typed = helper.make_tensor("t", TensorProto.INT64, [5], [1, -2, 3 << 40, 4, 5])  # typed values
    strings = helper.make_tensor("s", TensorProto.STRING, [2], [b"abc", b"\x00" * 300])
    ext = TensorProto(name="e", data_type=TensorProto.FLOAT, dims=[1 << 20], data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "w.bin"), ("offset", "0"), ("length", str(4 << 20))):
        ext.external_data.add(key=k, value=v)
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones((7, 3), np.float16)))
    g = helper.make_graph([const, helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 33])], [w, typed, strings, ext])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_model_with_little_weight_data_is_sized_exactly(rng):
    model = _model(rng)
    assert large.size_bound(model) == model.ByteSize()


def test_the_bound_is_at_least_the_serialized_size(rng, monkeypatch):
    monkeypatch.setattr(large, "WEIGHTLESS_ABOVE", 1000)  # the model counts as heavy: bounded, not encoded
    model = _model(rng)
    exact = model.ByteSize()
    bound = large.size_bound(model)
    assert exact <= bound <= exact + 64 * 4 + 4096


def test_the_bound_never_sizes_the_whole_model(rng, monkeypatch):
    monkeypatch.setattr(large, "WEIGHTLESS_ABOVE", 1000)
    model = _model(rng)
    sized = []
    real = onnx.ModelProto.ByteSize

    def spy(self):
        sized.append(len(self.graph.initializer))
        return real(self)

    monkeypatch.setattr(onnx.ModelProto, "ByteSize", spy)
    large.size_bound(model)
    assert sized == [0]  # only the copy without the initializers
