"""ModelProto <-> Graph, without loss.

Only this module (with ``io.py``) touches protobufs. Fields the IR does not model are kept verbatim
("extra" protos with the modelled fields cleared) and merged back on the way out, so a load/save with
no rewrite reproduces the model: same nodes, attributes, initializers, value_info, opsets, metadata,
functions and subgraphs.
"""

from __future__ import annotations

import onnx
from google.protobuf.message import Message
from onnx import AttributeProto

from graphopt.errors import InvalidGraph
from graphopt.ir.graph import Graph
from graphopt.ir.names import _norm_domain
from graphopt.ir.node import Node

# Repeated and message fields the IR rebuilds. Scalar fields (name, doc_string, ...) stay in the
# "extra" copy so that their presence round-trips too (proto2 distinguishes "" set from unset);
# ``_set_scalar`` overwrites them only when the IR's value differs.
_NODE_FIELDS = ("input", "output", "attribute")
_GRAPH_FIELDS = ("node", "input", "output", "initializer", "sparse_initializer", "value_info")
_MODEL_FIELDS = ("graph", "opset_import", "functions", "metadata_props")
_GRAPH, _GRAPHS = AttributeProto.GRAPH, AttributeProto.GRAPHS


def _set_scalar(proto, field: str, value) -> None:
    if getattr(proto, field) != value or (value and not proto.HasField(field)):
        setattr(proto, field, value)


def copy_field(dest, name: str, value) -> None:
    """Set field ``name`` of ``dest`` to ``value`` (a message, a scalar or a repeated field's values)."""
    if isinstance(value, Message):
        getattr(dest, name).CopyFrom(value)
    elif isinstance(value, (str, bytes, int, float, bool)):
        setattr(dest, name, value)
    else:  # a repeated field
        getattr(dest, name).extend(value)


def _stripped(proto, fields):
    """A copy of ``proto`` without ``fields``, built field by field: copying the whole message and then
    clearing would keep the cleared fields' bytes (every weight) alive in the copy's upb arena."""
    copy = type(proto)()
    for fd, value in proto.ListFields():
        if fd.name not in fields:
            copy_field(copy, fd.name, value)
    return copy if copy.ByteSize() else None


#: The NodeProto scalars ``_node_to_proto`` writes back from the IR node (``_set_scalar``).
_NODE_SCALARS = ("name", "op_type", "domain", "doc_string", "overload")


#: NodeProto fields neither rebuilt (``_NODE_FIELDS``) nor written back (``_NODE_SCALARS``): any one of
#: them set means the node keeps an extra copy. From the descriptor, so a field a later onnx adds counts.
_NODE_OTHERS = tuple(f for f in onnx.NodeProto.DESCRIPTOR.fields if f.name not in _NODE_FIELDS + _NODE_SCALARS)


def _needs_extra(nproto: onnx.NodeProto, node: Node) -> bool:
    """Whether ``nproto`` has a field ``_node_to_proto`` would not write back from ``node``: a scalar
    present (proto2) but empty or not the IR node's value, or any other field set. Asked field by
    field (a few C calls) instead of through ``ListFields``, which built every field's value."""
    for name in _NODE_SCALARS:
        if nproto.HasField(name):
            value = getattr(nproto, name)
            if not value or value != getattr(node, name):
                return True
    for fd in _NODE_OTHERS:
        if (len(getattr(nproto, fd.name)) if fd.is_repeated else nproto.HasField(fd.name)):
            return True
    return False


def _node_extra(nproto: onnx.NodeProto, node: Node) -> onnx.NodeProto | None:
    """``_stripped(nproto, _NODE_FIELDS)`` for the node loop, or None when ``_node_to_proto`` writes
    the same fields back without it: every field listed besides inputs, outputs and attributes is one
    of ``_NODE_SCALARS``, non-empty (so present, and ``_set_scalar`` sets it) and equal to the IR
    node's value (``_needs_extra``). Nearly every node is such (a name and an op type); the copy cost
    a NodeProto and its fields per node at load and a ``CopyFrom`` per node in every ``to_model``. A
    field set to "" (proto2 keeps its presence), changed by the IR (domain "ai.onnx" is written as
    "") or not held by the IR (metadata_props, ...) keeps the copy. A copy that took any field is not
    empty: a NodeProto's other fields are listed only when set (no ByteSize needed)."""
    if not _needs_extra(nproto, node):
        return None
    extra = onnx.NodeProto()
    for fd, value in nproto.ListFields():
        if fd.name not in _NODE_FIELDS:
            copy_field(extra, fd.name, value)
    return extra


def _collect_names(gproto: onnx.GraphProto, out: set[str]) -> None:
    """Reserve every name the model uses, in every graph, before any name is generated."""
    for vi in list(gproto.input) + list(gproto.output) + list(gproto.value_info):
        out.add(vi.name)
    for t in gproto.initializer:
        out.add(t.name)
    for sp in gproto.sparse_initializer:
        out.add(sp.values.name)
    for n in gproto.node:
        out.add(n.name)
        out.update(n.input)
        out.update(n.output)
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                _collect_names(a.g, out)
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    _collect_names(g, out)
    out.discard("")


def from_model(model: onnx.ModelProto) -> Graph:
    """Build the IR from a ModelProto (external data must already be loaded or left as references)."""
    g = Graph(model.graph.name)
    g.ir_version = model.ir_version
    g.opset = {}
    for op in model.opset_import:
        g.opset[_norm_domain(op.domain)] = op.version
        g._opset_protos[_norm_domain(op.domain)] = _copy(op)
    g.producer_name = model.producer_name
    g.producer_version = model.producer_version
    g.domain = model.domain
    g.model_version = model.model_version
    g.model_doc_string = model.doc_string
    g.metadata = {p.key: p.value for p in model.metadata_props}
    g.functions = [_copy(f) for f in model.functions]
    g._model_extra = _stripped(model, _MODEL_FIELDS)
    # Every name the model uses is reserved as it is read (what _collect_names reserves, graph by
    # graph); the whole model is collected first only when a node needs a generated name.
    _fill_graph(g, model.graph, g, [model.graph])
    g._names.used.discard("")
    return g


def _copy(proto):
    c = type(proto)()
    c.CopyFrom(proto)
    return c


def _fill_graph(g: Graph, gproto: onnx.GraphProto, root: Graph, uncollected: list) -> None:
    # An explicit stack instead of recursion would only help for pathological nesting; bodies are
    # converted recursively here, and io.py bounds the nesting depth before we get here.
    # Names: _insert reserves the nodes' names, inputs and outputs; the loops below the rest. Before
    # the first generated name, ``uncollected`` (the root GraphProto) has every name reserved.
    used = g._names.used
    g.name = gproto.name
    g.doc_string = gproto.doc_string
    g._extra = _stripped(gproto, _GRAPH_FIELDS)
    for vi in gproto.input:
        g._inputs.append(vi.name)
        g._io_info[vi.name] = _copy(vi)
        used.add(vi.name)
    for vi in gproto.output:
        g._outputs.append(vi.name)
        used.add(vi.name)
        if vi.name not in g._io_info:
            g._io_info[vi.name] = _copy(vi)
    for t in gproto.initializer:
        if t.name in g._inits:
            raise InvalidGraph(f"initializer {t.name!r} is defined twice in graph {g.name!r}")
        g._inits[t.name] = _copy(t)
        used.add(t.name)
    g._sparse_inits = [_copy(s) for s in gproto.sparse_initializer]
    used.update(s.values.name for s in g._sparse_inits)
    for vi in gproto.value_info:
        used.add(vi.name)
        if vi.name not in g._io_info:
            g._value_info[vi.name] = _copy(vi)
    for i, nproto in enumerate(gproto.node):
        name = nproto.name
        if not name or name in g._nodes:
            if uncollected:
                _collect_names(uncollected.pop(), used)
            synth = not name
            name = g.unique_name(nproto.name or nproto.op_type)
            if synth:
                root._synth_names.add(name)
        node = Node(
            nproto.op_type,
            nproto.input,  # Node makes its own lists of them (no second copy here)
            nproto.output,
            name=name,
            domain=_norm_domain(nproto.domain),
            doc_string=nproto.doc_string,
            overload=nproto.overload,
        )
        node._pos = (i,)
        node._extra = _node_extra(nproto, node)
        for a in nproto.attribute:
            kind = a.type
            if kind != _GRAPH and kind != _GRAPHS:
                node._attrs[a.name] = _copy(a)
            elif kind == _GRAPH:
                sub = Graph(a.g.name, parent=g)
                _fill_graph(sub, a.g, root, uncollected)
                node._attrs[a.name] = sub
                node._has_sub = True
            else:
                subs = []
                for gp in a.graphs:
                    sub = Graph(gp.name, parent=g)
                    _fill_graph(sub, gp, root, uncollected)
                    subs.append(sub)
                node._attrs[a.name] = subs
                node._has_sub = True
        for t in node.outputs:
            if t and t in g._producer:
                raise InvalidGraph(
                    f"tensor {t!r} is produced by two nodes ({g._producer[t]!r} and {name!r}) in graph {g.name!r}"
                )
        g._insert(node)
    g._next_pos = len(gproto.node)


def _topological_nodes(g: Graph) -> list[Node]:
    nodes = g.nodes()
    if g._topo_valid:
        return nodes
    order = g.topological_order()
    if order is None:
        return nodes  # a cyclic input graph is written as it came; lint() reports it
    return [g._nodes[n] for n in order]


def _node_to_proto(node: Node, synth: set[str], p: onnx.NodeProto) -> None:
    """Fill the (new, empty) ``p`` with ``node``: built in place, never copied into its graph."""
    name = "" if node.name in synth else node.name
    if node._extra is not None:
        p.CopyFrom(node._extra)
        _set_scalar(p, "name", name)
        _set_scalar(p, "op_type", node.op_type)
        _set_scalar(p, "domain", node.domain)
        _set_scalar(p, "doc_string", node.doc_string)
        _set_scalar(p, "overload", node.overload)
    else:
        # ``p`` is empty here, so ``_set_scalar`` would set exactly the non-empty values: set them
        # without its comparisons (nearly every node takes this path; to_model runs three times).
        if name:
            p.name = name
        if node.op_type:
            p.op_type = node.op_type
        if node.domain:
            p.domain = node.domain
        if node.doc_string:
            p.doc_string = node.doc_string
        if node.overload:
            p.overload = node.overload
    p.input.extend(node.inputs)
    p.output.extend(node.outputs)
    for name, value in node._attrs.items():
        if isinstance(value, AttributeProto):
            p.attribute.append(value)
        elif isinstance(value, list):
            a = p.attribute.add(name=name, type=AttributeProto.GRAPHS)
            for s in value:
                _graph_to_proto(s, synth, a.graphs.add())
        else:
            a = p.attribute.add(name=name, type=AttributeProto.GRAPH)
            _graph_to_proto(value, synth, a.g)


def _graph_to_proto(g: Graph, synth: set[str], gp: onnx.GraphProto, initializer_map=None) -> None:
    """Fill the (new, empty) ``gp`` with ``g``, in place: no node or subgraph is built twice.
    ``initializer_map``: what each initializer becomes (default: itself)."""
    gp.SetInParent()  # present even when empty (an empty subgraph is still written, as a copied one was)
    if g._extra is not None:
        gp.CopyFrom(g._extra)
    _set_scalar(gp, "name", g.name)
    _set_scalar(gp, "doc_string", g.doc_string)
    node_protos = gp.node
    for n in _topological_nodes(g):
        _node_to_proto(n, synth, node_protos.add())
    gp.initializer.extend(g._inits.values() if initializer_map is None else map(initializer_map, g._inits.values()))
    gp.sparse_initializer.extend(g._sparse_inits)
    for t in g._inputs:
        gp.input.append(g._io_info.get(t) or onnx.ValueInfoProto(name=t))
    for t in g._outputs:
        gp.output.append(g._io_info.get(t) or onnx.ValueInfoProto(name=t))
    live = set(g._producer) | set(g._inits)
    # value_info for tensors that no longer exist (removed by a rewrite) is dropped; an entry of a
    # tensor that only a subgraph defines stays with that subgraph.
    gp.value_info.extend(vi for name, vi in g._value_info.items() if name in live or name in g._consumers)


def to_model(g: Graph, initializer_map=None) -> onnx.ModelProto:
    """The ModelProto for the root graph ``g`` (nodes written in topological order). ``initializer_map``:
    what each of the root graph's initializers becomes in it (``graphopt.ir.large.WeightlessInitializers``:
    a weightless model for shape inference, no weight copied)."""
    if g.parent is not None:
        raise InvalidGraph(f"to_model() needs the root graph, not subgraph {g.name!r}")
    m = onnx.ModelProto()
    if g._model_extra is not None:
        m.CopyFrom(g._model_extra)
    _set_scalar(m, "ir_version", g.ir_version)
    for domain, version in g.opset.items():
        op = g._opset_protos.get(domain)
        if op is None or op.version != version:
            op = onnx.OperatorSetIdProto(version=version)
            if domain:
                op.domain = domain
        m.opset_import.append(op)
    _set_scalar(m, "producer_name", g.producer_name)
    _set_scalar(m, "producer_version", g.producer_version)
    _set_scalar(m, "domain", g.domain)
    _set_scalar(m, "model_version", g.model_version)
    _set_scalar(m, "doc_string", g.model_doc_string)
    for k, v in g.metadata.items():
        m.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    m.functions.extend(g.functions)
    synth = g._synth_names
    _graph_to_proto(g, synth, m.graph, initializer_map)
    return m
