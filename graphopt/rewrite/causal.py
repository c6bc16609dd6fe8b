"""Constraint and builder for a causal mask (``rules/attention.toml``, ``attention_causal_mask``).

Exports of decoder models with static shapes fold the causal mask into a constant (transformers' LLaMA, Qwen2
and Mistral: an additive ``[B, 1, S, S]`` of 0 and the dtype's minimum; GPT-2's eager attention: a bool slice
of its lower-triangular buffer); exports with a dynamic length compute it on every call from Range and
LessOrEqual (``rewrite/mask_grid.py`` proves what such a mask holds). graphopt.Attention then reads it like any
mask, a ``[B, S, S]`` read per head and layer. ``causal=1`` says the same without a tensor, and lets cuDNN's SDPA
skip the masked half.

* ``causal_mask(m, att)``: the mask m of Attention att (a constant, or computed as ``mask_grid`` follows) masks
  exactly key j > query i (the op's top-left ``causal``) for every batch entry, and masks a score exactly as
  ``causal`` does;
* ``causal_unmasked(att)`` (builder): the attributes that say so (``causal=1``, no mask).

An additive mask masks a score exactly when its value is -inf or at most -1e30 (a float32 score is far below
its rounding step; ``mask_fill`` says the same of a Where's fill), or float16's lowest value (-65504), what torch
writes into an fp16 mask and itself treats as masked: that score then still counts only where it exceeds the
row's largest unmasked score by more than ~65,000, more than an fp16 score holds in any real model. The -1e4 that
``--precision fp16`` (onnxconverter-common) writes for a float32 mask's -3.4e38 is not accepted as such (a
score 10,000 above the row's others survives it); where the fp32 source held <= -1e30 at those positions
(``Graph.fp16_clamped``), it is read as the -inf the source model meant (``mask_grid.exact_value``). A bool
mask's fill (``mask_value``) must be -inf or at most -1e30.
"""

from __future__ import annotations

import numpy as np

from graphopt.ops.attention import swap_heads, unpacked_shape
from graphopt.rewrite.mask_grid import NotAMaskGrid, exact_value, fits_scores, mask_grid
from graphopt.rewrite.registry import register_builder, register_constraint

MASKED_AT_MOST = -1e30


def _kind(att) -> str:
    kind = att.attr("mask_kind", "none")
    return kind.decode() if isinstance(kind, bytes) else str(kind)


def _masks_exactly(values: np.ndarray) -> bool:
    v = values.astype(np.float64)
    if values.dtype == np.float16:  # (bfloat16's minimum is below -1e30)
        return bool(np.all((v <= MASKED_AT_MOST) | (v == float(np.finfo(np.float16).min))))
    return bool(np.all(v <= MASKED_AT_MOST))


def _scores(g, att) -> tuple | None:
    """The dims of Attention att's scores, [..., H, Sq, Skv], as its Q and V shapes give them (ints, dim names or
    None); None where Q's rank is unknown."""
    q = g.shape(att.inputs[0])
    v = (g.shape(att.inputs[2]) if len(att.inputs) > 2 and att.inputs[2] else None) or ()
    if q is None or len(q) < 2:
        return None
    if att.attr("qkv_packed", 0):  # Q is [B, S, 3, H, D] and stands for K and V
        if len(q) != 5:
            return None
        q = v = swap_heads(unpacked_shape(q))
    elif att.attr("qkv_bshd", 0):  # [B, S, H, D]
        if len(q) != 4:
            return None
        q, v = swap_heads(q), (swap_heads(v) if len(v) == 4 else ())
    return tuple(q[:-2]) + (q[-2], v[-2] if len(v) >= 2 else None)


@register_constraint("causal_mask", "tn")
def causal_mask(g, m, att):
    """m (a constant, or a mask ``mask_grid`` proves for every length) masks key j > query i exactly, and nothing
    else, for every leading entry."""
    if not m:
        return "the attention has no mask"
    kind = _kind(att)
    if kind not in ("additive", "bool"):
        return f"mask_kind={kind!r}"
    value = exact_value(g, m)
    if value is None:
        try:
            value = mask_grid(g, m, lambda: _scores(g, att))[None]
        except NotAMaskGrid as why:
            return f"the mask {m!r} is not a constant, and what it holds is not proven: {why}"
    elif value.ndim >= 2 and min(value.shape[-2:]) >= 2 and (why := fits_scores(value.shape, _scores(g, att))):
        return f"the constant mask {m!r}: {why}"
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
        return (f"the additive mask {m!r} above the diagonal is not all -inf, <= -1e30 or float16's lowest value: "
                "it does not mask a score exactly as causal=1 does")
    return None


@register_builder("causal_unmasked", "n", "attrs")
def causal_unmasked(g, att):
    """causal=1 and no mask (mask_kind none, no mask_value)."""
    return {"causal": 1, "mask_kind": "none", "mask_value": None}
