"""Constraint and builder of the gated-MLP rules (``rules/mlp.toml``).

* ``gated_activation(gate)``: the graphopt.GemmAct ``gate`` runs in matmul mode with an activation
  (the SiLU / GELU of SwiGLU / GeGLU), so its product with the up projection is a gated MLP;
* ``activation_attrs(node)`` (builder, attributes): the activation and its parameters of a
  graphopt node, to carry over onto the fused op.
"""

from __future__ import annotations

from graphopt.rewrite.registry import register_builder, register_constraint

_ACT_ATTRS = ("activation", "act_alpha", "act_beta", "clip_min", "clip_max")


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


@register_constraint("gated_activation", "n")
def gated_activation(g, gate):
    """gate is a graphopt.GemmAct in matmul mode whose activation is not 'none'."""
    mode = _text(gate.attr("mode", "matmul"))
    if mode != "matmul":
        return f"{gate.name!r} is a GemmAct in mode {mode!r}, not 'matmul'"
    if _text(gate.attr("activation", "none")) == "none":
        return f"{gate.name!r} has no activation, so the product is not a gated MLP"
    return None


@register_builder("activation_attrs", "n", "attrs")
def activation_attrs(g, node):
    """The activation attributes (activation, act_alpha, act_beta, clip_min, clip_max) node carries."""
    return {k: _text(node.attr(k)) for k in _ACT_ATTRS if node.has_attr(k)}
