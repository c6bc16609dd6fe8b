"""Mutated model bytes and pathological structure: always a clean one-line error or a success,
never a traceback, a hang or a RecursionError."""

from __future__ import annotations

import random
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from graphopt.errors import GraphoptError
from graphopt.pipeline import optimize_model
from graphopt.ir.io import parse_model, load_model
from tests.conftest import run_graphopt
from tests.robustness._mutations import mutate

ROOT = Path(__file__).resolve().parents[2]
SEEDS = list(range(40))


_mutate = mutate


@pytest.mark.parametrize("seed", SEEDS)
def test_mutated_models_never_raise_anything_but_graphopt_errors(seed):
    rng = random.Random(seed)
    src = rng.choice(sorted((ROOT / "models").glob("*.onnx")))
    data = _mutate(src.read_bytes(), rng)
    try:
        model = parse_model(data, "<mutated>")
        graph = load_model(model)
        optimize_model(model, gpu="none")
        assert graph is not None
    except GraphoptError as e:
        assert "\n" not in str(e)


def test_mutated_models_through_the_cli_give_one_line_errors(tmp_path):
    rng = random.Random(1234)
    data = (ROOT / "models" / "mobilenetv2_style.onnx").read_bytes()
    for i in range(8):
        p = tmp_path / f"m{i}.onnx"
        p.write_bytes(_mutate(data, rng))
        r = run_graphopt("optimize", p, "-o", tmp_path / f"o{i}.onnx", "-q")
        assert "Traceback" not in r.stderr
        if r.returncode != 0:
            assert r.returncode != 1, r.stderr  # 1 would be an internal error (a bug)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("graphopt: error: "), r.stderr
            assert not (tmp_path / f"o{i}.onnx").exists()


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, written by hand so nesting needs no Python recursion."""
    key, size, out = (number << 3) | 2, len(payload), bytearray()
    for v in (key, size):
        while True:
            byte, v = v & 0x7F, v >> 7
            out.append(byte | (0x80 if v else 0))
            if not v:
                break
    return bytes(out) + payload


def _nested_if_bytes(depth: int) -> bytes:
    """A model whose If is nested `depth` deep in its then-branches (built as bytes, bottom up)."""
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    leaf = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "leaf", [], [out]).SerializeToString()
    shell = helper.make_graph([], "g", [], [out]).SerializeToString()
    body = leaf
    for _ in range(depth):
        then_attr = onnx.AttributeProto(name="then_branch", type=onnx.AttributeProto.GRAPH).SerializeToString() + _field(6, body)
        else_attr = onnx.AttributeProto(name="else_branch", type=onnx.AttributeProto.GRAPH).SerializeToString() + _field(6, leaf)
        node = onnx.NodeProto(op_type="If", input=["c"], output=["y"]).SerializeToString() + _field(5, then_attr) + _field(5, else_attr)
        body = shell + _field(1, node)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    main = helper.make_graph([], "main", inputs, [out]).SerializeToString() + body[len(shell):]  # the outer If node
    model = helper.make_model(helper.make_graph([], "m", [], []), opset_imports=[helper.make_opsetid("", 17)])
    model.ClearField("graph")
    return model.SerializeToString() + _field(7, main)


@pytest.mark.parametrize("depth", [5, 70, 10_000])
def test_deeply_nested_if_finishes_or_is_refused_cleanly(depth):
    data = _nested_if_bytes(depth)
    try:
        graph = load_model(parse_model(data, "<deep>"))
    except GraphoptError as e:  # never RecursionError or a crash
        assert depth > 5 and "\n" not in str(e)
    else:
        assert depth == 5 and len(graph.graphs()) == 2 * depth + 1


def test_a_long_chain_finishes(tmp_path):
    n = 20_000
    nodes = [helper.make_node("Relu" if i % 2 else "Neg", [f"t{i}"], [f"t{i + 1}"]) for i in range(n)]
    g = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [4])], [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [4])]
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    out, report = optimize_model(model, gpu="none")
    assert report.nodes_after == n
    onnx.checker.check_model(out)
