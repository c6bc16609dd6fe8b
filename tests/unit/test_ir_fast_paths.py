"""The IR's fast paths give what the slower code they replace gave: the topological order (networkx's
lexicographical sort keyed by position), ``is_large`` (the walk over every tensor), ``iter_tensors`` /
``iter_sparse`` (one scan per graph, in ``iter_graphs`` order), ``Graph.graphs`` (the walk over every
node), ``small_bytes`` (``is_large`` and then
serializing), ``refine_shapes`` given the inference at hand, and a node loaded without its "extra"
proto (``convert._node_extra``)."""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.ir import Graph, from_model, refine_shapes, to_model, traverse
from graphopt.ir.external import iter_graphs, iter_sparse, iter_tensors, scan_tensors
from graphopt.ir.large import is_large, small_bytes, tensor_bytes
from graphopt.ir.shapes import infer


def _random_graph(seed: int, n: int = 60) -> Graph:
    rng = random.Random(seed)
    g = Graph("g")
    g._inputs.append("x")
    made = ["x"]
    for i in range(n):
        reads = rng.sample(made, k=min(len(made), rng.randint(1, 3)))
        # positions out of order (as rewrites leave them), some repeated, some extended tuples
        pos = (rng.randint(0, n // 2),) if rng.random() < 0.8 else (rng.randint(0, n // 2), rng.randint(0, 3))
        node = g.add_node("Add" if len(reads) == 2 else "Relu", reads[:2], [f"t{i}"], name=f"n{i}", _pos=pos)
        made.append(node.outputs[0])
    return g


@pytest.mark.parametrize("seed", range(12))
def test_topological_order_is_networkx_lexicographical_sort_by_position(seed):
    g = _random_graph(seed)
    pos = {name: node._pos for name, node in g._nodes.items()}
    expected = list(nx.lexicographical_topological_sort(g.nx, key=lambda n: pos[n]))
    assert g.topological_order() == expected


@pytest.mark.parametrize("seed", range(8))
def test_reachability_is_networkx_has_path(seed):
    """``traverse.reaches`` (the rewrite engine's cycle checks) answers as ``networkx.has_path`` on the
    dependency graph, for every pair of a random graph and after edges that go against the order."""
    g = _random_graph(seed, n=40)
    names = list(g._nodes)
    for a in names:
        for b in names:
            assert traverse.reaches(g, a, b) == nx.has_path(g.nx, a, b), (a, b)


def test_reachability_follows_the_outer_tensors_a_subgraph_reads():
    inner = helper.make_graph([helper.make_node("Identity", ["a"], ["o"])], "then", [],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1])])
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"], name="producer"),
         helper.make_node("If", ["c"], ["y"], name="if", then_branch=inner, else_branch=inner)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
              helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))
    g = from_model(m)
    assert traverse.reaches(g, "producer", "if") and not traverse.reaches(g, "if", "producer")
    assert nx.has_path(g.nx, "producer", "if")


def test_topological_order_is_none_on_a_cycle():
    g = Graph("g")
    g._inputs.append("x")
    g.add_node("Add", ["x", "b"], ["a"], name="first")
    g.add_node("Relu", ["a"], ["b"], name="second")
    assert g.topological_order() is None


def _nested_ifs(prefix: str, depth: int) -> onnx.GraphProto:
    """Two If nodes per scope, each branch holding two more, down to ``depth`` levels."""
    nodes = [helper.make_node("Identity", ["cond"], [prefix + "c"])]
    for k in range(2 if depth else 0):
        nodes.append(helper.make_node("Relu", [prefix + "c"], [f"{prefix}r{k}"]))
        nodes.append(helper.make_node("If", ["cond"], [f"{prefix}y{k}"],
                                      then_branch=_nested_ifs(f"{prefix}{k}t_", depth - 1),
                                      else_branch=_nested_ifs(f"{prefix}{k}e_", depth - 1)))
    out = helper.make_tensor_value_info(prefix + "c", TensorProto.BOOL, [])
    return helper.make_graph(nodes, prefix + "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])]
                             if not prefix else [], [out])


def test_graphs_lists_the_subgraphs_in_walk_order():
    g = from_model(helper.make_model(_nested_ifs("", 3)))
    expected = [g] + [sub for _, node in g.walk() for sub in node.subgraphs()]
    assert len(expected) == 1 + 4 + 16 + 64
    assert [sub.name for sub in g.graphs()] == [sub.name for sub in expected]
    flat = from_model(helper.make_model(_nested_ifs("", 0)))
    assert flat.graphs() == [flat]


def _model_with(tensors: list[TensorProto], nested: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Constant", [], [f"c{i}"], value=t) for i, t in enumerate(tensors)]
    body_const = helper.make_node("Constant", [], ["inner"], value=numpy_helper.from_array(np.ones(3, np.float32), "k"))
    body = helper.make_graph([body_const, helper.make_node("Identity", ["inner"], ["o"])], "body", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, [3])])
    if nested:
        nodes.append(helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=body))
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([1.0], np.float32), "sv"),
                                       numpy_helper.from_array(np.array([0], np.int64), "si"), [4])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("c0", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.zeros(5, np.float32), "w")],
                              sparse_initializer=[sparse])
    return helper.make_model(graph)


def test_iter_tensors_and_sparse_keep_the_iter_graphs_order():
    model = _model_with([numpy_helper.from_array(np.arange(4, dtype=np.float32), "t")], nested=True)
    expected = []
    for g in iter_graphs(model.graph):
        expected += [t.name for t in g.initializer]
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    expected.append(a.t.name)
    sparse = [s.values.name for g in iter_graphs(model.graph) for s in g.sparse_initializer]
    assert [s.values.name for s in iter_sparse(model.graph)] == sparse
    expected += [n for s in iter_sparse(model.graph) for n in (s.values.name, s.indices.name)]
    assert [t.name for t in iter_tensors(model.graph)] == expected


def _with_every_tensor_kind() -> onnx.ModelProto:
    """Tensors in every place ``iter_tensors`` / ``iter_sparse`` look: initializers, TENSOR, TENSORS,
    SPARSE_TENSOR and SPARSE_TENSORS attributes, sparse initializers, in two nested levels of If."""
    def arr(name, n=2):
        return numpy_helper.from_array(np.arange(n, dtype=np.float32), name)

    def sp(name):
        return helper.make_sparse_tensor(arr(name + "v", 1), numpy_helper.from_array(np.array([0], np.int64), name + "i"), [3])

    def graph(prefix, nested):
        nodes = [helper.make_node("Constant", [], [prefix + "c"], value=arr(prefix + "t")),
                 helper.make_node("Constant", [], [prefix + "s"], sparse_value=sp(prefix + "sa")),
                 helper.make_node("Custom", [], [prefix + "m"], domain="x", ts=[arr(prefix + "t1"), arr(prefix + "t2")]),
                 helper.make_node("Custom", [], [prefix + "n"], domain="x")]
        nodes[3].attribute.append(helper.make_attribute("sps", [sp(prefix + "sb"), sp(prefix + "sc")]))
        if nested:
            nodes.append(helper.make_node("If", ["cond"], [prefix + "y"], then_branch=graph(prefix + "th_", False),
                                          else_branch=graph(prefix + "el_", False)))
        return helper.make_graph(nodes, prefix + "g", [], [helper.make_tensor_value_info(prefix + "c", TensorProto.FLOAT, None)],
                                 initializer=[arr(prefix + "w")], sparse_initializer=[sp(prefix + "si")])

    return helper.make_model(graph("", True))


def test_scan_tensors_is_iter_tensors_and_iter_sparse_in_one_walk():
    for model in (_with_every_tensor_kind(), _model_with([numpy_helper.from_array(np.ones(3, np.float32), "t")], nested=True)):
        tensors, sparse = scan_tensors(model.graph)
        assert [t.name for t in tensors] == [t.name for t in iter_tensors(model.graph)]
        assert [s.values.name for s in sparse] == [s.values.name for s in iter_sparse(model.graph)]
        assert len(tensors) > len(sparse) > 0
    empty = helper.make_model(helper.make_graph([], "g", [], []))
    assert scan_tensors(empty.graph) == ([], [])


def test_scan_tensors_hands_out_the_models_own_tensors():
    """load_external writes the bytes it reads into the tensors scan_tensors returned: they must be
    the model's own messages, not copies."""
    model = _with_every_tensor_kind()
    tensors, _ = scan_tensors(model.graph)
    tensors[0].raw_data = b"\0" * 8
    assert model.graph.initializer[0].raw_data == b"\0" * 8


def _slow_is_large(model: onnx.ModelProto, limit: int) -> bool:
    return tensor_bytes(model) > limit or model.ByteSize() > limit


@pytest.mark.parametrize("values", [
    np.zeros(3000, np.int64),  # typed int64_data: 1 byte each serialized, 8 counted
    np.ones(3000, np.float32),  # float32 as raw_data
])
@pytest.mark.parametrize("limit", [1000, 5000, 20000, 30000, 10**6])
def test_is_large_answers_as_the_walk_over_every_tensor(values, limit):
    t = helper.make_tensor("t", helper.np_dtype_to_tensor_dtype(values.dtype), values.shape, values.ravel().tolist())
    model = _model_with([t])
    assert is_large(model, limit) == _slow_is_large(model, limit)


@pytest.mark.parametrize("values", [
    np.zeros(3000, np.int64),
    np.ones(3000, np.float32),
])
@pytest.mark.parametrize("limit", [1000, 5000, 20000, 30000, 10**6, None])
def test_small_bytes_is_the_serialization_exactly_when_is_large_says_small(values, limit):
    t = helper.make_tensor("t", helper.np_dtype_to_tensor_dtype(values.dtype), values.shape, values.ravel().tolist())
    model = _model_with([t])
    data = small_bytes(model, limit)
    if is_large(model, limit):
        assert data is None
    else:
        assert data == model.SerializeToString(deterministic=True)


def test_small_bytes_is_none_for_a_model_with_lazy_weights_or_enough_raw_data(monkeypatch):
    import graphopt.ir.large as large

    t = numpy_helper.from_array(np.ones(4000, np.float32), "t")  # 16 KB of raw_data, an initializer
    graph = helper.make_graph([helper.make_node("Relu", ["t"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4000])], [t])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    calls = []
    monkeypatch.setattr(large, "size_bound", lambda m: calls.append(1) or m.ByteSize())
    assert small_bytes(model, 10**6) is not None and not calls
    monkeypatch.setattr(large, "WEIGHTLESS_ABOVE", 8000)  # the raw data now counts as big: is_large decides
    assert small_bytes(model, 10**6) == model.SerializeToString(deterministic=True)
    assert small_bytes(model, 1000) is None
    assert calls  # (the size came from size_bound, not from encoding first)
    monkeypatch.setattr(large, "has_lazy", lambda m: True)  # a weight left in its file: never serialized
    assert small_bytes(model, 10**9) is None


def test_refine_shapes_given_the_inference_equals_inferring_again():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    shape = helper.make_node("Shape", ["x"], ["s"])
    reshape = helper.make_node("Reshape", ["x", "s"], ["y"])
    model = helper.make_model(helper.make_graph([shape, reshape], "g", [x],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]))
    a, b = from_model(model), from_model(model)
    assert refine_shapes(a) == refine_shapes(b, infer(model)) > 0
    assert to_model(a).SerializeToString() == to_model(b).SerializeToString()


def _refine_as_before(graph: Graph, inferred: onnx.ModelProto) -> int:
    """refine_shapes as it was written before its fast paths (the reference)."""
    from graphopt.ir.values import value_info_of_type

    changed = 0
    for vi in inferred.graph.value_info:
        new = value_info_of_type(vi.type)
        if new.shape is None or new.dtype is None:
            continue
        old = graph.value_info(vi.name)
        known = lambda s: sum(1 for d in s if isinstance(d, int) and d >= 0)  # noqa: E731
        if old.shape is not None and known(old.shape) >= known(new.shape):
            continue
        if graph.refine_value_info(vi):
            changed += 1
    return changed


def test_refine_shapes_records_what_the_reference_records():
    # x is [N, 3]; some value_info entries are symbolic, one is as static as inference, one missing
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Shape", ["a"], ["s"]),
             helper.make_node("Reshape", ["a", "s"], ["b"]), helper.make_node("Relu", ["b"], ["c"]),
             helper.make_node("Cast", ["c"], ["d"], to=TensorProto.INT64)]
    infos = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 3]),
             helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3]),
             helper.make_tensor_value_info("c", TensorProto.FLOAT, None)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("d", TensorProto.INT64, None)],
                                                value_info=infos))
    inferred = infer(model)
    a, b = from_model(model), from_model(model)
    assert refine_shapes(a, inferred) == _refine_as_before(b, inferred) > 0
    assert to_model(a).SerializeToString() == to_model(b).SerializeToString()


def test_an_empty_subgraph_round_trips_as_written():
    """to_model builds subgraphs in place: an empty body must still be written (present, empty)."""
    node = helper.make_node("If", ["cond"], [], then_branch=onnx.GraphProto(), else_branch=onnx.GraphProto())
    model = helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])], []))
    assert to_model(from_model(model)).SerializeToString() == model.SerializeToString()


def _names_model(nameless: bool) -> onnx.ModelProto:
    body = helper.make_graph([helper.make_node("Identity", ["x"], ["inner"], name="in_body")], "body", [],
                             [helper.make_tensor_value_info("inner", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("Relu", ["x"], ["r0"], name="" if nameless else "first"),
             helper.make_node("If", ["cond"], ["y"], name="if", then_branch=body, else_branch=body),
             helper.make_node("Relu", ["r0"], ["r1"], name="Relu")]
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([1.0], np.float32), "sv"),
                                       numpy_helper.from_array(np.array([0], np.int64), "si"), [4])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("r1", TensorProto.FLOAT, [2])],
                              initializer=[numpy_helper.from_array(np.zeros(2, np.float32), "unused_w")],
                              value_info=[helper.make_tensor_value_info("ghost", TensorProto.FLOAT, [2])],
                              sparse_initializer=[sparse])
    return helper.make_model(graph)


@pytest.mark.parametrize("nameless", [False, True])
def test_from_model_reserves_every_name_before_it_generates_one(nameless):
    from graphopt.ir.convert import _collect_names

    model = _names_model(nameless)
    collected: set[str] = set()
    _collect_names(model.graph, collected)
    g = from_model(model)
    generated = {n.name for n in g.nodes()} - collected
    assert g._names.used == collected | generated
    # a nameless Relu placed before the node named "Relu" does not take that name
    assert [n.name for n in g.nodes()] == (["Relu_1", "if", "Relu"] if nameless else ["first", "if", "Relu"])


def _node_fields_model() -> onnx.ModelProto:
    plain = helper.make_node("Relu", ["x"], ["a"], name="plain")
    empty_doc = helper.make_node("Relu", ["a"], ["b"], name="empty_doc")
    empty_doc.doc_string = ""  # present though empty (proto2): written back as present
    long_domain = helper.make_node("Relu", ["b"], ["c"], name="long_domain", domain="ai.onnx")
    documented = helper.make_node("Relu", ["c"], ["d"], name="documented", doc_string="why")
    with_meta = helper.make_node("Relu", ["d"], ["e"], name="with_meta")
    with_meta.metadata_props.add(key="k", value="v")
    nameless = helper.make_node("Relu", ["e"], ["f"])
    empty_name = helper.make_node("Relu", ["f"], ["g"])
    empty_name.name = ""  # present though empty
    duplicate = helper.make_node("Relu", ["g"], ["y"], name="plain")  # renamed by the IR
    graph = helper.make_graph([plain, empty_doc, long_domain, documented, with_meta, nameless, empty_name, duplicate],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_node_without_its_extra_proto_is_written_as_the_copy_wrote_it():
    from graphopt.ir import convert

    model = _node_fields_model()
    g = from_model(model)
    kept = [k for k, n in enumerate(g.nodes()) if n._extra is not None]
    assert kept == [1, 2, 4, 6, 7]  # empty doc, ai.onnx, metadata, a name set to "", a name the IR changed
    written = to_model(g).SerializeToString()
    # the reference: every node keeps the stripped copy of its other fields, as before
    for node, proto in zip(g.nodes(), model.graph.node):
        node._extra = convert._stripped(proto, convert._NODE_FIELDS)
    assert to_model(g).SerializeToString() == written
    out = onnx.load_from_string(written)
    assert [n.name for n in out.graph.node][-1] not in ("", "plain") and out.graph.node[1].HasField("doc_string")
    assert out.graph.node[2].HasField("domain") and out.graph.node[2].domain == ""


def _constant_graph(tensor: onnx.TensorProto) -> Graph:
    node = helper.make_node("Constant", [], ["c"], name="c", value=tensor)
    out = helper.make_tensor_value_info("c", tensor.data_type, None)
    return from_model(helper.make_model(helper.make_graph([node], "g", [], [out])))


_NUMERIC = [t for t in onnx.TensorProto.DataType.values()
            if t and helper.tensor_dtype_to_np_dtype(t).kind in "biufc"]


@pytest.mark.parametrize("data_type", _NUMERIC)
@pytest.mark.parametrize("raw", [False, True])
def test_constant_info_of_a_constant_is_what_decoding_gives(data_type, raw):
    """A Constant's plain numeric value tensor is answered from its header (convert nothing):
    the same dtype and shape numpy_helper.to_array's array has."""
    from graphopt.ir.constants import _constant_tensor_info

    dtype = helper.tensor_dtype_to_np_dtype(data_type)
    values = np.arange(6).reshape(2, 3).astype(dtype)
    tensor = numpy_helper.from_array(values, "v")
    if not raw and tensor.HasField("raw_data"):
        tensor = helper.make_tensor("v", data_type, [2, 3], values.flatten().tolist())
    g = _constant_graph(tensor)
    assert _constant_tensor_info(g.producer("c")) is not None
    decoded = numpy_helper.to_array(tensor)
    assert g.constant_info("c") == (decoded.dtype, decoded.shape)


def test_constant_info_decodes_what_its_header_cannot_answer():
    from graphopt.ir.constants import _constant_tensor_info

    strings = _constant_graph(helper.make_tensor("v", TensorProto.STRING, [2], [b"a", b"b"]))
    assert _constant_tensor_info(strings.producer("c")) is None
    assert strings.constant_info("c") == (np.dtype(object), (2,))
    floats = from_model(helper.make_model(helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0])], "g", [],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)])))
    assert _constant_tensor_info(floats.producer("c")) is None
    assert floats.constant_info("c") == (np.dtype(np.float32), (2,))


def _walk_as_before(graph: Graph):
    """Graph.walk as it was written before (a stack of node iterators): the reference order."""
    stack, graphs = [iter(graph.nodes())], [graph]
    while stack:
        node = next(stack[-1], None)
        if node is None:
            stack.pop()
            graphs.pop()
            continue
        yield graphs[-1], node
        for sub in reversed(node.subgraphs()):
            stack.append(iter(sub.nodes()))
            graphs.append(sub)


def test_walk_graphs_and_subgraph_owners_keep_the_walk_order_of_nested_bodies():
    graph = from_model(_with_every_tensor_kind())
    outer = graph.node(next(n.name for _, n in graph.walk() if n.op_type == "If"))
    outer.set_attr("then_branch", from_model(_with_every_tensor_kind()))  # two levels of If below the root
    reference = list(_walk_as_before(graph))
    assert [(id(g), n.name) for g, n in graph.walk()] == [(id(g), n.name) for g, n in reference]
    assert graph.subgraph_owners() == [(g, n) for g, n in reference if n.subgraphs()]
    assert graph.graphs() == [graph] + [s for _, n in reference for s in n.subgraphs()]


def test_refine_shapes_that_proves_nothing_new_changes_nothing():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                                                "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]))
    graph = from_model(infer(model))  # value_info already what inference proves
    before = to_model(graph).SerializeToString()
    assert refine_shapes(graph) == 0
    assert to_model(graph).SerializeToString() == before


def _needs_extra_as_before(nproto: onnx.NodeProto, node) -> bool:
    """The ListFields test _node_extra made before ``_needs_extra`` (the reference)."""
    from graphopt.ir.convert import _NODE_FIELDS, _NODE_SCALARS

    return any(fd.name not in _NODE_FIELDS and not (fd.name in _NODE_SCALARS and value and value == getattr(node, fd.name))
               for fd, value in nproto.ListFields())


def test_needs_extra_answers_as_the_list_of_set_fields():
    from graphopt.ir.convert import _needs_extra
    from graphopt.ir.node import Node

    plain = helper.make_node("Relu", ["x"], ["y"], name="r")
    variants = [plain, helper.make_node("Relu", ["x"], ["y"], name="r", domain=""),
                helper.make_node("Relu", ["x"], ["y"], name="r", domain="ai.onnx"),
                helper.make_node("Relu", ["x"], ["y"], name="r", doc_string="d"),
                helper.make_node("Relu", ["x"], ["y"], name="", doc_string=""),
                helper.make_node("Relu", ["x"], ["y"], name="r", overload="o")]
    with_metadata = onnx.NodeProto()
    with_metadata.CopyFrom(plain)
    with_metadata.metadata_props.add(key="k", value="v")
    for nproto in variants + [with_metadata]:
        for node in (Node("Relu", ["x"], ["y"], name="r", doc_string=nproto.doc_string, overload=nproto.overload),
                     Node("Relu", ["x"], ["y"], name="Relu_0")):  # the second: a name the IR generated
            assert _needs_extra(nproto, node) == _needs_extra_as_before(nproto, node), nproto


def test_value_info_of_type_reads_every_kind_of_type_as_its_fields_say():
    from graphopt.ir.values import ValueInfo, value_info_of_type

    unknown_dim = helper.make_tensor_type_proto(TensorProto.FLOAT, [2, "n"])
    unknown_dim.tensor_type.shape.dim.add()  # neither a value nor a name
    cases = [(helper.make_tensor_type_proto(TensorProto.FLOAT, [2, "n"]), ValueInfo(TensorProto.FLOAT, (2, "n"))),
             (unknown_dim, ValueInfo(TensorProto.FLOAT, (2, "n", None))),
             (helper.make_tensor_type_proto(TensorProto.INT64, None), ValueInfo(TensorProto.INT64, None)),
             (helper.make_tensor_type_proto(0, []), ValueInfo(None, ())),
             (helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [1])), ValueInfo(None, None))]
    for _ in range(2):  # the second time from the memo
        for type_proto, expected in cases:
            assert value_info_of_type(type_proto) == expected
