"""Constraint and builder for a constant causal mask (``rules/attention.toml``, ``attention_causal_mask``).

Exports of decoder models with static shapes fold the causal mask into a constant (transformers' LLaMA, Qwen2
and Mistral: an additive ``[B, 1, S, S]`` of 0 and the dtype's minimum; GPT-2's eager attention: a bool slice
of its lower-triangular buffer). graphopt.Attention then reads it like any mask, a ``[B, S, S]`` read per
head and layer. ``causal=1`` says the same without a tensor, and lets cuDNN's SDPA skip the masked half.

* ``causal_mask(m, att)``: the constant mask m of Attention att masks exactly key j > query i (the op's
  top-left ``causal``) for every batch entry, and masks a score exactly as ``causal`` does;
* ``causal_unmasked(att)`` (builder): the attributes that say so (``causal=1``, no mask).

An additive mask masks a score exactly when its value is -inf or at most -1e30 (a float32 score is far below
its rounding step; ``mask_fill`` says the same of a Where's fill), or the lowest value of a 16-bit mask dtype
(float16's -65504, what torch writes): the op computes scores in float32 and exp(-65504 + s - max) is 0 for any
row whose scores lie within 65,000 of each other. A bool mask's fill (``mask_value``) must be -inf or at most -1e30.
"""

from __future__ import annotations

import numpy as np

from graphopt.rewrite.registry import register_builder, register_constraint

MASKED_AT_MOST = -1e30


def _kind(att) -> str:
    kind = att.attr("mask_kind", "none")
    return kind.decode() if isinstance(kind, bytes) else str(kind)


def _masks_exactly(values: np.ndarray) -> bool:
    v = values.astype(np.float64)
    if values.dtype.itemsize == 2 and values.dtype.kind == "f":  # float16 (bfloat16's minimum is below -1e30)
        return bool(np.all((v <= MASKED_AT_MOST) | (v == float(np.finfo(np.float16).min))))
    return bool(np.all(v <= MASKED_AT_MOST))


@register_constraint("causal_mask", "tn")
def causal_mask(g, m, att):
    """m is a constant that masks key j > query i exactly, and nothing else, for every leading entry."""
    if not m:
        return "the attention has no mask"
    kind = _kind(att)
    if kind not in ("additive", "bool"):
        return f"mask_kind={kind!r}"
    value = g.constant_value(m)
    if value is None:
        return f"the mask {m!r} is not a constant"
    if value.ndim < 2 or min(value.shape[-2:]) < 2:
        return f"the mask {m!r} of shape {list(value.shape)} does not give each query row its own keys"
    sq, skv = value.shape[-2:]
    future = np.arange(skv)[None, :] > np.arange(sq)[:, None]  # what causal=1 masks
    rows = value.reshape(-1, sq, skv)
    if kind == "bool":
        if not np.array_equal(rows.astype(bool), np.broadcast_to(~future, rows.shape)):
            return f"the bool mask {m!r} is not the causal mask (True exactly where key <= query)"
        fill = att.attr("mask_value", None)
        if fill is not None and not fill <= MASKED_AT_MOST:
            return f"mask_value={fill:g} adds a finite score where causal=1 masks exactly"
        return None
    if not np.all(rows[:, ~future] == 0):
        return f"the additive mask {m!r} is not 0 everywhere at or below the diagonal"
    if not _masks_exactly(rows[:, future]):
        return (f"the additive mask {m!r} above the diagonal is not all -inf, <= -1e30 or a 16-bit dtype's lowest "
                "value: it does not mask a score exactly as causal=1 does")
    return None


@register_builder("causal_unmasked", "n", "attrs")
def causal_unmasked(g, att):
    """causal=1 and no mask (mask_kind none, no mask_value)."""
    return {"causal": 1, "mask_kind": "none", "mask_value": None}
