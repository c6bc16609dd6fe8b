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

This module reads the files and places the issues; ``_expand`` does the ``for`` expansion and the
substitution, ``_validate`` the checks of one expanded rule.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from graphopt.errors import GraphoptError, RuleError
from graphopt.files import quote, read_regular
from graphopt.rewrite import registry
from graphopt.rewrite._expand import _Issue, _substitute, _variants
from graphopt.rewrite._rules import Rule, RuleSet
from graphopt.rewrite._validate import _validate

RULE_KEYS = ("name", "doc", "pattern", "where", "replace", "keep", "outputs", "for", "let", "priority")
TOP_KEYS = ("rule", "params")
MAX_RULE_FILE_BYTES = 4 * 2**20  # a rule file larger than this is refused unread


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
