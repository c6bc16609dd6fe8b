"""The fixpoint driver: check matches, build replacements, rewrite, record provenance and explain.

For every graph (the main graph, then each subgraph from ``graph.graphs()``) the driver runs
passes until one pass changes nothing (rules of priority below 0 are late: they join once the
others have reached their fixpoint). A pass goes over the rules in order (priority, then
name) and, for each rule, over the candidates ``graph.nodes_by_op(root op)`` in graph order, so
the result is deterministic. A rule that keeps firing for ``max_passes`` passes (A -> B -> A)
raises ``RuleError`` naming the rules still firing.

Without ``explain``, a rule whose pattern has an op the graph lacks is skipped for the pass (the
graph changes only through rewrites, constraints and builders are pure, and this rule's first
rewrite would need that op), and a candidate reaches the matcher only when ``could_match`` (the
pattern's op skeleton, a cheap relaxation of the match) allows it; with ``explain`` every
candidate is tried, because a failed attempt is the near-miss to report.

Each structural match (see ``_matcher``) goes through, in order:
1. the intermediate check, for every rule: no matched node except the root may have a consumer
   outside the match or be a graph output, unless the rule ``keep``s it or lists it in
   ``outputs`` (the new node then produces that tensor too);
2. the rule's ``where`` constraints;
3. building the replacement (builders, attribute copies, the op schema's ``validate``);
4. the cycle check.
The first failure is the reason; a match that fails tries the next operand order. With
``explain=True`` the last pass records near-misses: candidates that matched the whole pattern
but failed a check, or (patterns of 4+ ops) matched all but one of its ops, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import onnx

from graphopt.errors import InvalidGraph, RuleError
from graphopt.rewrite import registry
from graphopt.rewrite._validate import op_schema
from graphopt.rewrite._matcher import Binding, Trace, could_match, match_root
from graphopt.rewrite._rules import Rule, RuleSet
from graphopt.rewrite._typing import type_standard_outputs
from graphopt.rewrite._syntax import Call, Lit, Name, is_builder
from graphopt.rewrite.registry import BuildFailed, NewConstant

DEFAULT_MAX_PASSES = 100
PROVENANCE_PREFIX = "graphopt rule="


class Match(NamedTuple):
    """One rewrite: the rule, the new node's name, and the original nodes it replaced."""

    rule: str
    node: str
    sources: tuple[str, ...]


class NearMiss(NamedTuple):
    """A candidate whose root op matched but that failed deeper, with the reason."""

    rule: str
    anchor: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rule} at node {self.anchor!r}: {self.reason}"


@dataclass
class RewriteReport:
    """What ``apply_rules`` did: hits per rule, every match, and (explain) every near-miss."""

    counts: dict[str, int] = field(default_factory=dict)
    matches: list[Match] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)
    passes: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict:
        """A JSON-ready record (for ``--report`` and the graph-level provenance)."""
        return {
            "counts": dict(sorted(self.counts.items())),
            "matches": [{"rule": m.rule, "node": m.node, "from": list(m.sources)} for m in self.matches],
            "near_misses": [{"rule": n.rule, "anchor": n.anchor, "reason": n.reason} for n in self.near_misses],
            "passes": self.passes,
        }


# ----------------------------------------------------------------------------------------------


@dataclass
class _Plan:
    rule: Rule
    root: object
    removed: list  # nodes, graph order
    specs: list  # new node specs, producers first; the last one produces the root's outputs
    constants: list  # [(placeholder, NewConstant)]
    temps: list  # placeholders of the nested nodes' outputs
    sources: tuple[str, ...]
    typed: list  # [(new tensor or placeholder, tensor whose value_info it takes)]


class _Fail(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _provenance_sources(node) -> list[str]:
    doc = node.doc_string or ""
    if doc.startswith(PROVENANCE_PREFIX) and " from=" in doc:
        return [s for s in doc.split(" from=", 1)[1].split()[0].split(",") if s]
    return [node.name]


def _check_intermediates(g, rule: Rule, b: Binding, root) -> None:
    matched = {n.name for n, _ in b.matched}
    kept = {b.nodes[k].name for k in rule.keep + rule.outputs}
    for node, _ in b.matched:
        if node is root or node.name in kept:
            continue
        for out in node.outputs:
            if not out:
                continue
            if g.is_graph_output(out):
                raise _Fail(f"intermediate {out!r} is a graph output")
            users = g.consumers(out)
            if any(u.name not in matched for u in users):
                raise _Fail(f"intermediate {out!r} has {len(users)} consumers ({', '.join(u.name for u in users)})")


def _removed_nodes(g, rule: Rule, b: Binding, root) -> list:
    """Matched nodes the rewrite deletes: all but the kept ones and what they still read."""
    keep = {b.nodes[k].name for k in rule.keep}
    taken = {b.nodes[k].name for k in rule.outputs}  # their tensors become the new node's outputs
    removed = {n.name: n for n, _ in b.matched if n.name not in keep}
    changed = True
    while changed:  # a node read by a kept node stays too
        changed = False
        for name, node in list(removed.items()):
            if node is root or name in taken:
                continue
            for out in node.outputs:
                if out and (g.is_graph_output(out) or any(u.name not in removed for u in g.consumers(out))):
                    del removed[name]
                    changed = True
                    break
    return [n for n, _ in b.matched if n.name in removed]


def _arg_value(g, arg, kind: str, b: Binding):
    if isinstance(arg, Lit):
        return arg.value
    if kind == "n":
        return b.nodes[arg.name]
    return b.tensors.get(arg.name)


def _check_constraints(g, rule: Rule, b: Binding) -> None:
    for call in rule.where:
        reg = registry.CONSTRAINTS[call.name]
        args = [_arg_value(g, a, reg.kind_at(i), b) for i, a in enumerate(call.args)]
        try:
            reason = reg.fn(g, *args)
        except Exception as exc:  # a broken (user) constraint must name itself, not crash anonymously
            raise RuleError(f"rule {rule.name!r}: constraint {call.text} raised {type(exc).__name__}: {exc}") from exc
        if reason:
            raise _Fail(f"{call.text}: {reason}")


def _call_builder(g, rule: Rule, call: Call, b: Binding):
    reg = registry.BUILDERS[call.op]
    args = [_arg_value(g, a, reg.kind_at(i), b) for i, a in enumerate(call.args)]
    try:
        return reg.fn(g, *args)
    except BuildFailed as exc:
        raise _Fail(f"{call.op}(): {exc}") from None
    except Exception as exc:
        raise RuleError(f"rule {rule.name!r}: builder {call.op}() raised {type(exc).__name__}: {exc}") from exc


class _Scratch:
    """What building one replacement collects: new constants, new node specs, builder tensors."""

    def __init__(self):
        self.constants: list = []  # [(token, NewConstant)]
        self.specs: list = []  # node specs, producers before consumers
        self.temps: list = []  # tokens of the nested nodes' outputs
        self.builder_tensors: list = []
        self.shape_like: list = []  # [(new tensor or token, existing tensor with the same type and shape)]


def _tensor_value(g, rule, expr, b: Binding, sc: _Scratch) -> str:
    if isinstance(expr, Name):
        return b.tensors.get(expr.name) or ""
    if not is_builder(expr):  # a nested op: build it; its fresh output feeds the parent
        token = f"\0tmp{len(sc.temps)}"
        sc.temps.append(token)
        _node_spec(g, rule, expr.domain, expr.op, expr.qualname, expr.args, expr.kwargs, [token], b, sc)
        return token
    value = _call_builder(g, rule, expr, b)
    if isinstance(value, NewConstant):
        token = f"\0const{len(sc.constants)}"
        sc.constants.append((token, value))
        return token
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RuleError(f"rule {rule.name!r}: builder {expr.op}() returned {type(value).__name__}, not a tensor")
    sc.builder_tensors.append(value)
    return value


def _copy_attrs(node, schema, target: str) -> dict:
    attrs = {}
    for k, v in node.attrs_dict().items():
        if schema is not True and k not in schema.attributes:
            raise _Fail(f"{node.op_type} {node.name!r} has attribute {k!r}, which {target} does not take")
        attrs[k] = v
    return attrs


def _node_spec(g, rule: Rule, domain, op, qualname, args, kwargs, outputs, b: Binding, sc: _Scratch) -> None:
    """Append the spec of one new node (after those of the nested nodes it reads)."""
    schema = op_schema(domain, op) if domain in ("", "graphopt") else True
    input_names = [n for n, _ in schema.inputs] if schema is not True else []
    inputs = [_tensor_value(g, rule, a, b, sc) for a in args]
    attrs: dict = {}
    for key, expr in kwargs:
        if key == "shape_like":  # a typing hint, not an attribute: the output is typed like that tensor
            sc.shape_like.append((outputs[0], b.tensors.get(expr.name)))
            continue
        if key == "attrs" and isinstance(expr, Name):
            attrs.update(_copy_attrs(b.nodes[expr.name], schema, qualname))
            continue
        if key in input_names and not (isinstance(expr, Call) and is_builder(expr)
                                       and registry.BUILDERS[expr.op].returns == "attrs"):
            idx = input_names.index(key)
            inputs += [""] * (idx + 1 - len(inputs))
            inputs[idx] = _tensor_value(g, rule, expr, b, sc)
            continue
        if isinstance(expr, Lit):
            attrs[key] = expr.value
            continue
        value = _call_builder(g, rule, expr, b)
        if isinstance(value, dict):
            attrs.update(value)
        else:
            attrs[key] = value
    attrs = {k: v for k, v in attrs.items() if v is not None}
    while inputs and not inputs[-1]:
        inputs.pop()
    overload = ""
    if schema is not True:
        if len(outputs) > len(schema.outputs):
            raise _Fail(f"{qualname} has {len(schema.outputs)} outputs, the replaced nodes {len(outputs)}")
        present = [bool(t) for t in inputs]
        reason = schema.validate(attrs, present)
        if reason:
            raise _Fail(f"{qualname} would be invalid: {reason}")

        def dtype_of():  # below opset 15 a body with typed constants has the data dtype in its key
            return g.dtype(inputs[0]) if inputs and inputs[0] and not inputs[0].startswith("\0") else None

        overload = schema.validated_overload(attrs, present, dtype_of if g.root.opset.get("", 0) < 15 else None)
    sc.specs.append(dict(op_type=op, domain=domain, inputs=inputs, outputs=list(outputs), attrs=attrs,
                         overload=overload))


def _build(g, rule: Rule, b: Binding, root) -> _Plan:
    rep = rule.replace
    outputs = list(root.outputs)
    while outputs and not outputs[-1]:
        outputs.pop()
    for k in rule.outputs:
        node = b.nodes[k]
        if len([t for t in node.outputs if t]) != 1:
            raise _Fail(f"{node.op_type} {node.name!r} has {len(node.outputs)} outputs; only a single-output "
                        "node can hand its tensor to the new node")
        outputs.append(node.outputs[0])
    sc = _Scratch()
    _node_spec(g, rule, rep.domain, rep.op, rep.qualname, rep.args, rep.kwargs, outputs, b, sc)

    removed = _removed_nodes(g, rule, b, root)
    removed_names = {n.name for n in removed}
    # A tensor the new node takes over must not feed, outside the match, a tensor the new node reads:
    # the new node would then (indirectly) read its own output.
    for k in rule.outputs:
        taken = b.nodes[k]
        for spec in sc.specs:
            for t in spec["inputs"]:
                if not t or t.startswith("\0") or t in taken.inputs:  # its own inputs come before it
                    continue
                p = g.producer(t)
                if p is not None and p.inputs and p.name not in removed_names and g.may_reach(taken, p):
                    raise _Fail(f"{taken.outputs[0]!r} cannot become an output of the new node: it feeds "
                                f"{t!r}, which the new node reads (a cycle)")
    for spec in sc.specs:
        for t in spec["inputs"]:
            p = g.producer(t) if t and not t.startswith("\0") else None
            if p is not None and p.name in removed_names:
                raise _Fail(f"the replacement reads {t!r}, an intermediate that the rewrite removes")
    # Cycle check. Pattern captures are inputs of matched nodes, which all feed the root, so they
    # cannot depend on the root. A tensor a builder hands back can: check it through the graph.
    for t in sc.builder_tensors:
        p = g.producer(t)
        if p is not None and g.may_reach(root, p):
            raise _Fail(f"reading {t!r} (produced by {p.name!r}, downstream of {root.name!r}) would create a cycle")

    sources: list[str] = []
    for n in removed:
        for s in _provenance_sources(n):
            if s not in sources:
                sources.append(s)
    doc = f"{PROVENANCE_PREFIX}{rule.name} from={','.join(sources)}"
    for spec in sc.specs:
        spec["doc_string"] = doc
    # The root's outputs keep their value_info; shape_like= gives new tensors theirs.
    typed = [(t, t) for t in outputs] + [(new, old) for new, old in sc.shape_like if old]
    return _Plan(rule, root, removed, sc.specs, sc.constants, sc.temps, tuple(sources), typed)


def _try(g, rule: Rule, root, trace: Trace) -> _Plan | str | None:
    """A plan when the rule fires at ``root``; else the reason (or None when not a near-miss)."""
    first: str | None = None
    for b in match_root(g, rule.pattern, root, trace):
        try:
            _check_intermediates(g, rule, b, root)
            _check_constraints(g, rule, b)
            return _build(g, rule, b, root)
        except _Fail as f:
            if first is None:
                first = f.reason
    if first is not None:
        return first
    # A near-miss matched every op of a small pattern (up to 3 ops) or all but one op of a larger
    # one; anything less is just a different subgraph (every Relu is not a near-miss of conv_relu).
    if trace.enabled and trace.ops_matched >= min(rule.size, max(3, rule.size - 1)):
        return trace.reason
    return None


def _apply(g, plan: _Plan) -> str:
    added = []
    names: dict[str, str] = {}
    try:
        for token, const in plan.constants:
            names[token] = g.add_initializer(const.value, const.hint)
            added.append(names[token])
        for token in plan.temps:
            names[token] = g.unique_name(f"{plan.rule.name}_out")
        specs = []
        for spec in plan.specs:
            spec = dict(spec, inputs=[names.get(t, t) for t in spec["inputs"]],
                        outputs=[names.get(t, t) for t in spec["outputs"]])
            spec["name"] = g.unique_name(f"{spec['op_type']}_{plan.root.name}")
            specs.append(spec)
        old_inputs = [t for n in plan.removed for t in n.inputs if t]
        infos = []
        for new, old in plan.typed:  # read before the old producers (and their value_info) go
            proto = g.value_info_proto(old)
            if proto is not None:
                vi = onnx.ValueInfoProto()
                vi.CopyFrom(proto)
                vi.name = names.get(new, new)
                infos.append(vi)
        created = g.replace_subgraph(plan.removed, specs)
        g.merge_value_info(infos)
        type_standard_outputs(g, created)
    except InvalidGraph as exc:
        for name in added:
            g.remove_initializer(name)
        raise RuleError(f"rule {plan.rule.name!r} at node {plan.root.name!r}: {exc}") from exc
    # Initializers only the replaced nodes read are dead now (e.g. a bias folded into a new one).
    for t in dict.fromkeys(old_inputs):
        if g.is_initializer(t) and not g.is_graph_input(t) and not g.is_graph_output(t) and not g.has_users(t):
            g.remove_initializer(t)
    return created[-1].name


def _fixpoint(g, rules: list[Rule], report: RewriteReport, explain: bool, max_passes: int) -> None:
    # A disabled Trace records nothing (``fail`` and ``ops_matched`` ask ``enabled`` first), so one
    # serves every try when not explaining (18,000 tries on a 20k-node GPT-2).
    quiet = None if explain else Trace(False)
    for pass_no in range(1, max_passes + 1):
        fired: list[str] = []
        near: list[NearMiss] = []
        for rule in rules:
            if quiet is not None and not all(g.has_op(op, domain) for domain, op in rule.ops):
                continue  # no match without that op, so no rewrite of this rule can make one either
            domain, op = rule.anchor
            for root in g.nodes_by_op(op, domain):
                if root not in g:
                    continue  # removed by an earlier rewrite in this pass
                if quiet is not None and not could_match(g, rule.pattern, root):
                    continue  # no match can follow (with explain, the failed attempt is the near-miss)
                result = _try(g, rule, root, quiet or Trace(True))
                if isinstance(result, _Plan):
                    name = _apply(g, result)
                    report.counts[rule.name] = report.counts.get(rule.name, 0) + 1
                    report.matches.append(Match(rule.name, name, result.sources))
                    if rule.name not in fired:
                        fired.append(rule.name)
                elif result is not None and explain:
                    near.append(NearMiss(rule.name, root.name, result))
        report.passes = max(report.passes, pass_no)
        if not fired:
            report.near_misses += near
            return
    raise RuleError(
        f"rules did not converge after {max_passes} passes over graph {g.name!r}; still firing: "
        f"{', '.join(fired)} (rules that undo each other, A -> B -> A?); disable one with --disable NAME"
    )


def apply_rules(graph, ruleset: RuleSet, explain: bool = False, max_passes: int = DEFAULT_MAX_PASSES) -> RewriteReport:
    """Rewrite ``graph`` in place with ``ruleset`` until nothing changes; return the report.

    Subgraphs (If/Loop/Scan bodies) are rewritten too, after the graph that holds them.
    """
    registry._ensure_builtins()
    rules = list(ruleset)
    report = RewriteReport()
    done: set[int] = set()
    while True:
        pending = [sub for sub in graph.graphs() if id(sub) not in done]
        if not pending:
            break
        for sub in pending:
            if id(sub) in done:
                continue
            done.add(id(sub))
            _fixpoint(sub, [r for r in rules if r.priority >= 0], report, explain, max_passes)
            if any(r.priority < 0 for r in rules):
                # late rules (priority < 0) start once the others are at their fixpoint, whose
                # near-misses are the ones reported; then every rule again (a late rewrite may let a
                # composing rule fire), without a second set of near-misses
                _fixpoint(sub, rules, report, False, max_passes)
    report.counts = dict(sorted(report.counts.items()))
    return report


def find_matches(graph, ruleset: RuleSet, prepare=None) -> list[Match]:
    """The rewrites ``apply_rules`` would make, computed on a copy: ``graph`` is not touched.

    For ``graphopt inspect``. ``prepare`` (e.g. the cleanup passes, which fold Conv+BatchNorm so
    the Conv rules can see Conv -> Relu) runs on the copy first. Node names in the result are
    those the copy's new nodes got.
    """
    copy = graph.copy()
    if prepare is not None:
        prepare(copy)
    return apply_rules(copy, ruleset).matches
