"""``Graph``: the networkx-backed IR and its single mutation API.

Every change to the graph goes through the methods here (``add_node``, ``remove_node``,
``replace_all_uses``, ``replace_subgraph``, ...), which keep three indexes consistent: the producer of
each tensor, the consumers of each tensor, and the ``networkx.MultiDiGraph`` ``nx`` whose edges run from
producer to consumer (keyed by tensor name). Like torch.fx, removing a node that still has users is
refused, and ``lint()`` checks the invariants.

Subgraphs (If/Loop/Scan bodies) are ``Graph`` objects whose ``parent`` is the enclosing graph. A node
that holds a subgraph which reads an outer-scope tensor counts as a consumer of that tensor, so no
pass fuses across, or deletes, a value a body still needs.

The class keeps the indexes, the hot queries and every mutation; the read-only walks are in
``traverse.py``, the ``lint`` checks in ``checks.py``, Constant decoding in ``constants.py``, name
bookkeeping in ``names.py`` and ``ValueInfo`` in ``values.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np
import onnx
from onnx import numpy_helper

from graphopt.errors import InvalidGraph
from graphopt.ir import checks, constants, traverse
from graphopt.ir.constants import _constant_node_value
from graphopt.ir.external import is_lazy, lazy_array
from graphopt.ir.names import _NameList, _Names, _norm_domain
from graphopt.ir.node import Node
from graphopt.ir.traverse import _networkx
from graphopt.ir.values import ValueInfo, value_info_of_type

if TYPE_CHECKING:
    import networkx as nx


class Graph:
    """A graph of ``Node``s with tensors, initializers, inputs/outputs and (for the root) model fields."""

    def __init__(self, name: str = "graph", parent: "Graph | None" = None):
        self.name = name
        self.doc_string = ""
        self.parent = parent
        self._names: _Names = parent._names if parent is not None else _Names()
        self._nodes: dict[str, Node] = {}
        self._producer: dict[str, str] = {}
        self._consumers: dict[str, dict[str, None]] = {}
        self._by_op: dict[tuple[str, str], dict[str, None]] = {}
        self._implicit: dict[str, list[str]] = {}  # node name -> outer tensors its subgraphs read
        self._has_subgraphs = False  # any node here ever held a subgraph (fast path for find())
        self._inputs: _NameList = _NameList()
        self._outputs: _NameList = _NameList()
        self._io_info: dict[str, onnx.ValueInfoProto] = {}
        self._value_info: dict[str, onnx.ValueInfoProto] = {}
        self._inits: dict[str, onnx.TensorProto] = {}
        self._const_cache: dict[str, np.ndarray] = {}
        self._sparse_inits: list[onnx.SparseTensorProto] = []
        self._extra: onnx.GraphProto | None = None
        self._next_pos = 0
        self._order_cache: list[Node] | None = None
        # nodes() is known to be in topological order; every mutation checks the positions it
        # touches and clears this when it breaks the order (toposort() restores it)
        self._topo_valid = True
        self._nx: nx.MultiDiGraph | None = None  # built on first use of .nx, then kept in sync
        # Model-level fields; meaningful on the root graph only.
        self.ir_version = onnx.IR_VERSION
        self.opset: dict[str, int] = {"": onnx.defs.onnx_opset_version()}
        self._opset_protos: dict[str, onnx.OperatorSetIdProto] = {}  # as loaded, for exact round trips
        self.producer_name = ""
        self.producer_version = ""
        self.domain = ""
        self.model_version = 0
        self.model_doc_string = ""
        self.metadata: dict[str, str] = {}
        self.functions: list[onnx.FunctionProto] = []
        self._model_extra: onnx.ModelProto | None = None
        self._synth_names: set[str] = set()  # loaded nodes that had no name: written back nameless
        self.source_path: str | None = None  # the file it was loaded from, when there is one
        self.data_files: list[str] = []  # the external-data files it was loaded from
        self.source_model: onnx.ModelProto | None = None  # the validated input model (set by load_model)
        # constant -> the positions where the fp16 conversion clamped the float32 model's <= -1e30 (a mask's
        # "minus infinity") to -1e4 (set by graphopt.precision; the causal-mask proof reads them as masked)
        self.fp16_clamped: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ structure queries
    @property
    def nx(self) -> nx.MultiDiGraph:
        """The dependency graph as a ``networkx.MultiDiGraph`` (node names; an edge producer ->
        consumer per tensor). Built on first use and kept in sync by every mutation after that, so
        loading and rewriting pay for it only when a networkx algorithm is wanted."""
        if self._nx is None:
            self._nx = traverse.dependency_graph(self)
        return self._nx

    def may_reach(self, src: Node, dst: Node) -> bool:
        """Whether a path may lead from ``src`` to ``dst``. The node order is made topological first
        where a mutation broke it (35 ms on the 20k-node GPT-2, against 6 ms a search through the whole
        graph: the rewrite engine asks once per rewrite that hands a tensor over); then a node placed
        before ``src`` is unreachable from it, and the search stays between the two."""
        if src is dst:
            return True
        if not self._topo_valid:
            self.toposort()  # positions only: the nodes, tensors and their order's meaning are unchanged
        if dst._pos < src._pos:
            return False
        return traverse.reaches(self, src.name, dst.name, (src._pos, dst._pos))

    @property
    def root(self) -> "Graph":
        g = self
        while g.parent is not None:
            g = g.parent
        return g

    @property
    def inputs(self) -> list[str]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[str]:
        return list(self._outputs)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node: Node) -> bool:
        return self._nodes.get(node.name) is node

    def nodes(self) -> list[Node]:
        if self._order_cache is None:
            self._order_cache = sorted(self._nodes.values(), key=lambda n: n._pos)
        return list(self._order_cache)

    def node(self, name: str) -> Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise InvalidGraph(f"no node named {name!r} in graph {self.name!r}") from None

    def has_node(self, name: str) -> bool:
        return name in self._nodes

    def nodes_by_op(self, op_type: str, domain: str = "") -> list[Node]:
        names = self._by_op.get((_norm_domain(domain), op_type), {})
        return sorted((self._nodes[n] for n in names), key=lambda n: n._pos)

    def has_op(self, op_type: str, domain: str = "") -> bool:
        """Whether a node of this graph (not of its subgraphs) is ``op_type`` of ``domain``."""
        return bool(self._by_op.get((_norm_domain(domain), op_type)))

    def op_types(self) -> list[tuple[str, str]]:
        return sorted(k for k, v in self._by_op.items() if v)

    def producer(self, tensor: str) -> Node | None:
        name = self._producer.get(tensor)
        return None if name is None else self._nodes[name]

    def consumers(self, tensor: str) -> list[Node]:
        users = self._consumers.get(tensor)
        if not users:
            return []
        if len(users) == 1:
            return [self._nodes[next(iter(users))]]
        return sorted((self._nodes[n] for n in users), key=lambda n: n._pos)

    def has_users(self, tensor: str) -> bool:
        """True when a node (or a subgraph) reads ``tensor`` or it is a graph output."""
        return bool(self._consumers.get(tensor)) or tensor in self._outputs

    def is_graph_output(self, tensor: str) -> bool:
        return tensor in self._outputs

    def is_graph_input(self, tensor: str) -> bool:
        return tensor in self._inputs

    def is_initializer(self, tensor: str) -> bool:
        return tensor in self._inits

    def initializer_names(self) -> list[str]:
        return list(self._inits)

    def initializer(self, name: str) -> onnx.TensorProto:
        return self._inits[name]

    def defines(self, tensor: str) -> bool:
        """True when ``tensor`` is produced, an input or an initializer of this graph (not a parent)."""
        return (
            tensor in self._producer
            or tensor in self._inits
            or tensor in self._inputs
            or (bool(self._sparse_inits) and tensor in self.sparse_initializer_names())  # rare: skip the list on the hot path
        )

    def sparse_initializer_names(self) -> list[str]:
        """Names of this graph's sparse initializers (kept verbatim; they define tensors too)."""
        return [s.values.name for s in self._sparse_inits]

    def visible(self, tensor: str) -> bool:
        g: Graph | None = self
        while g is not None:
            if g.defines(tensor):
                return True
            g = g.parent
        return False

    def constant_value(self, tensor: str) -> np.ndarray | None:
        """The value of ``tensor`` when it is a constant: an initializer that is not also a graph input
        (such an initializer is only a default), or the output of a ``Constant`` node. Searches the
        enclosing scopes for outer-scope references."""
        g: Graph | None = self
        while g is not None:
            if tensor in g._producer:
                node = g._nodes[g._producer[tensor]]
                return _constant_node_value(node)
            if tensor in g._inits:
                if tensor in g._inputs:
                    return None
                cached = g._const_cache.get(tensor)
                if cached is None:
                    proto = g._inits[tensor]
                    cached = lazy_array(proto) if is_lazy(proto) else numpy_helper.to_array(proto)
                    if cached.nbytes <= _CACHE_MAX_BYTES:  # a cached weight would hold a second copy of it
                        g._const_cache[tensor] = cached
                return cached
            if tensor in g._inputs:
                return None
            g = g.parent
        return None

    def constant_info(self, tensor: str) -> tuple[np.dtype, tuple[int, ...]] | None:
        """(dtype, shape) of ``tensor`` when it is a constant (as ``constant_value`` decides), without
        reading a weight that is still in its file (a lazy reference: ``graphopt.ir.external``) nor
        decoding a Constant node's plain numeric ``value`` tensor."""
        return constants.constant_info(self, tensor)

    def is_constant(self, tensor: str) -> bool:
        g: Graph | None = self
        while g is not None:
            if tensor in g._producer:
                node = g._nodes[g._producer[tensor]]
                return node.op_type == "Constant" and node.domain == "" and len(node.subgraphs()) == 0
            if tensor in g._inits:
                return tensor not in g._inputs
            if tensor in g._inputs:
                return False
            g = g.parent
        return False

    def value_info(self, tensor: str) -> ValueInfo:
        vi = self._io_info.get(tensor) or self._value_info.get(tensor)
        if vi is not None:
            return value_info_of_type(vi.type)
        if tensor in self._inits:
            t = self._inits[tensor]
            return ValueInfo(t.data_type, tuple(t.dims))  # (dims are Python ints already)
        node = self.producer(tensor)
        if node is not None and node.op_type == "Constant" and node.domain == "":
            v = _constant_node_value(node)
            if v is not None:
                return ValueInfo(int(numpy_helper.from_array(np.asarray(v[:0] if v.ndim else v)).data_type), tuple(v.shape))
        if self.parent is not None and not self.defines(tensor):
            return self.parent.value_info(tensor)
        return ValueInfo(None, None)

    def dtype(self, tensor: str) -> int | None:
        return self.value_info(tensor).dtype

    def shape(self, tensor: str) -> tuple[int | str | None, ...] | None:
        return self.value_info(tensor).shape

    def value_info_proto(self, tensor: str) -> onnx.ValueInfoProto | None:
        return self._io_info.get(tensor) or self._value_info.get(tensor)

    def walk(self) -> Iterator[tuple["Graph", Node]]:
        """Every (graph, node) in this graph and, depth first, in the subgraphs of each node."""
        return traverse.walk(self)

    def find(self, *op_types: str, domain: str = "") -> list[tuple["Graph", Node]]:
        """(graph, node) for every node of the given op types in this graph and all subgraphs, found
        through the op index (cost grows with the matches, not with the graph), in walk order."""
        return traverse.find(self, op_types, domain)

    def subgraph_owners(self) -> list[tuple["Graph", Node]]:
        """(graph, node) for every node that holds a subgraph, here and in all subgraphs, in walk
        order; found through each scope's holders (cost grows with them, not with the graph)."""
        return traverse.subgraph_owners(self)

    def graphs(self) -> list["Graph"]:
        """This graph and all nested subgraphs, depth first."""
        return traverse.graphs(self)

    def outer_references(self) -> list[str]:
        """Tensors this graph (or its subgraphs) reads without defining them: outer-scope references."""
        return traverse.outer_references(self)

    # ------------------------------------------------------------------ names
    def unique_name(self, hint: str) -> str:
        """A name no node or tensor of the model (any graph of it) uses; reserved from now on."""
        return self._names.fresh(hint)

    def _reserve(self, name: str) -> None:
        if name:
            self._names.used.add(name)

    # ------------------------------------------------------------------ mutation: nodes
    def add_node(
        self,
        op_type: str,
        inputs: Iterable[str],
        outputs: Iterable[str] | None = None,
        *,
        name: str | None = None,
        domain: str = "",
        attrs: dict[str, Any] | None = None,
        doc_string: str = "",
        overload: str = "",
        num_outputs: int = 1,
        _pos: tuple[int, ...] | None = None,
    ) -> Node:
        """Add a node. Fresh names are generated for ``name`` and ``outputs`` when not given."""
        if name is None:
            name = self.unique_name(op_type)
        elif name in self._nodes:
            raise InvalidGraph(f"cannot add node {name!r}: graph {self.name!r} already has a node of that name; pass name=None for a fresh one")
        if outputs is None:
            outputs = [self.unique_name(f"{name}_out{i}" if num_outputs > 1 else f"{name}_out") for i in range(num_outputs)]
        outputs = list(outputs)
        for t in outputs:
            if t and t in self._producer:
                raise InvalidGraph(
                    f"cannot add node {name!r}: tensor {t!r} is already produced by node {self._producer[t]!r}"
                )
            if t and (t in self._inputs or t in self._inits):
                raise InvalidGraph(f"cannot add node {name!r}: tensor {t!r} is a graph input or initializer")
        node = Node(op_type, list(inputs), outputs, name=name, domain=_norm_domain(domain), doc_string=doc_string, overload=overload)
        if _pos is None:
            _pos = (self._next_pos,)
            self._next_pos += 1
        node._pos = _pos
        for key, value in (attrs or {}).items():
            if value is not None:
                node.set_attr(key, value)
        self._insert(node)
        return node

    def _insert(self, node: Node) -> None:
        # the hot path of loading (20k nodes): locals instead of attribute lookups, no empty dicts made
        name = node.name
        node.graph = self
        self._nodes[name] = node
        used = self._names.used
        if name:
            used.add(name)
        key = (node.domain, node.op_type)
        same_op = self._by_op.get(key)
        if same_op is None:
            same_op = self._by_op[key] = {}
        same_op[name] = None
        if self._nx is not None:
            self._nx.add_node(name)
        consumers = self._consumers
        for t in node.outputs:
            if t:
                self._producer[t] = name
                used.add(t)
                users = consumers.get(t)
                if users:
                    for user in users:
                        if self._topo_valid and self._nodes[user]._pos < node._pos:
                            self._topo_valid = False
                        if self._nx is not None:
                            self._nx.add_edge(name, user, key=t)
        for t in node.inputs:
            if t:
                self._add_use(t, name)
        if node._has_sub or name in self._implicit:
            self._adopt_subgraphs(node)
        self._order_cache = None

    def _adopt_subgraphs(self, node: Node) -> None:
        if not node._has_sub and node.name not in self._implicit:
            return
        self._has_subgraphs = True
        for t in self._implicit.pop(node.name, []):
            self._drop_use(t, node.name, implicit=True)
        refs: list[str] = []
        for sub in node.subgraphs():
            sub.parent = self
            sub._names = self._names
            for t in sub.outer_references():
                if t not in refs:
                    refs.append(t)
        if refs:
            self._implicit[node.name] = refs
            for t in refs:
                self._add_use(t, node.name)

    def _add_use(self, tensor: str, user: str) -> None:
        users = self._consumers.get(tensor)
        if users is None:
            users = self._consumers[tensor] = {}
        users[user] = None
        if tensor:
            self._names.used.add(tensor)
        producer = self._producer.get(tensor)
        if producer is not None:
            if self._topo_valid and self._nodes[producer]._pos >= self._nodes[user]._pos:
                self._topo_valid = False
            if self._nx is not None:
                self._nx.add_edge(producer, user, key=tensor)

    def _drop_use(self, tensor: str, user: str, implicit: bool = False) -> None:
        node = self._nodes.get(user)
        still_used = node is not None and (
            (not implicit and tensor in node.inputs) or tensor in self._implicit.get(user, [])
        )
        if node is not None and implicit and tensor in node.inputs:
            still_used = True
        if still_used:
            return
        users = self._consumers.get(tensor)
        if users is not None:
            users.pop(user, None)
            if not users:
                del self._consumers[tensor]
        producer = self._producer.get(tensor)
        if producer is not None and self._nx is not None and self._nx.has_edge(producer, user, key=tensor):
            self._nx.remove_edge(producer, user, key=tensor)

    def _users_outside(self, tensor: str, excluded: set[str]) -> list[str]:
        return [u for u in self._consumers.get(tensor, {}) if u not in excluded]

    def remove_node(self, node: Node) -> None:
        """Remove ``node``. Refused while any of its outputs is still read or is a graph output."""
        self._check_member(node)
        for t in node.outputs:
            if not t:
                continue
            users = self._users_outside(t, {node.name})
            if users:
                raise InvalidGraph(
                    f"cannot remove node {node.name!r}: its output {t!r} is still used by {', '.join(map(repr, users))}; "
                    "rewire them first with replace_all_uses()"
                )
            if t in self._outputs:
                raise InvalidGraph(f"cannot remove node {node.name!r}: its output {t!r} is a graph output")
        self._detach(node)

    def _detach(self, node: Node) -> None:
        for t in node.inputs:
            if t:
                users = self._consumers.get(t)
                if users is not None:
                    users.pop(node.name, None)
                    if not users:
                        del self._consumers[t]
        for t in self._implicit.pop(node.name, []):
            users = self._consumers.get(t)
            if users is not None:
                users.pop(node.name, None)
                if not users:
                    del self._consumers[t]
        for t in node.outputs:
            if t and self._producer.get(t) == node.name:
                del self._producer[t]
                self._value_info.pop(t, None)
        self._by_op[(node.domain, node.op_type)].pop(node.name, None)
        if self._nx is not None:
            self._nx.remove_node(node.name)
        del self._nodes[node.name]
        node.graph = None
        self._order_cache = None  # removing a node keeps a topological order topological

    def _check_member(self, node: Node) -> None:
        if self._nodes.get(node.name) is not node:
            raise InvalidGraph(f"node {node.name!r} does not belong to graph {self.name!r}")

    def set_node_input(self, node: Node, index: int, tensor: str) -> None:
        self._check_member(node)
        old = node.inputs[index]
        node.inputs[index] = tensor
        if old:
            self._drop_use(old, node.name)
        if tensor:
            self._add_use(tensor, node.name)

    def set_node_inputs(self, node: Node, inputs: list[str]) -> None:
        self._check_member(node)
        old = list(node.inputs)
        node.inputs = list(inputs)
        for t in old:
            if t:
                self._drop_use(t, node.name)
        for t in node.inputs:
            if t:
                self._add_use(t, node.name)

    def replace_all_uses(self, old: str, new: str, *, include_outputs: bool = True) -> int:
        """Make every reader of ``old`` read ``new``; returns the number of uses rewired.

        Graph-output entries are renamed too unless ``include_outputs`` is False (the model's output
        name then changes: use ``rename_tensor`` to keep an interface name instead)."""
        if old == new:
            return 0
        count = 0
        for user in self.consumers(old):
            if old in user.inputs:
                self.set_node_inputs(user, [new if t == old else t for t in user.inputs])
                count += 1
            if old in self._implicit.get(user.name, []):
                for sub in user.subgraphs():
                    count += sub._rename_outer(old, new)
                self._adopt_subgraphs(user)
        if include_outputs and old in self._outputs:
            self._rename_output(old, new)
            count += 1
        return count

    def _rename_output(self, old: str, new: str) -> None:
        self._outputs = _NameList(new if t == old else t for t in self._outputs)
        info = self._io_info.pop(old, None)
        if info is not None and new not in self._io_info:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(info)
            copy.name = new
            self._io_info[new] = copy

    def _rename_outer(self, old: str, new: str) -> int:
        if self.defines(old):
            return 0  # shadowed here
        count = 0
        for node in self.nodes():
            if old in node.inputs:
                self.set_node_inputs(node, [new if t == old else t for t in node.inputs])
                count += 1
            if old in self._implicit.get(node.name, []):
                for sub in node.subgraphs():
                    count += sub._rename_outer(old, new)
                self._adopt_subgraphs(node)
        if old in self._outputs:
            self._rename_output(old, new)
            count += 1
        return count

    def rename_tensor(self, old: str, new: str) -> None:
        """Rename tensor ``old`` to ``new`` everywhere in this graph (producer, readers, outputs, value_info)."""
        if old == new:
            return
        if new in self._producer or new in self._inits or new in self._inputs:
            raise InvalidGraph(f"cannot rename {old!r} to {new!r}: {new!r} already exists in graph {self.name!r}")
        producer = self.producer(old)
        if producer is not None:
            outputs = [new if t == old else t for t in producer.outputs]
            self._detach_outputs(producer)
            producer.outputs = outputs
            self._attach_outputs(producer)
        elif old in self._inits:
            proto = self._inits.pop(old)
            proto.name = new
            self._inits[new] = proto
            self._const_cache.pop(old, None)
        if old in self._inputs:
            self._inputs = _NameList(new if t == old else t for t in self._inputs)
            info = self._io_info.pop(old, None)
            if info is not None:
                info.name = new
                self._io_info[new] = info
        if old in self._value_info:
            vi = self._value_info.pop(old)
            vi.name = new
            self._value_info[new] = vi
        self._reserve(new)
        self.replace_all_uses(old, new)

    def _detach_outputs(self, node: Node) -> None:
        for t in node.outputs:
            if t and self._producer.get(t) == node.name:
                del self._producer[t]
                for user in self._consumers.get(t, {}):
                    if self._nx is not None and self._nx.has_edge(node.name, user, key=t):
                        self._nx.remove_edge(node.name, user, key=t)

    def _attach_outputs(self, node: Node) -> None:
        for t in node.outputs:
            if t:
                self._producer[t] = node.name
                self._reserve(t)
                for user in self._consumers.get(t, {}):
                    if self._topo_valid and self._nodes[user]._pos < node._pos:
                        self._topo_valid = False
                    if self._nx is not None:
                        self._nx.add_edge(node.name, user, key=t)

    def replace_subgraph(self, old_nodes: list[Node], new_nodes: list[dict[str, Any]]) -> list[Node]:
        """Atomically replace ``old_nodes`` by nodes built from ``new_nodes`` specs.

        Each spec is a dict with ``op_type``, ``inputs`` and ``outputs`` and optionally ``domain``,
        ``attrs``, ``name``, ``doc_string`` and ``overload``. Every tensor the old nodes produce that is
        read outside them, or is a graph output, must be produced by a new node (new nodes may reuse old
        tensor names, which is how graph outputs keep their names). Nothing changes on failure."""
        for n in old_nodes:
            self._check_member(n)
        old_names = {n.name for n in old_nodes}
        produced_old = [t for n in old_nodes for t in n.outputs if t]
        produced_new = [t for spec in new_nodes for t in spec.get("outputs", [])]
        if len(set(produced_new)) != len(produced_new):
            raise InvalidGraph("replace_subgraph: the new nodes produce a tensor twice")
        for t in produced_new:
            if t in self._producer and self._producer[t] not in old_names:
                raise InvalidGraph(f"replace_subgraph: tensor {t!r} is already produced by node {self._producer[t]!r}")
        for t in produced_old:
            external = self._users_outside(t, old_names)
            if (external or t in self._outputs) and t not in produced_new:
                where = f"read by {', '.join(map(repr, external))}" if external else "a graph output"
                raise InvalidGraph(f"replace_subgraph: tensor {t!r} is {where} but the replacement does not produce it")
        internal_only = set(produced_old) - set(produced_new)
        for spec in new_nodes:
            for t in spec.get("inputs", []):
                if t in internal_only:
                    raise InvalidGraph(f"replace_subgraph: new node reads {t!r}, which the replaced nodes produced and the replacement removes")
        anchor = max((n._pos for n in old_nodes), default=(self._next_pos,))
        for n in sorted(old_nodes, key=lambda n: n._pos, reverse=True):
            self._detach(n)
        created = []
        for i, spec in enumerate(new_nodes):
            created.append(
                self.add_node(
                    spec["op_type"],
                    spec.get("inputs", []),
                    spec.get("outputs"),
                    name=spec.get("name") if spec.get("name") not in self._nodes else None,
                    domain=spec.get("domain", ""),
                    attrs=spec.get("attrs"),
                    doc_string=spec.get("doc_string", ""),
                    overload=spec.get("overload", ""),
                    _pos=anchor + (i,),
                )
            )
        return created

    # ------------------------------------------------------------------ mutation: tensors and I/O
    def add_initializer(self, array: np.ndarray | onnx.TensorProto, name_hint: str = "const", *, exact_name: bool = False) -> str:
        if isinstance(array, onnx.TensorProto):
            proto = onnx.TensorProto()
            proto.CopyFrom(array)
        else:
            proto = numpy_helper.from_array(np.asarray(array))
        if exact_name:
            name = name_hint
            if name in self._inits or name in self._producer:
                raise InvalidGraph(f"cannot add initializer {name!r}: the name is taken")
            self._reserve(name)
        else:
            name = self.unique_name(name_hint)
        proto.name = name
        self._inits[name] = proto
        return name

    def replace_with_initializers(self, node: Node, values: "list[np.ndarray | onnx.TensorProto | None]") -> None:
        """Turn ``node`` into initializers with the same output names (one value per output; an
        output whose value is None must be unused). Readers keep reading the same names, so no use
        is rewired: this is how Constant nodes and folded constants become weights."""
        self._check_member(node)
        for t, v in zip(node.outputs, values):
            if t and v is None and (self._users_outside(t, {node.name}) or t in self._outputs):
                raise InvalidGraph(f"cannot fold node {node.name!r}: its output {t!r} is used but has no value")
        outputs = [(t, v) for t, v in zip(node.outputs, values) if t and v is not None]
        self._detach(node)
        for t, v in outputs:
            if isinstance(v, onnx.TensorProto):
                proto = onnx.TensorProto()
                proto.CopyFrom(v)
            else:
                proto = numpy_helper.from_array(np.asarray(v))
            proto.name = t
            self._inits[t] = proto
            self._const_cache.pop(t, None)
            self._value_info.pop(t, None)
            if self._nx is not None:  # (its readers keep their nodes in the networkx view)
                for user in self._consumers.get(t, {}):
                    if not self._nx.has_node(user):
                        self._nx.add_node(user)

    def remove_initializer(self, name: str) -> None:
        if self._consumers.get(name):
            users = ", ".join(map(repr, self._consumers[name]))
            raise InvalidGraph(f"cannot remove initializer {name!r}: still used by {users}")
        if name in self._outputs:
            raise InvalidGraph(f"cannot remove initializer {name!r}: it is a graph output")
        self._inits.pop(name, None)
        self._const_cache.pop(name, None)
        if name in self._inputs:
            self._inputs.remove(name)
            self._io_info.pop(name, None)

    def set_value_info(self, tensor: str, dtype: int | None, shape: Iterable[int | str | None] | None) -> None:
        vi = onnx.helper.make_tensor_value_info(tensor, dtype or 0, None if shape is None else list(shape))
        if tensor in self._io_info:
            self._io_info[tensor] = vi
        else:
            self._value_info[tensor] = vi

    def clear_value_info(self, tensor: str) -> None:
        self._value_info.pop(tensor, None)

    def merge_value_info(self, infos: Iterable[onnx.ValueInfoProto]) -> int:
        """Add value_info (for example from onnx shape inference) for tensors that have none yet."""
        added = 0
        io_info, value_info, producer, consumers = self._io_info, self._value_info, self._producer, self._consumers
        for vi in infos:
            name = vi.name  # read once: upb makes a new string on every read (20k entries after inference)
            if name not in io_info and name not in value_info and (name in producer or name in consumers):
                value_info[name] = vi
                added += 1
        return added

    def refine_value_info(self, vi: onnx.ValueInfoProto) -> bool:
        """Replace the value_info of an intermediate tensor (not a graph input or output) by ``vi``
        (shape inference that proves more dims now); False when the tensor is not in this graph."""
        if vi.name in self._io_info or not (vi.name in self._producer or vi.name in self._consumers):
            return False
        if vi.name in self._inits:
            return False
        self._value_info[vi.name] = vi
        return True

    def value_info_names(self) -> list[str]:
        return list(self._value_info)

    def set_outputs(self, outputs: list[str]) -> None:
        for t in outputs:
            if t not in self._io_info:
                vi = self._value_info.get(t)
                self._io_info[t] = vi if vi is not None else onnx.ValueInfoProto(name=t)
        self._outputs = _NameList(outputs)

    # ------------------------------------------------------------------ order and checks
    def topological_order(self) -> list[str] | None:
        """Node names in the topological order that, among the nodes whose inputs are ready, always
        takes the one placed first (the order of networkx's ``lexicographical_topological_sort``
        keyed by position, ties by insertion), from the producer/consumer indexes without building
        ``nx``; None when the graph has a cycle."""
        return traverse.topological_order(self)

    def toposort(self) -> "Graph":
        """Reorder nodes topologically, stable with respect to the current order (deterministic)."""
        if self._topo_valid:
            order = [n.name for n in self.nodes()]
        else:
            order = self.topological_order()
            if order is None:
                self.lint()
                raise _networkx().NetworkXUnfeasible("Graph contains a cycle or graph changed during iteration")
        for i, name in enumerate(order):
            self._nodes[name]._pos = (i,)
        self._next_pos = len(order)
        self._order_cache = None
        self._topo_valid = True
        for node in self._nodes.values():
            for sub in node.subgraphs():
                sub.toposort()
        return self

    def lint(self) -> "Graph":
        """Raise ``InvalidGraph`` on a cycle, a dangling input, a tensor with two producers, an output
        with no producer, duplicate graph outputs or inconsistent indexes."""
        return checks.lint(self)

    def copy(self) -> "Graph":
        from graphopt.ir.convert import from_model, to_model

        return from_model(to_model(self))

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self)} nodes, {len(self._inputs)} inputs, {len(self._outputs)} outputs)"


#: Constants up to this size are cached as arrays; larger ones (weights) are decoded on each use.
_CACHE_MAX_BYTES = 2**20
