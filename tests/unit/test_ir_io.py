"""Load/save: lossless round trips, validation errors, safe external data, atomic writes."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.errors import InputNotFound, InvalidGraph, InvalidModel, OutputRefused, UnsafeExternalData, UnsupportedModel
from graphopt.ir import from_model, load_model, save_model, to_model
from tests.conftest import run_ort

ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
SHIPPED = sorted(glob.glob(str(ONNX_DATA / "**" / "*.onnx"), recursive=True))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: os.path.relpath(p, ONNX_DATA))
def test_round_trip_is_byte_identical_on_onnx_shipped_models(path):
    original = onnx.load(path)
    # The IR itself round-trips every model, including the opset-6 ones load_model() refuses.
    out = to_model(from_model(original))
    assert out.SerializeToString(deterministic=True) == original.SerializeToString(deterministic=True)


def _conv_model(opset=13, weight=None):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(weight if weight is not None else rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 5, 5])],
        [w],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_round_trip_runs_identically_and_passes_full_check(tmp_path):
    m = _conv_model()
    src = tmp_path / "m.onnx"
    onnx.save(m, src)
    dst = tmp_path / "out.onnx"
    save_model(load_model(src), dst)
    onnx.checker.check_model(str(dst), full_check=True)
    x = np.random.default_rng(1).standard_normal((2, 3, 5, 5)).astype(np.float32)
    np.testing.assert_array_equal(run_ort(onnx.load(dst), {"x": x})[0], run_ort(m, {"x": x})[0])
    assert dst.read_bytes() == src.read_bytes()


@pytest.mark.parametrize(
    "content,error,match",
    [
        (b"", InvalidModel, "empty"),
        (os.urandom(1) + b"\xff\xff\xff\xff\xff\xff", InvalidModel, "not an ONNX model"),
        (numpy_helper.from_array(np.ones(3, np.float32)).SerializeToString(), InvalidModel, "not an ONNX model"),
    ],
)
def test_not_a_model(tmp_path, content, error, match):
    p = tmp_path / "bad.onnx"
    p.write_bytes(content)
    with pytest.raises(error, match=match):
        load_model(p)


def test_truncated_and_missing(tmp_path):
    data = _conv_model().SerializeToString()
    p = tmp_path / "t.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModel):
        load_model(p)
    with pytest.raises(InputNotFound, match="no such file"):
        load_model(tmp_path / "missing.onnx")


def test_unsupported_opset_and_ir_version(tmp_path):
    m = _conv_model(opset=13)
    m.opset_import[0].version = 8
    with pytest.raises(UnsupportedModel, match="opset 8"):
        load_model(m)
    m = _conv_model()
    m.ir_version = 99
    with pytest.raises(UnsupportedModel, match="ir_version 99"):
        load_model(m)
    m = _conv_model()
    m.graph.node[1].domain = "acme.ops"
    m.opset_import.append(helper.make_opsetid("acme.ops", 1))
    with pytest.raises(UnsupportedModel, match="no function definition"):
        load_model(m)


def test_bad_tensor_data():
    m = _conv_model()
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:-4]
    with pytest.raises(InvalidModel, match="raw_data"):
        load_model(m)
    m = _conv_model()
    m.graph.initializer[0].dims[0] = -4
    with pytest.raises(InvalidModel, match="negative"):
        load_model(m)
    m = _conv_model()
    m.graph.initializer[0].dims[:] = [2**40, 2**40]
    with pytest.raises(InvalidModel, match="overflow"):
        load_model(m)


def test_cycle_and_dangling_rejected_at_load():
    m = _conv_model()
    m.graph.node[0].input[0] = "y"
    with pytest.raises(InvalidGraph, match="cycle"):
        load_model(m)
    m = _conv_model()
    m.graph.node[0].input[0] = "ghost"
    with pytest.raises(InvalidGraph, match="ghost"):
        load_model(m)


# ---------------------------------------------------------------- external data
def _external_model(tmp_path: Path, location: str, *, write_data=True, offset=0, extra_key=None):
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    m = _conv_model(weight=w)
    t = m.graph.initializer[0]
    raw = t.raw_data
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset), "length": str(len(raw))}
    if extra_key:
        entries[extra_key] = "1"
    for k, v in entries.items():
        t.external_data.add(key=k, value=v)
    if write_data:
        target = tmp_path / location
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(raw)
    p = tmp_path / "model.onnx"
    onnx.save(m, p)
    return p, w


def test_external_data_loads(tmp_path):
    p, w = _external_model(tmp_path, "weights/w.bin")
    g = load_model(p)
    np.testing.assert_array_equal(g.constant_value("w"), w)


@pytest.mark.parametrize(
    "location,match",
    [
        ("/etc/passwd", "absolute"),
        ("../outside.bin", r"'\.\.'"),
        ("a/../../x.bin", r"'\.\.'"),
        ("missing.bin", "missing"),
    ],
)
def test_unsafe_locations_refused(tmp_path, location, match):
    p, _ = _external_model(tmp_path, "w.bin")
    m = onnx.load(p, load_external_data=False)
    for e in m.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = location
    onnx.save(m, p)
    before = p.read_bytes()
    with pytest.raises(UnsafeExternalData, match=match):
        load_model(p)
    assert p.read_bytes() == before


def test_symlink_hardlink_folder_fifo_offset_unknown_key(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    p, _ = _external_model(model_dir, "w.bin")
    (outside / "w.bin").write_bytes((model_dir / "w.bin").read_bytes())
    # a symlink in place of the file
    os.remove(model_dir / "w.bin")
    os.symlink(outside / "w.bin", model_dir / "w.bin")
    with pytest.raises(UnsafeExternalData, match="symbolic link"):
        load_model(p)
    # a file under a symlinked folder
    os.remove(model_dir / "w.bin")
    os.symlink(outside, model_dir / "sub")
    m = onnx.load(p, load_external_data=False)
    for e in m.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "sub/w.bin"
    onnx.save(m, p)
    with pytest.raises(UnsafeExternalData, match="symbolic link"):
        load_model(p)
    # a hard link to a file elsewhere
    os.remove(model_dir / "sub")
    os.mkdir(model_dir / "sub")
    os.link(outside / "w.bin", model_dir / "sub" / "w.bin")
    with pytest.raises(UnsafeExternalData, match="hard link"):
        load_model(p)
    # a folder in place of the file
    os.remove(model_dir / "sub" / "w.bin")
    os.mkdir(model_dir / "sub" / "w.bin")
    with pytest.raises(UnsafeExternalData, match="not a regular file"):
        load_model(p)
    # a FIFO in place of the file
    os.rmdir(model_dir / "sub" / "w.bin")
    os.mkfifo(model_dir / "sub" / "w.bin")
    with pytest.raises(UnsafeExternalData, match="not a regular file"):
        load_model(p)
    # offset beyond the file, and unknown keys
    q, _ = _external_model(tmp_path / "o", "w.bin", offset=10_000)
    with pytest.raises(UnsafeExternalData, match="beyond"):
        load_model(q)
    r, _ = _external_model(tmp_path / "k", "w.bin", extra_key="exec")
    with pytest.raises(UnsafeExternalData, match="unknown external-data key"):
        load_model(r)


# ---------------------------------------------------------------- saving
def test_save_refuses_input_by_inode_and_leaves_nothing(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_conv_model(), src)
    link = tmp_path / "alias.onnx"
    os.link(src, link)
    before = src.read_bytes()
    with pytest.raises(OutputRefused):
        save_model(load_model(src), link, protect=[src])
    assert src.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["alias.onnx", "m.onnx"]


def test_external_data_written_above_threshold_and_reloads(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_conv_model(), src)
    g = load_model(src)
    out = tmp_path / "big.onnx"
    save_model(g, out, size_threshold=10, min_external_tensor_bytes=16)  # pretend 10 bytes is the 2 GB limit
    assert (tmp_path / "big.onnx.data").exists()
    m = onnx.load(out, load_external_data=False)
    assert m.graph.initializer[0].data_location == TensorProto.EXTERNAL
    g2 = load_model(out)
    np.testing.assert_array_equal(g2.constant_value("w"), g.constant_value("w"))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_write_failure_leaves_no_partial_file(tmp_path, monkeypatch):
    src = tmp_path / "m.onnx"
    onnx.save(_conv_model(), src)
    g = load_model(src)
    out = tmp_path / "o.onnx"

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    from graphopt.errors import WriteFailed

    with pytest.raises(WriteFailed, match="No space left"):
        save_model(g, out)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]


REPO_MODELS = sorted(p for p in (Path(__file__).resolve().parents[2] / "models").rglob("*.onnx") if ".opt." not in p.name)


@pytest.mark.parametrize("path", REPO_MODELS, ids=lambda p: p.name)
def test_round_trip_is_byte_identical_on_every_model_in_models(path):
    original = onnx.load(path)
    graph = load_model(path)
    assert to_model(graph).SerializeToString(deterministic=True) == original.SerializeToString(deterministic=True)
