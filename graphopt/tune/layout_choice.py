"""Layout-aware lowering choice: pick the conv-like nodes' lowerings jointly, counting the layout
conversions their declared layouts imply.

Each lowering declares the layout of its inputs and outputs (``Candidate.layouts(sig)``, the same
tuple its ``build`` puts on the ``Lowering``): cuDNN's fused conv graphs are NHWC, graphopt's own
conv kernels NCHW. The runtime converts an activation wherever its producer left it in another
layout than its consumer declares. Choosing every node's fastest candidate alone can therefore cost
more than it saves: MobileNetV2's depthwise convs (own ``direct`` kernel, NCHW) between 1x1 convs
(cuDNN, NHWC) convert twice per block. This module minimises, per graph and shape bucket::

    total = sum(chosen candidate's time) + sum(conversion_ms(tensor) for every edge whose
            producer layout differs from what its consumer reads)

How the graph moves layouts (``_Walk``, the one place this is modelled; it mirrors the runtime):

- a graph input is NCHW; a constant (weights) has no layout cost (it is put into the lowering's
  layout once, when the session is built);
- a custom node's inputs and outputs are in its candidate's declared layouts (``""``, ``rowmajor``
  and "not declared" all mean C-contiguous, i.e. NCHW);
- a layout-neutral standard op (``NEUTRAL_OPS``: elementwise ops, pooling, Concat, Resize,
  BatchNormalization, ...) runs in the layout of its first activation input and keeps it; another
  activation input in another layout is converted to it;
- any other standard op (Reshape, Flatten, Transpose, Slice, Pad, MatMul, a Conv left unfused ...)
  reads NCHW, and so does a graph output;
- a tensor whose layout changes nothing in memory (rank below 3, one channel, or one spatial
  position, such as GlobalAveragePool's output) never costs a conversion.

The algorithm: candidates of a node are grouped by their declared layouts and only the fastest of
each group is kept (the others cannot win). A greedy pass in topological order gives every node
the option with the least ``own time + conversions of its inputs`` against the layouts its
producers already have; then improvement sweeps try every other option of each node with the rest
fixed and keep a change that lowers the whole graph's total (the walk counts the conversions on
both sides and through the layout-neutral ops), until a sweep changes nothing (at most
``MAX_SWEEPS``). A region that pays off only as a whole (three convs each a little faster in NHWC,
none worth its own two conversions) is out of reach of single changes, so the sweeps also start
from "every node in NHWC where it has such an option" and from "every node in NCHW", and the
cheapest of the three results wins. Ties keep the earlier option and the earlier start, and the
selection's own pick comes first, so a graph where layout changes nothing keeps exactly the
per-node fastest choice. Every step is deterministic.

A conversion's time is estimated (``conversion_ms``): it reads and writes the tensor once at copy
bandwidth ``COPY_GBPS`` plus one kernel launch ``CONVERSION_LAUNCH_MS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from graphopt.lowering.layout import ELEMENTWISE_OPS, WEIGHT_LAYOUTS
from graphopt.tune.signatures import default_dim

NCHW, NHWC = "NCHW", "NHWC"
LAYOUT_ATTR = "lowering_layout"  # the layout the node's output runs in, recorded on LAYOUT_OPS nodes
# graphopt ops that take N-C-spatial activations: their nodes record LAYOUT_ATTR.
LAYOUT_OPS = frozenset({"CBR", "GroupNorm"})
# Copy bandwidth measured on the H200 (4.22 TB/s, design.md); on other GPUs an estimate (a slower
# GPU's kernels are slower too, so the ratio of conversion to kernel time stays of the same order).
COPY_GBPS = 4220.0
# One more kernel in the plan (inside a CUDA graph a launch costs a few microseconds): an estimate.
CONVERSION_LAUNCH_MS = 0.002
MAX_SWEEPS = 8
_EPS = 1e-9

# Standard ops that run in their first activation input's layout and keep it: the elementwise ops
# through graphopt.runtime.onnx_ops.layout_order (CuPy's own ufuncs write C order, whatever their
# inputs' strides: until 2026-12-06 an NHWC region's Mul came out NCHW), BatchNormalization likewise,
# the pooling kernel, Concat and Resize by their implementations.
NEUTRAL_OPS = ELEMENTWISE_OPS | frozenset({
    "AveragePool", "BatchNormalization", "Concat", "GlobalAveragePool", "GlobalMaxPool", "MaxPool", "Resize", "Upsample",
})


def physical(layout: str) -> str:
    """What a declared layout means in memory: NHWC, a weight layout (``colmajor``), or C-contiguous
    (NCHW) for everything else."""
    return layout if layout == NHWC or layout in WEIGHT_LAYOUTS else NCHW


def significant(shape: Sequence[int] | None) -> bool:
    """Whether NHWC and NCHW differ in memory for a tensor of this shape (unknown: assume they do)."""
    if shape is None:
        return True
    if len(shape) < 3:
        return False
    return int(shape[1]) > 1 and math.prod(int(d) for d in shape[2:]) > 1


def conversion_ms(shape: Sequence[int] | None, itemsize: int) -> float:
    """Estimated time of one layout conversion of a tensor: read + write at ``COPY_GBPS``, plus a
    launch; 0 where the layouts are the same memory. An unknown shape costs the launch only."""
    if not significant(shape):
        return 0.0
    nbytes = 0 if shape is None else math.prod(int(d) for d in shape) * int(itemsize)
    return CONVERSION_LAUNCH_MS + 2.0 * nbytes / (COPY_GBPS * 1e9) * 1e3


@dataclass(frozen=True)
class Option:
    """One way to run a node: a candidate, its time and its declared layouts (inputs, then outputs)."""

    key: str
    lowering: str
    params: str
    ms: float
    layouts: tuple[str, ...] = ()

    def input_layout(self, i: int) -> str:
        return physical(self.layouts[i] if i < len(self.layouts) else "")

    def output_layout(self, n_inputs: int, j: int) -> str:
        return self.input_layout(n_inputs + j)


@dataclass(frozen=True)
class Conversion:
    """One conversion left in the chosen plan."""

    graph: str
    tensor: str
    producer: str  # "" for a graph input
    consumer: str  # "" for a graph output
    src: str
    dst: str
    ms: float
    shape: tuple[int, ...] | None

    def to_dict(self) -> dict:
        return {"graph": self.graph, "tensor": self.tensor, "producer": self.producer, "consumer": self.consumer,
                "from": self.src, "to": self.dst, "ms": self.ms, "shape": None if self.shape is None else list(self.shape)}


def reduce_options(options: Sequence[Option], n_inputs: int, n_outputs: int) -> list[Option]:
    """The first (fastest, the selection's pick first) option of each distinct layout behaviour."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for o in options:
        sig = tuple(o.input_layout(i) for i in range(n_inputs)) + tuple(
            o.output_layout(n_inputs, j) for j in range(n_outputs))
        if sig not in seen:
            seen.add(sig)
            out.append(o)
    return out


@dataclass
class Plan:
    """The chosen option per node, the conversions that remain and the plan's estimated total."""

    choice: dict[str, Option]
    conversions: list[Conversion] = field(default_factory=list)
    total_ms: float = 0.0
    # node -> how much the whole plan would grow if that node took its own fastest option instead
    savings: dict[str, float] = field(default_factory=dict)


class _Walk:
    """One (sub)graph at one bucket's shapes: walks its nodes in topological order and counts what a
    choice of options costs (see the module docstring for the rules)."""

    def __init__(self, graph, options: Mapping[str, Sequence[Option]], shape_of: Callable[[str], tuple | None],
                 itemsize_of: Callable[[str], int]):
        self.g = graph
        self.order = _topological(graph)
        self.options = {n.name: reduce_options(self._fitting(n, options[n.name]), len(n.inputs), len(n.outputs))
                        for n in self.order if options.get(n.name)}
        self.n_inputs = {n.name: len(n.inputs) for n in self.order}
        self.shape_of = shape_of
        self.itemsize_of = itemsize_of
        self._cost: dict[str, float] = {}
        self._shape: dict[str, tuple | None] = {}

    def _fitting(self, node, opts: Sequence[Option]) -> list[Option]:
        """``opts`` less those declaring a weight layout (``WEIGHT_LAYOUTS``) for an input that is not a
        constant: the runtime would convert that input on every run. All of them if none is left."""
        ok = [o for o in opts if not any(o.input_layout(i) in WEIGHT_LAYOUTS and t and not self.g.is_constant(t)
                                         for i, t in enumerate(node.inputs))]
        return ok or list(opts)

    def shape(self, t: str) -> tuple | None:
        if t not in self._shape:
            self._shape[t] = self.shape_of(t)
        return self._shape[t]

    def cost(self, t: str) -> float:
        c = self._cost.get(t)
        if c is None:
            c = self._cost[t] = conversion_ms(self.shape(t), self.itemsize_of(t))
        return c

    def _activation(self, t: str) -> bool:
        return bool(t) and not self.g.is_constant(t) and self.cost(t) > 0

    def run(self, choice: Mapping[str, Option]) -> Plan:
        """The plan for ``choice``; a node missing from ``choice`` takes its locally cheapest option
        (own time + conversions of its inputs from the layouts its producers left): the greedy pass."""
        lay: dict[str, str] = {}
        picked: dict[str, Option] = {}
        conversions: list[Conversion] = []
        total = 0.0

        def convert(t: str, src: str, dst: str, consumer: str) -> None:
            prod = self.g.producer(t)
            conversions.append(Conversion(self.g.name, t, prod.name if prod is not None else "", consumer, src, dst,
                                          self.cost(t), self.shape(t)))

        for n in self.order:
            ins = list(n.inputs)
            opts = self.options.get(n.name)
            if opts:
                opt = choice.get(n.name)
                if opt is None:
                    opt = min(opts, key=lambda o: o.ms + sum(
                        self.cost(t) for i, t in enumerate(ins)
                        if self._activation(t) and lay.get(t, NCHW) != o.input_layout(i)))
                picked[n.name] = opt
                total += opt.ms
                for i, t in enumerate(ins):
                    if self._activation(t) and lay.get(t, NCHW) != opt.input_layout(i):
                        convert(t, lay.get(t, NCHW), opt.input_layout(i), n.name)
                for j, t in enumerate(n.outputs):
                    lay[t] = opt.output_layout(len(ins), j)
                continue
            acts = [t for t in ins if self._activation(t)]
            if n.op_type in NEUTRAL_OPS and n.domain == "" and acts:
                out = lay.get(acts[0], NCHW)
                for t in acts[1:]:
                    if lay.get(t, NCHW) != out:
                        convert(t, lay.get(t, NCHW), out, n.name)
            else:
                out = NCHW
                for t in acts:
                    if lay.get(t, NCHW) != NCHW:
                        convert(t, lay[t], NCHW, n.name)
            for t in n.outputs:
                lay[t] = out
        for t in self.g.outputs:
            if self._activation(t) and lay.get(t, NCHW) != NCHW:
                convert(t, lay[t], NCHW, "")
        total += sum(c.ms for c in conversions)
        return Plan(picked, conversions, total)

    def _prefer(self, layout: str) -> dict[str, Option]:
        """Every node's fastest option whose output is in ``layout`` (its pick where it has none)."""
        return {name: next((o for o in opts if o.output_layout(self.n_inputs[name], 0) == layout), opts[0])
                for name, opts in self.options.items()}

    def _sweep(self, best: Plan, choices: list[str]) -> Plan:
        """Single-node changes that lower the total, until none does (at most ``MAX_SWEEPS`` rounds)."""
        for _ in range(MAX_SWEEPS):
            changed = False
            for name in choices:
                for opt in self.options[name]:
                    if opt is best.choice[name]:
                        continue
                    trial = self.run({**best.choice, name: opt})
                    if trial.total_ms < best.total_ms - _EPS:
                        best, changed = trial, True
            if not changed:
                break
        return best

    def solve(self) -> Plan:
        """The greedy pass, and the two whole-graph starts (every node in NHWC where it can, every
        node in NCHW where it can), each improved by sweeps; the cheapest wins, the earlier on a tie."""
        choices = [name for name in (n.name for n in self.order) if len(self.options.get(name, ())) > 1]
        best = self._sweep(self.run({}), choices)
        if choices:
            for layout in (NHWC, NCHW):
                plan = self._sweep(self.run(self._prefer(layout)), choices)
                if plan.total_ms < best.total_ms - _EPS:
                    best = plan
        for name in choices:
            fastest = self.options[name][0]
            if best.choice[name] is not fastest:
                best.savings[name] = self.run({**best.choice, name: fastest}).total_ms - best.total_ms
        return best


def _topological(graph) -> list:
    """The graph's nodes in a stable topological order (the stored order where it already is one)."""
    nodes = graph.nodes()
    made = {t: n.name for n in nodes for t in n.outputs if t}
    done: set[str] = set()
    order: list = []
    pending = list(nodes)
    while pending:
        rest = []
        for n in pending:
            if all(made.get(t) in done or t not in made for t in n.inputs if t):
                order.append(n)
                done.add(n.name)
            else:
                rest.append(n)
        if len(rest) == len(pending):  # a cycle (lint rejects it elsewhere): keep the stored order
            order += rest
            break
        pending = rest
    return order


def solve_graph(graph, options: Mapping[str, Sequence[Option]], shape_of: Callable[[str], tuple | None],
                itemsize_of: Callable[[str], int] = lambda t: 4) -> Plan:
    """The plan for one (sub)graph: ``options[node name]`` lists each custom node's passing
    candidates, the selection's pick first; ``shape_of(tensor)`` (None: unknown) and
    ``itemsize_of(tensor)`` give the sizes conversions are estimated from."""
    plain = _all_nchw(graph, options)
    if plain is not None:
        return plain
    return _Walk(graph, options, shape_of, itemsize_of).solve()


def _all_nchw(graph, options: Mapping[str, Sequence[Option]]) -> Plan | None:
    """The plan when every node has one option left (``reduce_options``) and it reads and writes only
    NCHW: no tensor ever leaves NCHW, so nothing converts and each node keeps its pick; the walk
    would find the same. None otherwise. (A 20k-node transformer's walk took 0.14 s for this.)"""
    choice: dict[str, Option] = {}
    for name, opts in options.items():
        if not opts or not graph.has_node(name):
            continue
        node = graph.node(name)
        n_in, n_out = len(node.inputs), len(node.outputs)
        kept = reduce_options(opts, n_in, n_out)
        if len(kept) != 1 or any(kept[0].input_layout(i) != NCHW for i in range(n_in + n_out)):
            return None
        choice[name] = kept[0]
    return Plan(choice, [], sum(o.ms for o in choice.values()))


def options_from_timings(pick_key: str, pick: tuple[str, str], timings: Sequence[Mapping[str, Any]],
                         layouts_of: Callable[[str], tuple[str, ...]]) -> list[Option]:
    """A node's options from its profiled / cached timings: the pick first, then every other passing
    candidate by time. Without a timing for the pick (the heuristic's), the pick alone, at 0 ms."""
    ok = [t for t in timings if t.get("status") == "ok" and t.get("ms") is not None]
    mine = next((t for t in ok if t.get("candidate") == pick_key), None)
    first = Option(pick_key, pick[0], pick[1], float(mine["ms"]) if mine else 0.0, tuple(layouts_of(pick_key)))
    if mine is None:
        return [first]
    rest = sorted((t for t in ok if t.get("candidate") != pick_key), key=lambda t: float(t["ms"]))
    return [first] + [Option(str(t["candidate"]), str(t.get("lowering", "")), str(t.get("params", "") or ""),
                             float(t["ms"]), tuple(layouts_of(str(t["candidate"])))) for t in rest]


def _bound(shape, dims: Mapping[str, int]) -> tuple[int, ...] | None:
    """``shape`` with symbolic dims bound from ``dims`` (else their documented default)."""
    if shape is None:
        return None
    return tuple(int(d) if isinstance(d, int) and d >= 0 else
                 int(dims.get(d, default_dim(d if isinstance(d, str) and d else None)[0])) for d in shape)


def _itemsize(graph, t: str) -> int:
    try:
        import numpy as np
        from onnx import helper

        return int(np.dtype(helper.tensor_dtype_to_np_dtype(graph.value_info(t).dtype)).itemsize)
    except Exception:  # noqa: BLE001 - unknown dtype: assume 4 bytes
        return 4


def choose_layouts(nodes: Sequence[tuple[Any, Any]], picks: Sequence[Sequence[Any]], sigs: Sequence[Sequence[Any]],
                   dims_per_bucket: Sequence[Mapping[str, int]],
                   layouts_of: Callable[[Any, str], tuple[str, ...]]) -> list[dict]:
    """Re-choose every custom node's lowering with the conversions counted, in place.

    ``nodes[i]`` is ``(graph, node)``; ``picks[i][b]`` its ``NodeSelection`` at bucket ``b`` (its
    ``timings`` give the options; ``lowering`` / ``params`` / ``reason`` / ``layout`` are updated);
    ``sigs[i][b]`` its ``Signature`` there; ``layouts_of(sig, candidate key)`` a candidate's declared
    layouts. Each (sub)graph and bucket is solved on its own. Returns the conversions that remain,
    as dicts with the bucket's ``dims``.
    """
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i, (g, _) in enumerate(nodes):
        groups.setdefault(id(g), (g, []))[1].append(i)
    remaining: list[dict] = []
    for b, dims in enumerate(dims_per_bucket):
        for g, idx in groups.values():
            known: dict[str, tuple] = {}
            options: dict[str, list[Option]] = {}
            for i in idx:
                node, pick, sig = nodes[i][1], picks[i][b], sigs[i][b]
                known.update({t: s for t, s in zip(node.inputs, sig.input_shapes) if t and s is not None})
                key = f"{pick.lowering}:{pick.params}" if pick.params else pick.lowering
                options[node.name] = options_from_timings(key, (pick.lowering, pick.params), pick.timings,
                                                          lambda k, sig=sig: layouts_of(sig, k))
            plan = solve_graph(g, options, lambda t, g=g, known=known: known[t] if t in known else
                               _bound(g.value_info(t).shape, dims), lambda t, g=g: _itemsize(g, t))
            for i in idx:
                node, pick = nodes[i][1], picks[i][b]
                chosen, fastest = plan.choice[node.name], options[node.name][0]
                out_layout = chosen.output_layout(len(node.inputs), 0)
                pick.layout = out_layout if node.op_type in LAYOUT_OPS else ""
                if chosen is not fastest:
                    pick.lowering, pick.params = chosen.lowering, chosen.params
                    pick.reason += (f"; layout: {chosen.key} ({chosen.ms:.4g} ms, {out_layout}) instead of the fastest "
                                    f"{fastest.key} ({fastest.ms:.4g} ms, {fastest.output_layout(len(node.inputs), 0)}): "
                                    f"the graph is {plan.savings.get(node.name, 0.0):.4g} ms faster with its layout "
                                    "conversions counted")
            bucket = dict(picks[idx[0]][b].dims)
            remaining += [{**c.to_dict(), "dims": bucket} for c in plan.conversions]
    return remaining


def layout_line(conversions: Sequence[Mapping[str, Any]]) -> str:
    """``layout: 2 conversions remain (estimated 0.0123 ms)``, or that none remain."""
    if not conversions:
        return "layout: no layout conversions remain"
    ms = sum(float(c["ms"]) for c in conversions)
    n = len(conversions)
    verb = "conversions remain" if n != 1 else "conversion remains"
    return f"layout: {n} {verb} (estimated {ms:.4g} ms)"


__all__ = ["CONVERSION_LAUNCH_MS", "COPY_GBPS", "Conversion", "choose_layouts", "LAYOUT_ATTR", "LAYOUT_OPS", "NEUTRAL_OPS", "Option",
           "Plan", "conversion_ms", "layout_line", "options_from_timings", "physical", "reduce_options",
           "significant", "solve_graph"]
