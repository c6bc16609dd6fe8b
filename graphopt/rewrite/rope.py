"""Constraints of the rotary-embedding rules (``rules/rope.toml``).

* ``rotate_half(hi, lo, cat, x)``: ``cat = Concat(Neg(hi), lo)`` over the last axis, with
  ``hi = x[..., D/2:]`` and ``lo = x[..., :D/2]`` (both Slices with constant bounds);
* ``rotate_pairs(odd, even, cat, flat, x)``: ``flat = Reshape(Concat(Unsqueeze(Neg(odd), -1),
  Unsqueeze(even, -1)), shape of x)`` with ``odd = x[..., 1::2]`` and ``even = x[..., 0::2]``;
* ``rope_table(t, x)``: the cos / sin table t broadcasts to x without enlarging it (symbolic dims
  pass: the op's body broadcasts exactly as the Mul it replaces).

They need x's last dim D known (even); the opset must have Slice with inputs (>= 10).
"""

from __future__ import annotations

import numpy as np

from graphopt.rewrite.constraints import known_shape
from graphopt.rewrite.registry import register_constraint


def _slice_params(g, node):
    """(starts, ends, axes, steps) as int lists, or the reason they are not constants."""
    if len(node.inputs) >= 3:
        vals = []
        for i, default in ((1, None), (2, None), (3, "axes"), (4, "steps")):
            t = node.inputs[i] if i < len(node.inputs) else ""
            if not t:
                vals.append(default)
                continue
            v = g.constant_value(t)
            if v is None:
                return f"{t!r} of Slice {node.name!r} is not a constant"
            vals.append([int(a) for a in np.asarray(v).reshape(-1)])
        starts, ends, axes, steps = vals
    else:  # opset < 10: attributes
        if not node.has_attr("starts") or not node.has_attr("ends"):
            return f"Slice {node.name!r} has no starts/ends"
        starts, ends = list(node.attr("starts")), list(node.attr("ends"))
        axes, steps = (list(node.attr("axes")) if node.has_attr("axes") else "axes"), "steps"
    if axes == "axes":
        axes = list(range(len(starts)))
    if steps == "steps":
        steps = [1] * len(starts)
    return starts, ends, axes, steps


def _is_slice(g, node, x, rank, d, start, end, step) -> str | None:
    """node slices x[..., start:end:step] over the last axis only (end may be any value >= d)."""
    params = _slice_params(g, node)
    if isinstance(params, str):
        return params
    starts, ends, axes, steps = params
    if len(starts) != 1 or [a % rank for a in axes] != [rank - 1]:
        return f"Slice {node.name!r} does not slice only the last axis of {x!r}"
    s, e, st = starts[0], ends[0], steps[0]
    s = s + d if s < 0 else s
    ok_end = (e >= d) if end is None else (e == end or (e < 0 and e + d == end))
    if s != start or not ok_end or st != step:
        want = f"{start}:{'' if end is None else end}:{step}"
        return f"Slice {node.name!r} takes {starts[0]}:{ends[0]}:{steps[0]} of the last axis, not {want} (D={d})"
    return None


def _last_dim(g, x) -> tuple[int, int] | str:
    shape = g.shape(x)
    if shape is None or not shape or not isinstance(shape[-1], int) or shape[-1] <= 0:
        return f"the last dim of {x!r} is unknown"
    if shape[-1] % 2:
        return f"the last dim of {x!r} is {shape[-1]}, not even"
    if g.root.opset.get("", 0) < 10:
        return "opset < 10 (graphopt.RoPE's body needs Slice with inputs)"
    return len(shape), shape[-1]


def _concat_last(cat, rank) -> str | None:
    axis = int(cat.attr("axis", 0))
    if axis % rank != rank - 1:
        return f"Concat {cat.name!r} joins axis {axis}, not the last"
    return None


@register_constraint("rotate_half", "nnnt")
def rotate_half(g, hi, lo, cat, x):
    """cat = Concat(Neg(x[..., D/2:]), x[..., :D/2]) over the last axis."""
    info = _last_dim(g, x)
    if isinstance(info, str):
        return info
    rank, d = info
    return (_concat_last(cat, rank) or _is_slice(g, hi, x, rank, d, d // 2, None, 1)
            or _is_slice(g, lo, x, rank, d, 0, d // 2, 1))


@register_constraint("rotate_pairs", "nnnnt")
def rotate_pairs(g, odd, even, cat, flat, x):
    """flat = Reshape(Concat(Unsqueeze(Neg(x[..., 1::2])), Unsqueeze(x[..., 0::2])), shape of x)."""
    info = _last_dim(g, x)
    if isinstance(info, str):
        return info
    rank, d = info
    reason = (_concat_last(cat, rank + 1) or _is_slice(g, odd, x, rank, d, 1, None, 2)
              or _is_slice(g, even, x, rank, d, 0, None, 2))
    if reason:
        return reason
    xs, fs = known_shape(g, x), known_shape(g, flat.outputs[0])
    if xs is None or fs is None or xs != fs:
        return f"Reshape {flat.name!r} does not give back the shape of {x!r} ({fs} vs {xs})"
    return None


@register_constraint("rope_table", "tt")
def rope_table(g, t, x):
    """t (a cos or sin table) broadcasts to x without enlarging it."""
    ts, xs = g.shape(t), g.shape(x)
    if ts is None or xs is None:
        return f"the shape of {t if ts is None else x!r} is unknown"
    if len(ts) > len(xs):
        return f"{t!r} has rank {len(ts)} > the rank {len(xs)} of {x!r}"
    for a, b in zip(reversed(ts), reversed(xs)):
        if a == 1 or a == b or not isinstance(a, int) or not isinstance(b, int):
            continue  # a symbolic dim: the op broadcasts exactly as the Mul it replaces
        return f"{t!r} of shape {list(ts)} does not broadcast to {x!r} of shape {list(xs)} without enlarging it"
    return None
