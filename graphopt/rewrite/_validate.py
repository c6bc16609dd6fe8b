"""Rule files: the checks of one expanded rule against the ops, builders and constraints it names.

``_validate`` turns one expanded ``[[rule]]`` (its parameters substituted, ``_expand``) into a
``Rule``: the pattern, constraints and replacement parse, every op exists (ONNX through
``onnx.defs``, graphopt's through ``graphopt.ops``; other domains are accepted unchecked), calls
have the right arity and argument kinds, literal attributes have their schema's types, and names
refer to captures. Problems raise ``_Issue``; the loader (``_loader``) adds the file and line.
"""

from __future__ import annotations

import re

from graphopt.errors import RuleError, did_you_mean
from graphopt.files import quote
from graphopt.ops.schema import _check_type as _attr_type_reason
from graphopt.rewrite import registry
from graphopt.rewrite._expand import _Issue, _substitute, _substitute_list
from graphopt.rewrite._rules import Rule
from graphopt.rewrite._syntax import (
    Call,
    Lit,
    Name,
    RuleSyntaxError,
    excerpt,
    is_builder,
    parse_constraint,
    parse_pattern,
    parse_replacement,
    pattern_captures,
    pattern_ops,
)


# ----------------------------------------------------------------------------------------------
# Op lookup (the default ONNX domain through onnx.defs, graphopt ops through graphopt.ops)


def op_schema(domain: str, op: str):
    """The graphopt OpSchema for graphopt ops, True for a known ONNX op, None when unknown."""
    if domain == "graphopt":
        from graphopt import ops

        try:
            return ops.get_schema(op)
        except RuleError:
            return None
    import onnx.defs

    if domain == "":
        return True if onnx.defs.has(op) else None
    return True if onnx.defs.has(op, domain) else None


def _known_op(domain: str, op: str) -> bool:
    if domain not in ("", "graphopt"):
        # Custom domains (com.microsoft, ...) have no schema here: accepted unchecked.
        return True
    return op_schema(domain, op) is not None


# ----------------------------------------------------------------------------------------------
# Validation of one expanded rule


def _check_kinds(reg: registry.Registered, call_text: str, args, tensors: dict, nodes: set, key: str, what: str):
    lo, hi = reg.arity()
    if len(args) < lo or (hi is not None and len(args) > hi):
        want = f"{lo}" if lo == hi else (f"{lo} to {hi}" if hi is not None else f"at least {lo}")
        raise _Issue(key, f"{what} {reg.name}() takes {want} arguments, got {len(args)} in {quote(call_text)}")
    for i, a in enumerate(args):
        kind = reg.kind_at(i)
        if isinstance(a, Lit):
            if kind != "v":
                raise _Issue(key, f"argument {i + 1} of {reg.name}() must be a capture, not the literal {a.value!r}")
            continue
        if isinstance(a, Call):
            raise _Issue(key, f"argument {i + 1} of {reg.name}() cannot be a call")
        if kind == "v":
            raise _Issue(key, f"argument {i + 1} of {reg.name}() must be a literal, not the capture {a.name!r}")
        if a.name not in tensors:
            raise _Issue(key, f"{what} {quote(call_text)} uses {a.name!r}, which the pattern does not bind")
        if kind == "n" and a.name not in nodes:
            raise _Issue(key, f"argument {i + 1} of {reg.name}() must be a node capture ('... as {a.name}'), "
                              f"but {a.name!r} is a tensor variable")


def _check_value_expr(expr, tensors, nodes, key, text):
    """A builder call or capture inside a replacement; returns 'tensor' | 'attrs' | 'node' | 'literal'."""
    if isinstance(expr, Lit):
        return "literal"
    if isinstance(expr, Name):
        if expr.name not in tensors:
            raise _Issue(key, f"replacement uses {expr.name!r}, which the pattern does not bind")
        if tensors[expr.name] and not expr.optional:
            raise _Issue(key, f"{expr.name!r} is optional in the pattern; write '{expr.name}?' in the replacement")
        return "node" if expr.name in nodes else "tensor"
    if not is_builder(expr):  # a nested op: another new node, whose output is a tensor
        _check_op_call(expr.domain, expr.op, expr.qualname, expr.args, expr.kwargs, tensors, nodes, key, text)
        return "tensor"
    if expr.kwargs:
        raise _Issue(key, f"builder calls take positional arguments only ({expr.op}())")
    reg = registry.BUILDERS.get(expr.op)
    if reg is None:
        known = ", ".join(sorted(registry.BUILDERS))
        raise _Issue(key, f"unknown builder {expr.op}() (known: {known})")
    for a in expr.args:
        if isinstance(a, Name) and a.name in tensors and tensors[a.name] and not a.optional:
            raise _Issue(key, f"{a.name!r} is optional in the pattern; write '{a.name}?' in {expr.op}()")
    _check_kinds(reg, text, expr.args, tensors, nodes, key, "builder")
    return reg.returns


def _check_op_call(domain, op, qualname, args, kwargs, tensors, nodes, key, text):
    """An op the replacement builds: it exists, and its inputs and attributes fit its schema."""
    schema = op_schema(domain, op) if domain in ("", "graphopt") else True
    if schema is None:
        raise _Issue(key, f"unknown replacement op {qualname!r}")
    input_names = [n for n, _ in schema.inputs] if schema is not True else None
    for a in args:
        kind = _check_value_expr(a, tensors, nodes, key, text)
        if kind not in ("tensor", "node"):
            raise _Issue(key, f"positional arguments of {qualname} are inputs, not {kind}s")
    if input_names is not None and len(args) > len(input_names):
        raise _Issue(key, f"{qualname} takes {len(input_names)} inputs, the replacement gives {len(args)}")
    for k, v in kwargs:
        if k == "shape_like":
            if not isinstance(v, Name) or v.name not in tensors:
                raise _Issue(key, f"shape_like= in {qualname} takes a capture whose type and shape the new output has")
            continue
        kind = _check_value_expr(v, tensors, nodes, key, text)
        if k == "attrs":
            if kind not in ("node", "attrs"):
                raise _Issue(key, "attrs= takes a node capture (copy its attributes) or an attribute builder")
        elif kind == "attrs":
            pass  # merged into the attributes; the keyword is a label
        elif input_names is not None and k in input_names:
            if kind not in ("tensor", "node"):
                raise _Issue(key, f"input {k}= needs a tensor")
        elif kind in ("tensor", "node"):
            raise _Issue(key, f"{k}= is not an input of {qualname}; inputs: {', '.join(input_names or [])}")
        elif schema is not True and k not in schema.attributes:
            raise _Issue(key, f"unknown attribute {k!r} for {qualname}{did_you_mean(k, schema.attributes) or ';'} "
                              f"known: {', '.join(sorted(schema.attributes))}")
    given = {k for k, _ in kwargs}
    present = [i < len(args) or n in given for i, n in enumerate(input_names or [])]
    _check_literal_attrs(schema, qualname, domain, op, {k: v.value for k, v in kwargs if isinstance(v, Lit)}, key,
                         present)


_ONNX_ATTR_TYPES = {1: ((int, float), "a float"), 2: (int, "an int"), 3: (str, "a string")}  # AttributeProto types


def _check_literal_attrs(schema, qualname: str, domain: str, op: str, literals: dict, key: str,
                         present: list[bool]) -> None:
    """The literal attribute values a replacement writes (``activation='Relu'``, ``alpha=0.1``): the
    op has the attribute, the value has its type, and the op's own check accepts it. Values copied
    from the match (``attrs=conv``) are only known at match time and are checked then."""
    if not literals:
        return
    if schema is True:  # a standard ONNX op: names and types from onnx.defs
        import onnx.defs

        attrs = onnx.defs.get_schema(op, domain=domain).attributes
        for k, v in literals.items():
            if k not in attrs:
                raise _Issue(key, f"unknown attribute {k!r} for {qualname}{did_you_mean(k, attrs) or ';'} "
                                  f"known: {', '.join(sorted(attrs)) or 'none'}")
            want = _ONNX_ATTR_TYPES.get(int(attrs[k].type))
            if want is not None and (not isinstance(v, want[0]) or isinstance(v, bool)):
                raise _Issue(key, f"attribute {k}={v!r} of {qualname} must be {want[1]}")
        return
    for k, v in literals.items():
        reason = _attr_type_reason(k, v, schema.attributes[k][0])
        if reason:
            raise _Issue(key, f"{qualname}: {reason}")
    reason = schema._check(schema.normalize(literals), present)
    if reason and any(k in reason for k in literals):  # other attributes come from the match
        if "activation" in literals and "unknown activation" in reason:
            from graphopt.ops.activations import ACTIVATIONS

            hint = did_you_mean(str(literals["activation"]), ACTIVATIONS)
            if hint:
                reason = f"unknown activation {literals['activation']!r}{hint}"
        raise _Issue(key, f"{qualname}: {reason}")


def _validate(raw: dict, env: dict, file: str, line: int, index: int) -> Rule:
    def text_field(key, required=True):
        if key not in raw:
            if required:
                raise _Issue(key if key != "name" else "", f"missing required key {key!r}")
            return ""
        value = raw[key]
        if not isinstance(value, str):
            raise _Issue(key, f"{key!r} must be a string")
        return _substitute(value, env, key)

    name = text_field("name")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", name):
        raise _Issue("name", f"rule name {name!r} must be a word (letters, digits, _ . -)")
    doc = text_field("doc")
    pattern_text = text_field("pattern")
    try:
        pattern = parse_pattern(pattern_text)
    except RuleSyntaxError as e:
        raise _Issue("pattern", f"pattern {excerpt(e.text, e.column)}: column {e.column}: {e.detail}") from None
    binds = [p.bind for p in pattern_ops(pattern) if p.bind]
    dup = sorted({b for b in binds if binds.count(b) > 1})
    if dup:
        raise _Issue("pattern", f"capture {dup[0]!r} is bound with 'as' more than once")
    for p in pattern_ops(pattern):
        if not _known_op(p.domain, p.op):
            raise _Issue("pattern", f"unknown op {p.qualname!r} in the pattern")
    tensors, nodes = pattern_captures(pattern)

    where_raw = raw.get("where", [])
    if not isinstance(where_raw, list):
        raise _Issue("where", "'where' must be a list of constraint calls")
    where = []
    for text in _substitute_list(where_raw, env, "where"):
        try:
            call = parse_constraint(text)
        except RuleSyntaxError as e:
            raise _Issue("where", f"constraint {excerpt(e.text, e.column)}: column {e.column}: {e.detail}") from None
        reg = registry.CONSTRAINTS.get(call.name)
        if reg is None:
            known = ", ".join(sorted(registry.CONSTRAINTS))
            raise _Issue("where", f"unknown constraint {call.name}() (known: {known})")
        _check_kinds(reg, call.text, call.args, tensors, nodes, "where", "constraint")
        where.append(call)

    replace_text = text_field("replace")
    try:
        replace = parse_replacement(replace_text)
    except RuleSyntaxError as e:
        raise _Issue("replace", f"replacement {excerpt(e.text, e.column)}: column {e.column}: {e.detail}") from None
    _check_op_call(replace.domain, replace.op, replace.qualname, replace.args, replace.kwargs, tensors, nodes,
                   "replace", replace.text)

    keep = _node_captures(raw, env, "keep", nodes, pattern.bind, "which the replacement always replaces")
    extra = _node_captures(raw, env, "outputs", nodes, pattern.bind, "whose outputs the new node always takes")
    for k in extra:
        if k in keep:
            raise _Issue("outputs", f"{k!r} is both kept and an extra output; a kept node keeps producing its tensor")
    if len(set(extra)) != len(extra):
        raise _Issue("outputs", "an outputs entry is listed twice")

    priority = raw.get("priority", len(pattern_ops(pattern)))
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise _Issue("priority", "'priority' must be an integer")
    return Rule(
        name=name, doc=doc, pattern=pattern, pattern_text=pattern_text, where=tuple(where), replace=replace,
        keep=tuple(keep), outputs=tuple(extra), priority=priority, file=file, line=line, family=str(raw.get("name", name)),
    )


# ----------------------------------------------------------------------------------------------
# Files


def _node_captures(raw: dict, env: dict, key: str, nodes: set, root: str, why_not_root: str) -> list[str]:
    """A rule's ``keep`` or ``outputs`` list: node captures of the pattern other than its root."""
    items = raw.get(key, [])
    if not isinstance(items, list):
        raise _Issue(key, f"'{key}' must be a list of node captures")
    names = _substitute_list(items, env, key)
    for k in names:
        if k not in nodes:
            raise _Issue(key, f"{key} entry {k!r} is not a node capture ('... as {k}') of the pattern")
        if k == root:
            raise _Issue(key, f"{key} entry {k!r} is the pattern's root, {why_not_root}")
    return names
