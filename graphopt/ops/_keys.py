"""Overload keys: the canonical, parseable name of one function-body variant.

A key is ``_``-joined tokens in a fixed order: the op's leading tokens (GemmAct's mode), the
activation token (``relu``, ``clip`` ...), ``lo`` / ``hi`` for given clip bounds, the op's flags
for present optional inputs (``b``, ``r``, ``c``), and a dtype token (``f16``, ``f64``, ``bf16``)
only when the body's constants must be typed. ``OpSchema.function`` rebuilds the body from the key
alone, so keys are parsed back strictly and a key that is not canonical is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.errors import RuleError
from graphopt.ops._body import DTYPE_TOKENS, TOKEN_DTYPES
from graphopt.ops.activations import BY_KEY, Activation


@dataclass(frozen=True)
class KeyParts:
    """A parsed overload key."""

    lead: tuple[str, ...]
    act: Activation
    clip_min: bool
    clip_max: bool
    flags: frozenset[str]
    dtype: int | None


def format_key(lead: list[str], act_tokens: list[str], flags: list[str], dtype_tok: str | None) -> str:
    """Join the tokens; ``flags`` must already be in the op's canonical order."""
    return "_".join(lead + act_tokens + flags + ([dtype_tok] if dtype_tok else []))


def parse_key(op: str, key: str, n_lead: int, flag_order: tuple[str, ...]) -> KeyParts:
    """Parse ``key`` for op ``op``; raises RuleError naming the op and key when it is malformed."""
    tokens = key.split("_") if isinstance(key, str) else []
    act = BY_KEY.get(tokens[n_lead]) if len(tokens) > n_lead else None
    if act is None:
        raise RuleError(f"graphopt.{op}: malformed overload key {key!r}: expected "
                        f"{'<mode>_' * n_lead}<activation>[_flags], activations: {', '.join(BY_KEY)}")
    order = (["lo", "hi"] if act.name == "Clip" else []) + list(flag_order) + sorted(DTYPE_TOKENS.values())
    rest = tokens[n_lead + 1:]
    positions = [order.index(t) if t in order else -1 for t in rest]
    dtype_toks = [t for t in rest if t in TOKEN_DTYPES]
    if -1 in positions or positions != sorted(set(positions)) or len(dtype_toks) > 1:
        raise RuleError(f"graphopt.{op}: malformed overload key {key!r}: after the activation only these "
                        f"tokens may follow, in this order, each once: {', '.join(order)} (one dtype at most)")
    return KeyParts(tuple(tokens[:n_lead]), act, "lo" in rest, "hi" in rest,
                    frozenset(t for t in rest if t in flag_order),
                    TOKEN_DTYPES[dtype_toks[0]] if dtype_toks else None)
