"""graphopt's rule engine: declarative fusion rules applied to a ``Graph`` until a fixpoint.

The public API (everything else in this package is private)::

    from graphopt.rewrite import load_rules, apply_rules
    rules = load_rules(shipped=True, paths=["my_rules/"], disable=["conv_sigmoid"])
    report = apply_rules(graph, rules, explain=True)
    report.counts        # {"conv_relu": 3, ...}
    report.matches       # [Match(rule, node, sources), ...]
    report.near_misses   # [NearMiss(rule, anchor, reason), ...]

* ``load_rules(shipped=True, paths=(), disable=()) -> RuleSet``
* ``check_rule_file(path) -> list[RuleIssue]`` (``graphopt rules check``)
* ``apply_rules(graph, ruleset, explain=False, max_passes=100) -> RewriteReport``
* ``find_matches(graph, ruleset, explain=False) -> RewriteReport`` (dry run on a copy)
* ``register_constraint`` / ``register_builder`` / ``load_rules_module`` (the ``--rules-module`` opt-in)

Rule files are described in ``_loader.py``, the pattern language in ``_syntax.py``.
"""

from graphopt.rewrite import builders as _builders  # noqa: F401  (registers the built-ins)
from graphopt.rewrite import batchnorm as _batchnorm  # noqa: F401
from graphopt.rewrite import casts as _casts  # noqa: F401
from graphopt.rewrite import causal as _causal  # noqa: F401
from graphopt.rewrite import constraints as _constraints  # noqa: F401
from graphopt.rewrite import groupnorm as _groupnorm  # noqa: F401
from graphopt.rewrite import mlp as _mlp  # noqa: F401
from graphopt.rewrite import packed_qkv as _packed_qkv  # noqa: F401
from graphopt.rewrite import rope as _rope  # noqa: F401
from graphopt.rewrite import transformer as _transformer  # noqa: F401
from graphopt.rewrite import window as _window  # noqa: F401
from graphopt.rewrite._engine import Match, NearMiss, RewriteReport, apply_rules, find_matches
from graphopt.rewrite._loader import RuleIssue, check_rule_file, load_rules, shipped_rules_dir
from graphopt.rewrite._rules import Rule, RuleSet
from graphopt.rewrite._syntax import RuleSyntaxError, parse_pattern, parse_replacement
from graphopt.rewrite.registry import (
    BUILDERS,
    CONSTRAINTS,
    BuildFailed,
    NewConstant,
    load_rules_module,
    register_builder,
    register_constraint,
)

__all__ = [
    "BUILDERS", "CONSTRAINTS", "BuildFailed", "Match", "NearMiss", "NewConstant", "RewriteReport", "Rule",
    "RuleIssue", "RuleSet", "RuleSyntaxError", "apply_rules", "check_rule_file", "find_matches",
    "load_rules", "load_rules_module", "parse_pattern", "parse_replacement", "register_builder",
    "register_constraint", "shipped_rules_dir",
]
