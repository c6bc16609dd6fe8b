"""Weights left in their files (lazy references, ``graphopt.ir.external``): read only when a value is
needed, streamed (holes kept) when saved, validated again when read, and equal to an eager load."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphopt.errors import UnsafeExternalData
from graphopt.ir import load_model, save_model, to_model
from graphopt.ir.external import has_lazy, is_lazy, stream_lazy
from graphopt.ir.large import materialize

W = np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 7  # 8 KB
B = np.linspace(-1, 1, 32, dtype=np.float32)


def _model(folder, gap: int = 0):
    """x @ w + b; w (and b) in model.onnx.data, w after a ``gap`` of zero bytes (a hole when large)."""
    with open(folder / "model.onnx.data", "wb") as f:
        f.seek(gap)
        f.write(W.tobytes())
        f.write(B.tobytes())
    inits = []
    for name, arr, off in (("w", W, gap), ("b", B, gap + W.nbytes)):
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=arr.shape, data_location=TensorProto.EXTERNAL)
        for k, v in (("location", "model.onnx.data"), ("offset", str(off)), ("length", str(arr.nbytes))):
            t.external_data.add(key=k, value=v)
        inits.append(t)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])], inits)
    path = folder / "model.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


@pytest.fixture
def small_lazy(monkeypatch):
    import graphopt.ir.external as ext

    monkeypatch.setattr(ext, "LAZY_TENSOR_BYTES", 1024)


def test_large_weights_stay_in_their_file_and_read_on_demand(tmp_path, small_lazy):
    g = load_model(_model(tmp_path), lazy_above=0)
    w = g.initializer("w")
    assert is_lazy(w) and not w.HasField("raw_data")
    assert not is_lazy(g.initializer("b")) and g.initializer("b").HasField("raw_data")  # under 1 KB: read
    assert g.constant_info("w")[1] == (64, 32) and g.constant_info("w")[0] == np.float32
    np.testing.assert_array_equal(g.constant_value("w"), W)
    np.testing.assert_array_equal(g.constant_value("b"), B)


def test_small_models_and_default_loads_read_every_weight(tmp_path, small_lazy):
    src = _model(tmp_path)
    for g in (load_model(src), load_model(src, lazy_above=10**9)):
        assert not has_lazy(to_model(g))
        np.testing.assert_array_equal(g.constant_value("w"), W)


@pytest.mark.parametrize("external", [True, False])
def test_save_streams_the_weights_and_equals_an_eager_round_trip(tmp_path, small_lazy, external):
    src = _model(tmp_path, gap=3 * 2**20)
    data_before = (tmp_path / "model.onnx.data").read_bytes()
    lazy = load_model(src, lazy_above=0)
    out = tmp_path / "out" / "lazy.onnx"
    out.parent.mkdir()
    save_model(lazy, out, external_data=external, min_external_tensor_bytes=16)
    eager = load_model(src)
    ref = tmp_path / "out" / "eager.onnx"
    save_model(eager, ref, external_data=external, min_external_tensor_bytes=16)
    a, b = load_model(out), load_model(ref)
    for name in ("w", "b"):
        np.testing.assert_array_equal(a.constant_value(name), b.constant_value(name))
    assert (tmp_path / "out" / "lazy.onnx.data").exists() == external
    assert (tmp_path / "model.onnx.data").read_bytes() == data_before  # the input is never modified
    onnx.checker.check_model(str(out), full_check=True)


def test_a_hole_in_the_source_stays_a_hole_in_the_copy(tmp_path, small_lazy):
    """A sparse data file is copied sparse: the zero run comes as an int (skipped by the writer)."""
    big = np.zeros(8 * 2**20 // 4, np.float32)
    big[-4:] = 1.0
    path = tmp_path / "d.bin"
    with open(path, "wb") as f:
        f.seek(big.nbytes - 16)
        f.write(big[-4:].tobytes())
    t = TensorProto(name="z", data_type=TensorProto.FLOAT, dims=big.shape, data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "d.bin"), ("offset", "0"), ("length", str(big.nbytes)), ("basepath", str(tmp_path))):
        t.external_data.add(key=k, value=v)
    chunks = list(stream_lazy(t, big.nbytes))
    assert sum(c if isinstance(c, int) else len(c) for c in chunks) == big.nbytes
    if os.stat(path).st_blocks * 512 < big.nbytes // 2:  # the filesystem keeps holes
        assert any(isinstance(c, int) for c in chunks)
    data = b"".join(bytes(c) if isinstance(c, int) else c for c in chunks)
    assert data == big.tobytes()


def test_a_data_file_cut_short_after_loading_is_refused_not_read_short(tmp_path, small_lazy):
    g = load_model(_model(tmp_path), lazy_above=0)
    os.truncate(tmp_path / "model.onnx.data", 100)
    with pytest.raises(UnsafeExternalData):
        g.constant_value("w")
    with pytest.raises(UnsafeExternalData):
        save_model(g, tmp_path / "o.onnx", external_data=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]  # nothing left


def test_a_data_file_swapped_for_a_symlink_after_loading_is_refused(tmp_path, small_lazy):
    g = load_model(_model(tmp_path), lazy_above=0)
    data = tmp_path / "model.onnx.data"
    os.replace(data, tmp_path / "elsewhere.bin")
    data.symlink_to(tmp_path / "elsewhere.bin")
    with pytest.raises(UnsafeExternalData):
        g.constant_value("w")


def test_materialize_reads_every_lazy_weight_into_a_copy(tmp_path, small_lazy):
    model = to_model(load_model(_model(tmp_path), lazy_above=0))
    full = materialize(model)
    assert has_lazy(model) and not has_lazy(full)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(full.graph.initializer[0]), W)
    assert materialize(full) is full


def test_an_input_setting_basepath_is_still_refused(tmp_path):
    src = _model(tmp_path)
    m = onnx.load(str(src), load_external_data=False)
    m.graph.initializer[0].external_data.add(key="basepath", value="/")
    src.write_bytes(m.SerializeToString())
    with pytest.raises(UnsafeExternalData, match="basepath"):
        load_model(src, lazy_above=0)


def _conv_bn_mlp(folder):
    """Conv -> BatchNormalization -> Relu -> Flatten -> MatMul -> Add, every tensor external: the
    Conv+BN fold reads the (lazy) conv weight, the MatMul weight is only carried through."""
    rng = np.random.default_rng(3)
    arrays = {"cw": rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "cb": rng.standard_normal(16).astype(np.float32),
              "s": rng.random(16).astype(np.float32) + 0.5, "bb": rng.standard_normal(16).astype(np.float32),
              "mu": rng.standard_normal(16).astype(np.float32), "var": rng.random(16).astype(np.float32) + 0.5,
              "w": rng.standard_normal((16 * 8 * 8, 32)).astype(np.float32), "b": rng.standard_normal(32).astype(np.float32)}
    inits, offset = [], 0
    with open(folder / "model.onnx.data", "wb") as f:
        for name, arr in arrays.items():
            f.write(arr.tobytes())
            t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=arr.shape, data_location=TensorProto.EXTERNAL)
            for k, v in (("location", "model.onnx.data"), ("offset", str(offset)), ("length", str(arr.nbytes))):
                t.external_data.add(key=k, value=v)
            offset += arr.nbytes
            inits.append(t)
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])], inits)
    path = folder / "model.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


@pytest.mark.parametrize("options", [{}, {"verify": True}, {"precision": "fp16"}])
def test_optimizing_with_weights_left_in_files_gives_the_same_bytes(tmp_path, monkeypatch, options):
    """The lazy path (every weight over 1 KB left in its file) writes byte for byte what the eager path
    writes, with the folds that read a weight (Conv+BN) and --verify / fp16 on top."""
    import graphopt.ir.external as ext
    import graphopt.pipeline as pipeline

    src = _conv_bn_mlp(tmp_path)
    eager = tmp_path / "eager.onnx"
    pipeline.optimize_file(src, eager, gpu="none", **options)
    monkeypatch.setattr(ext, "LAZY_TENSOR_BYTES", 1024)
    monkeypatch.setattr(pipeline, "WEIGHTLESS_ABOVE", 0)
    seen = []
    real = pipeline.load_model
    monkeypatch.setattr(pipeline, "load_model", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    lazy = tmp_path / "lazy.onnx"
    _, report = pipeline.optimize_file(src, lazy, gpu="none", **options)
    assert has_lazy(seen[0].source_model)  # the weights really were left in the file
    assert report.cleanup.get("fold_conv_bn") == 1 and report.rewrites == {"conv_relu": 1, "matmul_bias": 1}
    assert lazy.read_bytes() == eager.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eager.onnx", "lazy.onnx", "model.onnx", "model.onnx.data"]


def test_a_weight_whose_length_does_not_fit_its_dims_is_refused_at_load_as_before(tmp_path, small_lazy):
    src = _model(tmp_path)
    m = onnx.load(str(src), load_external_data=False)
    m.graph.initializer[0].dims[0] = 63  # 63 x 32 floats, 8 KB of data
    src.write_bytes(m.SerializeToString())
    from graphopt.errors import InvalidModel

    with pytest.raises(InvalidModel, match="raw_data"):
        load_model(src, lazy_above=0)
