"""Hostile model files for part 1 of issue 6: each builder writes one case into an empty folder and
returns ``(model path, the GraphoptError subclass graphopt must refuse it with)``.

Every case is a single defect in an otherwise valid model, so a refusal can only come from the
check that targets that defect.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphopt.errors import InvalidGraph, InvalidModel, UnsafeExternalData, UnsupportedModel
from tests.robustness._models import conv_relu, externalize, sparse_model

Case = Callable[[Path], tuple[Path, type]]
CASES: dict[str, Case] = {}


def case(name: str):
    def register(fn):
        CASES[name] = fn
        return fn

    return register


def _save(m: onnx.ModelProto, folder: Path, name: str = "m.onnx") -> Path:
    p = folder / name
    p.write_bytes(m.SerializeToString())  # no onnx.save: it would check or rewrite external data
    return p


def _raw(folder: Path, data: bytes) -> Path:
    p = folder / "m.onnx"
    p.write_bytes(data)
    return p


# ------------------------------------------------------------------ not a model
@case("empty file")
def _(d):
    return _raw(d, b""), InvalidModel


@case("random bytes")
def _(d):
    return _raw(d, np.random.default_rng(7).bytes(4096)), InvalidModel


@case("random bytes (valid protobuf varint start)")
def _(d):
    return _raw(d, b"\x08\x07" + np.random.default_rng(8).bytes(512)), InvalidModel


@case("truncated at 1/2")
def _(d):
    data = conv_relu().SerializeToString()
    return _raw(d, data[: len(data) // 2]), InvalidModel


@case("truncated by one byte")
def _(d):
    data = conv_relu().SerializeToString()
    return _raw(d, data[:-1]), InvalidModel


@case("another protobuf: TensorProto")
def _(d):
    return _raw(d, numpy_helper.from_array(np.ones((3, 3), np.float32), "t").SerializeToString()), InvalidModel


@case("another protobuf: GraphProto")
def _(d):
    return _raw(d, conv_relu().graph.SerializeToString()), InvalidModel


@case("another protobuf: NodeProto")
def _(d):
    return _raw(d, helper.make_node("Relu", ["x"], ["y"]).SerializeToString()), InvalidModel


# ------------------------------------------------------------------ tensor data
def _init(m, name="w"):
    return next(t for t in m.graph.initializer if t.name == name)


@case("negative dim")
def _(d):
    m = conv_relu()
    _init(m).dims[0] = -8
    return _save(m, d), InvalidModel


@case("dims product overflows int64")
def _(d):
    m = conv_relu()
    _init(m).dims[:] = [2**31, 2**31, 2**31]
    return _save(m, d), InvalidModel


@case("raw_data shorter than dims")
def _(d):
    m = conv_relu()
    t = _init(m)
    t.raw_data = t.raw_data[:-4]
    return _save(m, d), InvalidModel


@case("raw_data longer than dims")
def _(d):
    m = conv_relu()
    t = _init(m)
    t.raw_data = t.raw_data + b"\0" * 4
    return _save(m, d), InvalidModel


@case("float_data count differs from dims")
def _(d):
    m = conv_relu()
    t = _init(m, "b")
    arr = numpy_helper.to_array(t)
    t.ClearField("raw_data")
    t.float_data.extend(arr.tolist()[:-1])
    return _save(m, d), InvalidModel


@case("Constant value tensor with short raw_data")
def _(d):
    m = conv_relu()
    c = numpy_helper.from_array(np.ones(8, np.float32), "k")
    c.raw_data = c.raw_data[:-4]
    m.graph.node.insert(0, helper.make_node("Constant", [], ["k"], value=c, name="k"))
    m.graph.node[-1].input[0] = "c"
    m.graph.node.append(helper.make_node("Add", ["y0", "k"], ["y"], name="add"))
    m.graph.node[-2].output[0] = "y0"
    m.graph.node[-1].input[1] = "k"
    # reshape k so it broadcasts over channels is unimportant: the file must be refused first
    return _save(m, d), InvalidModel


# ------------------------------------------------------------------ graph structure
@case("cycle")
def _(d):
    m = conv_relu()
    m.graph.node[0].input[0] = "y"
    return _save(m, d), InvalidGraph


@case("dangling input")
def _(d):
    m = conv_relu()
    m.graph.node[1].input[0] = "ghost"
    return _save(m, d), InvalidGraph


@case("duplicate graph output names")
def _(d):
    m = conv_relu()
    m.graph.output.append(m.graph.output[0])
    return _save(m, d), InvalidGraph


@case("two nodes produce one tensor")
def _(d):
    m = conv_relu()
    m.graph.node.append(helper.make_node("Identity", ["x"], ["c"], name="dup"))
    return _save(m, d), InvalidGraph


@case("graph output nobody produces")
def _(d):
    m = conv_relu()
    m.graph.output.append(helper.make_tensor_value_info("nowhere", TensorProto.FLOAT, [1]))
    return _save(m, d), InvalidGraph


@case("opset too old")
def _(d):
    m = conv_relu()
    m.opset_import[0].version = 6
    return _save(m, d), UnsupportedModel


@case("opset from the future")
def _(d):
    m = conv_relu()
    m.opset_import[0].version = 999
    return _save(m, d), UnsupportedModel


@case("ir_version from the future")
def _(d):
    m = conv_relu()
    m.ir_version = 99
    return _save(m, d), UnsupportedModel


@case("ir_version too old")
def _(d):
    m = conv_relu()
    m.ir_version = 2
    return _save(m, d), UnsupportedModel


@case("no default-domain opset")
def _(d):
    m = conv_relu()
    m.opset_import[0].domain = "acme"
    return _save(m, d), UnsupportedModel


@case("unknown domain without a function")
def _(d):
    m = conv_relu()
    m.graph.node[1].domain = "acme.ops"
    m.opset_import.append(helper.make_opsetid("acme.ops", 1))
    return _save(m, d), UnsupportedModel


@case("unknown domain inside an If branch")
def _(d):
    m = conv_relu()
    then = helper.make_graph([helper.make_node("Secret", ["c"], ["t"], domain="acme.ops", name="s")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["c"], ["e"], name="i")], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    m.graph.initializer.append(numpy_helper.from_array(np.array(True), "flag"))
    m.graph.node[1].op_type = "If"
    del m.graph.node[1].input[:]
    m.graph.node[1].input.append("flag")
    m.graph.node[1].attribute.extend([helper.make_attribute("then_branch", then), helper.make_attribute("else_branch", other)])
    m.opset_import.append(helper.make_opsetid("acme.ops", 1))
    return _save(m, d), UnsupportedModel


# ------------------------------------------------------------------ external data
def _ext(d: Path, location: str, **kw) -> Path:
    return _save(externalize(conv_relu(), d, location, **kw), d)


def _ext_then(d: Path, location: str, prepare) -> Path:
    """External reference to ``location``, written nowhere; ``prepare(d)`` puts something there."""
    p = _save(externalize(conv_relu(), d, location, write=False), d)
    prepare(d)
    return p


def _weights() -> bytes:
    return _init(conv_relu()).raw_data


@case("external: absolute path")
def _(d):
    (d / "w.bin").write_bytes(_weights())
    return _ext(d, str((d / "w.bin").resolve()), write=False), UnsafeExternalData


@case("external: absolute /etc/passwd")
def _(d):
    return _ext(d, "/etc/passwd", write=False), UnsafeExternalData


@case("external: ../ escape")
def _(d):
    (d.parent / f"{d.name}-outside.bin").write_bytes(_weights())
    return _ext(d, f"../{d.name}-outside.bin", write=False), UnsafeExternalData


@case("external: nested a/../../x")
def _(d):
    (d / "a").mkdir()
    (d.parent / f"{d.name}-x.bin").write_bytes(_weights())
    return _ext(d, f"a/../../{d.name}-x.bin", write=False), UnsafeExternalData


@case("external: a/../w.bin (stays inside, still refused: no '..' at all)")
def _(d):
    (d / "a").mkdir()
    (d / "w.bin").write_bytes(_weights())
    return _ext(d, "a/../w.bin", write=False), UnsafeExternalData


@case("external: backslash ..\\ escape")
def _(d):
    return _ext(d, "..\\x.bin", write=False), UnsafeExternalData


@case("external: symlink to a file outside")
def _(d):
    out = d.parent / f"{d.name}-target.bin"
    out.write_bytes(_weights())
    return _ext_then(d, "w.bin", lambda d: os.symlink(out, d / "w.bin")), UnsafeExternalData


@case("external: symlink to a file inside")
def _(d):
    def prep(d):
        (d / "real.bin").write_bytes(_weights())
        os.symlink("real.bin", d / "w.bin")

    return _ext_then(d, "w.bin", prep), UnsafeExternalData


@case("external: under a symlinked folder")
def _(d):
    out = d.parent / f"{d.name}-dir"
    out.mkdir()
    (out / "w.bin").write_bytes(_weights())
    return _ext_then(d, "sub/w.bin", lambda d: os.symlink(out, d / "sub")), UnsafeExternalData


@case("external: hardlink to a file elsewhere")
def _(d):
    out = d.parent / f"{d.name}-hard.bin"
    out.write_bytes(_weights())
    return _ext_then(d, "w.bin", lambda d: os.link(out, d / "w.bin")), UnsafeExternalData


@case("external: missing file")
def _(d):
    return _ext(d, "w.bin", write=False), UnsafeExternalData


@case("external: folder in its place")
def _(d):
    return _ext_then(d, "w.bin", lambda d: (d / "w.bin").mkdir()), UnsafeExternalData


@case("external: FIFO in its place")
def _(d):
    return _ext_then(d, "w.bin", lambda d: os.mkfifo(d / "w.bin")), UnsafeExternalData


@case("external: /dev/zero via a relative symlink")
def _(d):
    return _ext_then(d, "w.bin", lambda d: os.symlink("/dev/zero", d / "w.bin")), UnsafeExternalData


@case("external: offset beyond the file")
def _(d):
    p = _ext(d, "w.bin")
    m = onnx.load(p, load_external_data=False)
    for e in _init(m).external_data:
        if e.key == "offset":
            e.value = "100000"
    return _save(m, d), UnsafeExternalData


@case("external: offset+length beyond the file")
def _(d):
    return _ext(d, "w.bin", offset=0, length=len(_weights()) + 4), UnsafeExternalData


@case("external: length shorter than the dims need")
def _(d):
    return _ext(d, "w.bin", length=len(_weights()) - 4), InvalidModel


@case("external: negative offset")
def _(d):
    return _ext(d, "w.bin", extra={"offset": "-4"}), UnsafeExternalData


@case("external: non-integer length")
def _(d):
    return _ext(d, "w.bin", extra={"length": "lots"}), UnsafeExternalData


@case("external: unknown key")
def _(d):
    return _ext(d, "w.bin", extra={"exec": "rm -rf /"}), UnsafeExternalData


@case("external: basepath key")
def _(d):
    return _ext(d, "w.bin", extra={"basepath": "/etc"}), UnsafeExternalData


@case("external: no location")
def _(d):
    return _ext(d, "", write=False), UnsafeExternalData


@case("external: NUL byte in location")
def _(d):
    return _ext(d, "w.bin\x00../../etc/passwd", write=False), UnsafeExternalData


@case("external: the model file itself (too short for the data)")
def _(d):
    return _ext(d, "m.onnx", write=False), UnsafeExternalData


# ------------------------------------------------------------------ sparse tensors
def _sparse(d, values, indices, dims, *, constant, external=None):
    m = sparse_model(np.asarray(values, np.float32), np.asarray(indices, np.int64), dims, as_constant=constant)
    if external is not None:
        if constant:
            sp = m.graph.node[0].attribute[0].sparse_tensor
        else:
            sp = m.graph.sparse_initializer[0]
        t = sp.values
        raw = t.raw_data
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for k, v in {"location": external, "offset": "0", "length": str(len(raw))}.items():
            t.external_data.add(key=k, value=v)
    return _save(m, d)


for _constant, _kind in ((False, "sparse initializer"), (True, "Constant sparse_value")):

    def _register(constant=_constant, kind=_kind):
        @case(f"{kind}: negative dense dim")
        def _(d):
            return _sparse(d, [1, 2], [0, 1], [-5], constant=constant), InvalidModel

        @case(f"{kind}: dense dims overflow")
        def _(d):
            return _sparse(d, [1, 2], [0, 1], [2**40, 2**40], constant=constant), InvalidModel

        @case(f"{kind}: index out of range")
        def _(d):
            return _sparse(d, [1, 2], [0, 9], [5], constant=constant), InvalidModel

        @case(f"{kind}: negative index")
        def _(d):
            return _sparse(d, [1, 2], [0, -1], [5], constant=constant), InvalidModel

        @case(f"{kind}: more indices than values")
        def _(d):
            return _sparse(d, [1, 2], [0, 1, 2], [5], constant=constant), InvalidModel

        @case(f"{kind}: values raw_data short")
        def _(d):
            p = _sparse(d, [1, 2], [0, 3], [5], constant=constant)
            m = onnx.load(p)
            sp = m.graph.node[0].attribute[0].sparse_tensor if constant else m.graph.sparse_initializer[0]
            sp.values.raw_data = sp.values.raw_data[:-2]
            return _save(m, d), InvalidModel

        @case(f"{kind}: values external ../ escape")
        def _(d):
            return _sparse(d, [1, 2], [0, 3], [5], constant=constant, external="../v.bin"), UnsafeExternalData

        @case(f"{kind}: values external absolute")
        def _(d):
            return _sparse(d, [1, 2], [0, 3], [5], constant=constant, external="/etc/passwd"), UnsafeExternalData

        @case(f"{kind}: values external symlink")
        def _(d):
            (d.parent / f"{d.name}-v.bin").write_bytes(np.array([1, 2], np.float32).tobytes())
            os.symlink(d.parent / f"{d.name}-v.bin", d / "v.bin")
            return _sparse(d, [1, 2], [0, 3], [5], constant=constant, external="v.bin"), UnsafeExternalData

    _register()


# ------------------------------------------------------------------ nesting
def nested_if(depth: int) -> onnx.ModelProto:
    """``depth`` If nodes, each in the then-branch of the previous one; the innermost returns x.
    Built in place, top down: python-protobuf (upb) copies messages through its parser, which refuses
    more than 100 nested messages, so ``make_graph([node])`` cannot build deep nesting."""
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    model = helper.make_model(
        helper.make_graph([], "top", [helper.make_tensor_value_info("cond", TensorProto.BOOL, []), vi("x")], [vi(f"o{depth}")]),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    g = model.graph
    for i in range(depth, 0, -1):
        node = g.node.add(op_type="If", name=f"if{i}", input=["cond"], output=[f"o{i}"])
        node.attribute.add(name="else_branch", type=onnx.AttributeProto.GRAPH).g.CopyFrom(
            helper.make_graph([helper.make_node("Neg", ["x"], [f"e{i}"], name=f"e{i}")], f"e{i}", [], [vi(f"e{i}")]))
        g = node.attribute.add(name="then_branch", type=onnx.AttributeProto.GRAPH).g
        g.name = f"b{i}"
        g.output.append(vi(f"o{i - 1}"))
    g.node.append(helper.make_node("Identity", ["x"], ["o0"], name="id"))
    return model
