"""Registries of the Python functions rule files may name: constraints and value builders.

Rule files never execute code; they name functions registered here. A **constraint** is a small
predicate ``fn(graph, *args) -> None | reason``. A **builder** computes a value the replacement
needs: ``fn(graph, *args)`` returns a tensor (a name, or ``NewConstant`` for an initializer the
engine adds once every check passed) or an attribute dict, and raises ``BuildFailed(reason)``
when it cannot. Both are pure: they never mutate the graph.

Arguments are declared with one letter each so the loader can check a rule before it ever runs:
``t`` a tensor capture (``x``, ``b?``; an ``as`` name means that node's output), ``n`` a node
capture (an ``as`` name), ``v`` a literal (number or string). A trailing ``*`` in the signature
makes the last kind repeatable; ``?`` after a letter makes that argument optional.

Users register more from their own module, and only when they opt in (``--rules-module``):
``load_rules_module("mypkg.my_rules")`` imports it; the module calls ``register_constraint`` /
``register_builder`` at import time.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import numpy as np

from graphopt.errors import RuleError


class BuildFailed(Exception):
    """Raised by a builder with a reason when the replacement cannot be built for this match."""


@dataclass(frozen=True)
class NewConstant:
    """An initializer a builder wants; the engine adds it (unique name from ``hint``) on success."""

    value: np.ndarray
    hint: str


@dataclass(frozen=True)
class Registered:
    name: str
    fn: Callable[..., Any]
    signature: str  # e.g. "tn", "t?tn", "tvv?"
    returns: str  # "check" for constraints; "tensor" or "attrs" for builders
    doc: str

    @cached_property
    def kinds(self) -> tuple[tuple[str, bool, bool], ...]:
        """``parse_signature(signature)``, parsed once: the loader and the engine ask for every
        argument of every constraint they check (8,000 times a GPT-2 20k run)."""
        return tuple(parse_signature(self.signature))

    def arity(self) -> tuple[int, int | None]:
        """(min, max) number of arguments; max None means unbounded."""
        kinds = self.kinds
        required = sum(1 for _, opt, _ in kinds if not opt)
        if kinds and kinds[-1][2]:
            return required, None
        return required, len(kinds)

    def kind_at(self, i: int) -> str:
        kinds = self.kinds
        if i < len(kinds):
            return kinds[i][0]
        return kinds[-1][0]


_SIG = re.compile(r"([tnv])(\?)?(\*)?")


def parse_signature(sig: str) -> list[tuple[str, bool, bool]]:
    """``"tn?v*"`` -> [(kind, optional, repeat), ...]."""
    out = []
    pos = 0
    while pos < len(sig):
        m = _SIG.match(sig, pos)
        if not m:
            raise ValueError(f"bad argument signature {sig!r}")
        out.append((m.group(1), bool(m.group(2)), bool(m.group(3))))
        pos = m.end()
    return out


CONSTRAINTS: dict[str, Registered] = {}
BUILDERS: dict[str, Registered] = {}


def register_constraint(name: str, signature: str, fn: Callable | None = None):
    """Register ``fn(graph, *args) -> str | None`` as constraint ``name``; usable as a decorator."""

    def deco(f):
        parse_signature(signature)
        CONSTRAINTS[name] = Registered(name, f, signature, "check", (f.__doc__ or "").strip().split("\n")[0])
        return f

    return deco(fn) if fn is not None else deco


def register_builder(name: str, signature: str, returns: str, fn: Callable | None = None):
    """Register a value builder; ``returns`` is ``"tensor"`` (an input) or ``"attrs"`` (a dict to merge)."""
    if returns not in ("tensor", "attrs"):
        raise ValueError("returns must be 'tensor' or 'attrs'")

    def deco(f):
        parse_signature(signature)
        BUILDERS[name] = Registered(name, f, signature, returns, (f.__doc__ or "").strip().split("\n")[0])
        return f

    return deco(fn) if fn is not None else deco


def load_rules_module(module: str) -> None:
    """Import a user module that registers constraints/builders (the ``--rules-module`` opt-in)."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # any import failure is the user's module; report it in one line
        raise RuleError(f"cannot import rules module {module!r}: {type(exc).__name__}: {exc}") from exc


def _ensure_builtins() -> None:
    # The built-in predicates live in their own modules; importing them registers them.
    from graphopt.rewrite import batchnorm, builders, casts, constraints, groupnorm, mlp, rope, transformer, window  # noqa: F401
