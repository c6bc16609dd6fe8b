"""Rule files' ``for`` expansion and ``{placeholder}`` substitution (see ``_loader`` for the syntax).

A ``[[rule]]`` expands to one parameter environment per combination of its ``for`` lists (their
cartesian product, in key order), with its ``let`` fragments alongside; every string field then has
its ``{key}`` / ``{key.field}`` placeholders substituted, repeatedly (a parameter may use a ``let``
fragment), within bounds on depth, growth and the number of variants. Problems raise ``_Issue``
(the key at fault and the message); the loader turns it into a line-accurate ``RuleIssue``.
"""

from __future__ import annotations

import itertools
import re

from graphopt.files import quote

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?\}")
_MAX_SUBST_ROUNDS = 8
_MAX_EXPANDED = 20_000  # characters one field may reach through placeholders (the longest shipped is ~300)
_MAX_VARIANTS = 1000  # rules one [[rule]] may expand to through 'for' (a product of lists grows fast)


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
