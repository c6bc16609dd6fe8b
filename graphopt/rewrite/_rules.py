"""``Rule`` (one expanded, validated rule) and ``RuleSet`` (the ordered collection the engine runs)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from functools import cached_property

from graphopt.errors import RuleError, UsageError, did_you_mean
from graphopt.rewrite._syntax import ConstraintCall, OpPat, Replacement, pattern_ops


@dataclass(frozen=True)
class Rule:
    """A fusion rule: match ``pattern``, check ``where``, build ``replace``.

    ``keep`` names node captures that may stay in use outside the match (they are not removed).
    ``outputs`` names node captures whose output the new node also produces, after the root's
    outputs and in this order (SkipLayerNorm's sum ``S``): they are removed even when other nodes
    read them or they are graph outputs, because the new node takes over their tensor names.
    ``priority`` orders rules (higher first, then by name); it defaults to the pattern's op count
    so larger patterns claim nodes before the smaller patterns they contain. A negative priority
    makes a late rule: it runs only once the other rules have reached their fixpoint (``--explain``
    reports the near-misses of that point), e.g. ``conv_alone`` turning what no fusion took into a CBR.
    """

    name: str
    doc: str
    pattern: OpPat
    pattern_text: str
    where: tuple[ConstraintCall, ...]
    replace: Replacement
    keep: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    priority: int = 0
    file: str = ""
    line: int = 0
    family: str = ""  # the rule's name template before ``for`` expansion

    @property
    def size(self) -> int:
        """Number of ops in the pattern."""
        return len(pattern_ops(self.pattern))

    @property
    def source(self) -> str:
        """The rule file it came from (alias of ``file``)."""
        return self.file

    @cached_property
    def ops(self) -> frozenset[tuple[str, str]]:
        """(domain, op) of every op of the pattern."""
        return frozenset((p.domain, p.op) for p in pattern_ops(self.pattern))

    @property
    def anchor(self) -> tuple[str, str]:
        """(domain, op_type) of the pattern's root: the index the matcher looks candidates up in."""
        return self.pattern.domain, self.pattern.op

    def sort_key(self) -> tuple:
        return (-self.priority, self.name)


@dataclass
class RuleSet:
    """Rules by name; iteration gives the engine's deterministic order (priority, then name)."""

    rules: list[Rule] = field(default_factory=list)

    def __post_init__(self):
        self.rules = sorted(self.rules, key=Rule.sort_key)
        seen: dict[str, Rule] = {}
        for r in self.rules:
            if r.name in seen:
                other = seen[r.name]
                raise RuleError(
                    f"rule name {r.name!r} is defined twice ({other.file}:{other.line} and {r.file}:{r.line}); "
                    "rename one of them"
                )
            seen[r.name] = r
        self._by_name = seen

    def __iter__(self):
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        """Rule names, sorted alphabetically."""
        return sorted(self._by_name)

    def get(self, name: str) -> Rule:
        try:
            return self._by_name[name]
        except KeyError:
            raise RuleError(f"unknown rule {name!r}; known rules: {', '.join(self.names())}") from None

    def merged(self, other: "RuleSet") -> "RuleSet":
        return RuleSet(self.rules + other.rules)

    def without(self, names) -> "RuleSet":
        """A copy without the named rules; a name may be a glob (``conv_*``). Unknown names raise."""
        drop: set[str] = set()
        for pat in names:
            hits = [n for n in self.names() if fnmatch.fnmatchcase(n, pat)] if any(c in pat for c in "*?[") else (
                [pat] if pat in self._by_name else [])
            if not hits:
                hint = did_you_mean(pat, self.names(), n=5)
                raise UsageError(f"--disable {pat}: no rule of that name{hint or ''} (graphopt rules list shows them all)")
            drop.update(hits)
        return RuleSet([r for r in self.rules if r.name not in drop])
