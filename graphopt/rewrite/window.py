"""Constraint and builder for Swin's shifted-window attention mask (``rules/attention.toml``).

The export adds the relative-position bias, views the scores as ``[B/nW, nW, H, N, N]`` to add
the shift mask ``[1, nW, 1, N, N]``, and views them back to ``[B, H, N, N]`` before the Softmax:
``Reshape(Add(Reshape(scores + m1, s1) as r1, m2), s2) as r2``. Both views keep the element order,
so that is ``scores + (m1 + Reshape(Expand(m2, shape of r1), shape of the scores))``: one additive
mask, which graphopt.Attention takes.

* ``window_mask(r1, r2, mm, m2)``: r1 and r2 have static shapes, r2's equals the scores' (mm's
  output), and m2 broadcasts to r1's without enlarging it;
* ``static_shape(node)`` (builder): an int64 initializer holding node's static output shape.
"""

from __future__ import annotations

import numpy as np

from graphopt.rewrite.constraints import known_shape
from graphopt.rewrite.registry import BuildFailed, NewConstant, register_builder, register_constraint


@register_constraint("window_mask", "nnnt")
def window_mask(g, r1, r2, mm, m2):
    """Reshape(Add(Reshape(scores + m1) as r1, m2)) as r2 back to the scores' static shape."""
    s1, s2, ss = known_shape(g, r1.outputs[0]), known_shape(g, r2.outputs[0]), known_shape(g, mm.outputs[0])
    if s1 is None or s2 is None or ss is None:
        return f"the shapes around the window mask of {r2.name!r} are not static"
    if s2 != ss:
        return f"Reshape {r2.name!r} gives {list(s2)}, not the scores' shape {list(ss)}"
    ms = known_shape(g, m2) if m2 else None
    if ms is None:
        return f"the shape of the window mask {m2!r} is unknown"
    if len(ms) > len(s1) or any(a not in (1, b) for a, b in zip(reversed(ms), reversed(s1))):
        return f"the window mask {m2!r} of shape {list(ms)} does not broadcast to {list(s1)} without enlarging it"
    return None


@register_builder("static_shape", "n", "tensor")
def static_shape(g, node):
    """An int64 initializer holding node's static output shape."""
    shape = known_shape(g, node.outputs[0])
    if shape is None:
        raise BuildFailed(f"the output shape of {node.name!r} is not static")
    return NewConstant(np.asarray(shape, dtype=np.int64), f"{node.name}_shape")
