"""Constraints and builder of the GroupNorm rules (``rules/norm.toml``).

torch exports ``nn.GroupNorm`` (both exporters) as Reshape(x, [N, G, -1]) -> InstanceNormalization
(scale ones, bias zeros) -> Reshape back to x's shape -> Mul(weight [C, 1, 1]) -> Add(bias [C, 1, 1]).

* ``group_norm(r1, inorm, r2, x)``: r1 views x as [N, G, rest] with G dividing C, inorm normalises it
  with unit scale and zero bias, r2 gives back x's shape;
* ``channel_affine(w, x)``: w is a constant [C, 1, ..] (rank of x minus one) or [1, C, 1, ..];
* ``group_norm_attrs(r1, inorm)`` (builder): ``num_groups`` and ``epsilon``.
"""

from __future__ import annotations

import numpy as np

from graphopt.rewrite.registry import BuildFailed, register_builder, register_constraint


def _groups(g, r1, x) -> int | str:
    xs, rs = g.shape(x), g.shape(r1.outputs[0])
    if xs is None or len(xs) < 3 or not isinstance(xs[1], int):
        return f"the channels of {x!r} are unknown"
    if rs is None or len(rs) != 3 or not isinstance(rs[1], int):
        shape = g.constant_value(r1.inputs[1]) if len(r1.inputs) > 1 else None
        if shape is None or np.size(shape) != 3:
            return f"Reshape {r1.name!r} does not view {x!r} as [N, groups, rest]"
        groups = int(np.asarray(shape).reshape(-1)[1])
    else:
        groups = int(rs[1])
    if groups < 1 or xs[1] % groups:
        return f"{xs[1]} channels of {x!r} do not split into {groups} groups"
    if rs is not None and len(rs) == 3 and rs[0] != xs[0]:
        return f"Reshape {r1.name!r} changes the batch dim of {x!r}"
    return groups


@register_constraint("group_norm", "nnnt")
def group_norm(g, r1, inorm, r2, x):
    """Reshape(x, [N, G, -1]) -> InstanceNormalization(ones, zeros) -> Reshape to x's shape."""
    groups = _groups(g, r1, x)
    if isinstance(groups, str):
        return groups
    for t, want in zip(inorm.inputs[1:3], (1.0, 0.0)):
        v = g.constant_value(t) if t else None
        if v is None or np.shape(v) != (groups,) or not np.all(np.asarray(v) == want):
            return f"InstanceNormalization {inorm.name!r} {'scale' if want else 'bias'} {t!r} is not {groups} {want:g}s"
    xs, ys = g.shape(x), g.shape(r2.outputs[0])
    if ys is None or tuple(ys) != tuple(xs) or any(d is None for d in ys):
        return f"Reshape {r2.name!r} does not give back the shape of {x!r} ({ys} vs {xs})"
    return None


@register_constraint("channel_affine", "tt")
def channel_affine(g, w, x):
    """w is a constant [C, 1, ..] (rank of x minus one) or [1, C, 1, ..]."""
    v = g.constant_value(w) if w else None
    if v is None:
        return f"{w!r} is not a constant"
    xs = g.shape(x)
    if xs is None or len(xs) < 3 or not isinstance(xs[1], int):
        return f"the channels of {x!r} are unknown"
    c, rank = xs[1], len(xs)
    if np.shape(v) in ((c,) + (1,) * (rank - 2), (1, c) + (1,) * (rank - 2)):
        return None
    return f"{w!r} has shape {list(np.shape(v))}, not per channel for the {c} channels of {x!r} ([{c}, 1, ...])"


@register_builder("group_norm_attrs", "nn", "attrs")
def group_norm_attrs(g, r1, inorm):
    """{"num_groups": G, "epsilon": the InstanceNormalization's epsilon}."""
    groups = _groups(g, r1, r1.inputs[0])
    if isinstance(groups, str):
        raise BuildFailed(groups)
    return {"num_groups": int(groups), "epsilon": float(inorm.attr("epsilon", 1e-5))}
