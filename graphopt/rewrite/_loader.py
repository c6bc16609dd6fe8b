"""Rule files: TOML loading, ``for`` expansion, schema validation, and line-accurate issues.

A rule file is TOML and is only ever parsed as data (``tomllib``/``tomli``); nothing in it runs.

    [params]                 # optional: named lists shared by the rules of this file
    acts = [ { name = "relu", wrap = "Relu({y}) as act", attrs = "act=activation_of(act)" } ]

    [[rule]]
    name = "conv_{act.name}"           # unique after expansion
    doc = "Conv -> {act.name} ==> graphopt.CBR"
    for.act = "acts"                   # a list, or the name of a [params] list
    let.y = "Conv(x, w, b?) as y"      # named fragments, substituted like parameters
    pattern = "{act.wrap}"
    where = ["no_auto_pad(y)"]         # constraint calls; an entry that is exactly "{p.field}"
                                       # with a list value splices that list in
    replace = "graphopt.CBR(x, w, b?, attrs=y, {act.attrs})"
    keep = []                          # node captures allowed to stay used outside the match
    outputs = []                       # node captures whose output the new node also produces
    priority = 3                       # default: the pattern's op count; < 0: a late rule, run
                                       # after the others reach their fixpoint

The replacement names the op to build. Positional arguments are its inputs: captures
(``b?`` passes an optional one through), builder calls (``add_bias(b?, c, conv)``) or nested op
calls, which build further new nodes (``Reshape(graphopt.GemmAct(a, b), shape)``). Keywords are
attributes (``activation='Relu'``), inputs by schema name, ``attrs=node`` (copy that node's
attributes) or an attribute builder (``act=activation_of(act)``, merged; the key is a label).
Later keywords override earlier ones. ``shape_like=capture`` is a typing hint, not an attribute:
the new node's output gets that tensor's value_info (the root's outputs keep theirs anyway).

``{key}`` / ``{key.field}`` placeholders are substituted in every string (repeatedly, so a
parameter may use a ``let`` fragment). Several ``for`` keys expand to their cartesian product,
in key order. ``tomllib`` gives no positions, so lines are found by scanning the text: the
``[[rule]]`` header of the n-th rule, and the line of a key inside it.
"""

from __future__ import annotations

import itertools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from graphopt.errors import GraphoptError, RuleError, did_you_mean
from graphopt.files import quote, read_regular
from graphopt.ops.schema import _check_type as _attr_type_reason
from graphopt.rewrite import registry
from graphopt.rewrite._rules import Rule, RuleSet
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

RULE_KEYS = ("name", "doc", "pattern", "where", "replace", "keep", "outputs", "for", "let", "priority")
TOP_KEYS = ("rule", "params")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?\}")
_MAX_SUBST_ROUNDS = 8
_MAX_EXPANDED = 20_000  # characters one field may reach through placeholders (the longest shipped is ~300)
MAX_RULE_FILE_BYTES = 4 * 2**20  # a rule file larger than this is refused unread
_MAX_VARIANTS = 1000  # rules one [[rule]] may expand to through 'for' (a product of lists grows fast)


@dataclass(frozen=True)
class RuleIssue:
    """One problem in a rule file: where (file, 1-based line, rule name) and what."""

    file: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where}: rule {quote(self.rule)}: {self.message}" if self.rule else f"{where}: {self.message}"


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
# Line lookup


class _Lines:
    """Where each ``[[rule]]`` header and key sits in the file text."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.headers = [i + 1 for i, ln in enumerate(self.lines) if re.match(r"\s*\[\[\s*rule\s*\]\]", ln)]
        # Any table header ends a rule's block ([params], [[params.acts]], the next [[rule]]).
        self.tables = [i + 1 for i, ln in enumerate(self.lines) if re.match(r"\s*\[\[?\s*[A-Za-z_][\w.]*\s*\]\]?\s*(#.*)?$", ln)]

    def rule_line(self, index: int) -> int:
        return self.headers[index] if index < len(self.headers) else 1

    def key_line(self, index: int, key: str) -> int:
        start = self.rule_line(index)
        end = next((t for t in self.tables if t > start), len(self.lines) + 1)
        pat = re.compile(rf"\s*{re.escape(key)}\s*[=.]")
        for ln in range(start + 1, end):
            if pat.match(self.lines[ln - 1]):
                return ln
        return start

    def top_key_line(self, key: str) -> int:
        pat = re.compile(rf"\s*(\[\s*{re.escape(key)}\b|{re.escape(key)}\s*[=.])")
        for i, ln in enumerate(self.lines):
            if pat.match(ln):
                return i + 1
        return 1


# ----------------------------------------------------------------------------------------------
# Expansion


class _Issue(Exception):
    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key
        self.message = message


def _substitute(text: str, env: dict, key: str) -> str:
    for _ in range(_MAX_SUBST_ROUNDS):
        if "{" not in text:
            return text

        grown = [len(text)]

        def repl(m):
            value = _lookup(env, m.group(1), m.group(2), key, as_text=True)
            grown[0] += len(value) - len(m.group(0))
            if grown[0] > _MAX_EXPANDED:  # checked as it grows: one round can never get large
                raise _Issue(key, f"placeholders expand to more than {_MAX_EXPANDED} characters (a 'let' fragment "
                                  f"used many times inside another?) in {quote(text)}")
            return value

        new = _PLACEHOLDER.sub(repl, text)
        if len(new) > _MAX_EXPANDED:
            raise _Issue(key, f"placeholders expand to more than {_MAX_EXPANDED} characters (a 'let' fragment used "
                              f"many times inside another?) in {quote(text)}")
        if new == text:
            break
        text = new
    if _PLACEHOLDER.search(text):
        raise _Issue(key, f"placeholders nest more than {_MAX_SUBST_ROUNDS} levels deep in {quote(text)}")
    return text


def _lookup(env: dict, name: str, field: str | None, key: str, as_text: bool):
    if name not in env:
        known = ", ".join(sorted(env)) or "none"
        raise _Issue(key, f"unknown placeholder {{{name}}} (known: {known})")
    value = env[name]
    if field is not None:
        if not isinstance(value, dict):
            raise _Issue(key, f"placeholder {{{name}.{field}}}: {name} is not a table")
        if field not in value:
            raise _Issue(key, f"placeholder {{{name}.{field}}}: no field {field!r} in {quote(value)}")
        value = value[field]
    elif isinstance(value, dict):
        raise _Issue(key, f"placeholder {{{name}}} is a table; name one of its fields, e.g. {{{name}.{next(iter(value), 'x')}}}")
    if as_text:
        if isinstance(value, list):
            raise _Issue(key, f"placeholder {{{name}{'.' + field if field else ''}}} is a list; use it as a whole where/keep entry")
        return str(value)
    return value


def _substitute_list(items: list, env: dict, key: str) -> list[str]:
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise _Issue(key, f"{key} entries must be strings, got {quote(item)}")
        m = _PLACEHOLDER.fullmatch(item.strip())
        if m:
            value = _lookup(env, m.group(1), m.group(2), key, as_text=False)
            if isinstance(value, list):
                out += [_substitute(str(v), env, key) for v in value]
                continue
        text = _substitute(item, env, key)
        if text.strip():
            out.append(text)
    return out


def _variants(raw: dict, params: dict) -> list[dict]:
    """The parameter environments of a rule: one per combination of its ``for`` values."""
    spec = raw.get("for", {})
    if not isinstance(spec, dict):
        raise _Issue("for", "'for' must be a table, e.g. for.act = [\"Relu\", \"Sigmoid\"]")
    keys = sorted(spec)
    lists = []
    for k in keys:
        values = spec[k]
        if isinstance(values, str):
            if values not in params:
                known = ", ".join(sorted(params)) or "none"
                raise _Issue("for", f"for.{k} = {values!r} names no [params] list (known: {known})")
            values = params[values]
        if not isinstance(values, list) or not values:
            raise _Issue("for", f"for.{k} must be a non-empty list or the name of a [params] list")
        lists.append(values)
    let = raw.get("let", {})
    if not isinstance(let, dict) or not all(isinstance(v, str) for v in let.values()):
        raise _Issue("let", "'let' must be a table of strings, e.g. let.y = \"Conv(x, w) as y\"")
    clash = sorted(set(let) & set(keys))
    if clash:
        raise _Issue("let", f"{clash[0]!r} is both a for-parameter and a let-fragment")
    total = 1
    for values in lists:
        total *= len(values)
    if total > _MAX_VARIANTS:
        raise _Issue("for", f"'for' expands to {total} rules (at most {_MAX_VARIANTS}); split the rule or shorten its lists")
    return [dict(let, **dict(zip(keys, combo))) for combo in itertools.product(*lists)]


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

    keep_raw = raw.get("keep", [])
    if not isinstance(keep_raw, list):
        raise _Issue("keep", "'keep' must be a list of node captures")
    keep = _substitute_list(keep_raw, env, "keep")
    for k in keep:
        if k not in nodes:
            raise _Issue("keep", f"keep entry {k!r} is not a node capture ('... as {k}') of the pattern")
        if k == pattern.bind:
            raise _Issue("keep", f"keep entry {k!r} is the pattern's root, which the replacement always replaces")

    outputs_raw = raw.get("outputs", [])
    if not isinstance(outputs_raw, list):
        raise _Issue("outputs", "'outputs' must be a list of node captures")
    extra = _substitute_list(outputs_raw, env, "outputs")
    for k in extra:
        if k not in nodes:
            raise _Issue("outputs", f"outputs entry {k!r} is not a node capture ('... as {k}') of the pattern")
        if k == pattern.bind:
            raise _Issue("outputs", f"outputs entry {k!r} is the pattern's root, whose outputs the new node always takes")
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


def _parse_file(path: Path) -> tuple[list[Rule], list[RuleIssue]]:
    registry._ensure_builtins()
    file = str(path)
    try:
        # regular files only: a FIFO or device in a --rules folder must not block or read forever
        text = read_regular(path, limit=MAX_RULE_FILE_BYTES, what="rule file").decode("utf-8")
    except GraphoptError as e:
        return [], [RuleIssue(file, 1, "", f"cannot read the rule file: {e}")]
    except UnicodeDecodeError as e:
        return [], [RuleIssue(file, 1, "", f"cannot read the rule file: {e}")]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        return [], [RuleIssue(file, int(m.group(1)) if m else 1, "", f"TOML syntax error: {e}")]
    except RecursionError:  # tomllib recurses once per nested array or inline table
        return [], [RuleIssue(file, 1, "", "TOML syntax error: arrays or tables nested too deep")]
    lines = _Lines(text)
    issues: list[RuleIssue] = []
    for key in data:
        if key not in TOP_KEYS:
            issues.append(RuleIssue(file, lines.top_key_line(key), "",
                                    f"unknown top-level key {key!r} (allowed: [[rule]] tables and [params])"))
    params = data.get("params", {})
    if not isinstance(params, dict):
        issues.append(RuleIssue(file, lines.top_key_line("params"), "", "[params] must be a table of lists"))
        params = {}
    raw_rules = data.get("rule", [])
    if not isinstance(raw_rules, list):
        return [], issues + [RuleIssue(file, 1, "", "'rule' must be an array of tables: write [[rule]]")]
    rules: list[Rule] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_rules):
        line = lines.rule_line(index)
        label = str(raw.get("name", f"#{index + 1}")) if isinstance(raw, dict) else f"#{index + 1}"
        if not isinstance(raw, dict):
            issues.append(RuleIssue(file, line, label, "a rule must be a table"))
            continue
        bad = [k for k in raw if k not in RULE_KEYS]
        for k in bad:
            issues.append(RuleIssue(file, lines.key_line(index, k), label,
                                    f"unknown key {k!r} (allowed: {', '.join(RULE_KEYS)})"))
        if bad:
            continue
        try:
            envs = _variants(raw, params)
        except _Issue as e:
            issues.append(RuleIssue(file, lines.key_line(index, e.key) if e.key else line, label, e.message))
            continue
        names_here: list[str] = []
        for env in envs:
            try:
                rule = _validate(raw, env, file, line, index)
            except _Issue as e:
                variant = label
                try:
                    variant = _substitute(str(raw.get("name", label)), env, "name")
                except _Issue:
                    pass
                issues.append(RuleIssue(file, lines.key_line(index, e.key) if e.key else line, variant, e.message))
                continue
            if rule.name in seen:
                issues.append(RuleIssue(file, line, rule.name,
                                        f"duplicate rule name (first defined at line {seen[rule.name]})"
                                        + ("; put a for-parameter in the name" if len(envs) > 1 else "")))
                continue
            seen[rule.name] = line
            names_here.append(rule.name)
            rules.append(rule)
    return rules, issues


def check_rule_file(path) -> list[RuleIssue]:
    """Validate one rule file; an empty list means it is good. Never raises for file content."""
    return _parse_file(Path(path))[1]


def shipped_rules_dir() -> Path:
    """The folder of the rule files that ship with graphopt: ``graphopt/_rules`` in an installed
    wheel, the top-level ``rules/`` in a checkout."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "_rules", package.parent / "rules"):
        if candidate.is_dir() and any(candidate.glob("*.toml")):
            return candidate
    raise RuleError(f"graphopt's shipped rules are missing (looked in {package / '_rules'} and "
                    f"{package.parent / 'rules'}); reinstall graphopt")


def _rule_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(path.glob("*.toml"))
    if path.exists():
        return [path]  # not a regular file: _parse_file says so
    raise RuleError(f"rule path {str(path)!r} does not exist; pass a .toml file or a folder of them")


def load_file(path) -> list[Rule]:
    """The rules of one file; RuleError with the first issue (and how many more) when it has problems."""
    rules, issues = _parse_file(Path(path))
    if issues:
        more = f" ({len(issues) - 1} more; run 'graphopt rules check {path}')" if len(issues) > 1 else ""
        raise RuleError(f"{issues[0]}{more}")
    return rules


def load_rules(shipped: bool = True, paths=(), disable=()) -> RuleSet:
    """Load the shipped rules (``shipped=True``) plus rule files or folders in ``paths``.

    ``disable`` names rules to leave out (globs such as ``conv_*`` allowed); an unknown name raises
    RuleError listing the valid ones. Rule names must be unique across all files.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if isinstance(disable, str):
        disable = [disable]
    files: list[Path] = []
    if shipped:
        files += _rule_files(shipped_rules_dir())
    for p in paths:
        files += _rule_files(Path(p))
    rules: list[Rule] = []
    for f in files:
        rules += load_file(f)
    ruleset = RuleSet(rules)
    return ruleset.without(list(disable)) if disable else ruleset
