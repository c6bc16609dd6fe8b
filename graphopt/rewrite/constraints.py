"""Built-in constraints: small predicates that return ``None`` when they hold, else the reason.

Each takes the graph first, then the rule's arguments: tensor captures arrive as tensor names
(``None`` for an absent optional input), node captures as ``Node`` objects, literals as values.
The reason names the tensor or node so ``--explain`` can say exactly why a rule did not fire.
"""

from __future__ import annotations

import numpy as np

from graphopt.rewrite.registry import register_constraint


# -- helpers shared with builders.py -----------------------------------------------------------


def known_shape(g, t: str) -> tuple | None:
    """The shape of ``t`` when every dim is a known int: from its constant value, else value_info."""
    info = g.constant_info(t)  # a weight still in its file is not read for its shape
    if info is not None:
        return tuple(int(d) for d in info[1])
    shape = g.shape(t)
    if shape is None or any(not isinstance(d, int) or isinstance(d, bool) for d in shape):
        return None
    return tuple(shape)


def known_rank(g, t: str) -> int | None:
    info = g.constant_info(t)
    if info is not None:
        return len(info[1])
    shape = g.shape(t)
    return None if shape is None else len(shape)


def reduce_axes(g, node) -> list[int] | str:
    """The axes a Reduce* node reduces, as written (an input from opset 18, an attribute before): a list,
    or the reason they are unknown. Also read by the cleanup pass ``reduce_to_global_pool``."""
    if len(node.inputs) > 1 and node.inputs[1]:
        v = g.constant_value(node.inputs[1])
        if v is None:
            return f"the axes {node.inputs[1]!r} of {node.name!r} are not a constant"
        return [int(a) for a in np.asarray(v).reshape(-1)]
    if node.has_attr("axes"):
        return [int(a) for a in node.attr("axes")]
    return f"{node.name!r} reduces over all axes (no axes given)"


def conv_channels(g, conv) -> tuple[int, int] | None:
    """(output channels M, spatial rank) of a Conv-like node from its weight's shape."""
    if len(conv.inputs) < 2 or not conv.inputs[1]:
        return None
    wshape = known_shape(g, conv.inputs[1])
    if wshape is None or len(wshape) < 3:
        return None
    return wshape[0], len(wshape) - 2


def _fmt_shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _absent(t) -> str | None:
    return "the optional input is absent" if t is None else None


# -- constraints -------------------------------------------------------------------------------


@register_constraint("constant", "t")
def constant(g, t):
    """t is a constant (an initializer or a Constant node's output)."""
    if t is None:
        return _absent(t)
    if g.constant_info(t) is None:
        return f"{t!r} is not a constant"
    return None


@register_constraint("constant_or_absent", "t")
def constant_or_absent(g, t):
    """t is absent or a constant."""
    return None if t is None else constant(g, t)


@register_constraint("non_constant", "t")
def non_constant(g, t):
    """t is a runtime tensor, not a constant (e.g. a residual branch)."""
    if t is None:
        return _absent(t)
    if g.constant_info(t) is not None:
        return f"{t!r} is a constant, not a runtime tensor"
    return None


@register_constraint("per_channel", "tn")
def per_channel(g, c, conv):
    """c is a constant that adds one value per output channel of conv (or one value overall).

    Accepted shapes for a conv with M output channels and S spatial dims: [M,1..1] (rank S+1),
    [1,M,1..1] (rank S+2), and size-1 arrays of rank <= S+2. A plain [M] is rejected: NumPy
    broadcasting aligns it with the last spatial axis, not with the channels.
    """
    if c is None:
        return _absent(c)
    value = g.constant_value(c)
    if value is None:
        return f"{c!r} is not a constant"
    info = conv_channels(g, conv)
    if info is None:
        return f"the output channels of {conv.op_type} {conv.name!r} are unknown (its weight shape is not known)"
    m, spatial = info
    shape = tuple(np.shape(value))
    if np.size(value) == 1 and len(shape) <= spatial + 2:
        return None
    if shape in ((m,) + (1,) * spatial, (1, m) + (1,) * spatial):
        return None
    if shape == (m,) and spatial > 0:
        return (f"{c!r} has shape {_fmt_shape(shape)}, which broadcasts along the last spatial axis, "
                f"not the {m} channels of {conv.name!r}")
    return (f"{c!r} has shape {_fmt_shape(shape)}, not per-channel for the {m} output channels of "
            f"{conv.name!r} (expected {_fmt_shape((1, m) + (1,) * spatial)} or {_fmt_shape((m,) + (1,) * spatial)})")


@register_constraint("per_feature", "tn")
def per_feature(g, c, mm):
    """c is a constant bias with one value per output feature of MatMul/Gemm mm: [N] or [1..1,N]."""
    if c is None:
        return _absent(c)
    value = g.constant_value(c)
    if value is None:
        return f"{c!r} is not a constant"
    if len(mm.inputs) < 2 or not mm.inputs[1]:
        return f"{mm.name!r} has no second input"
    bshape = known_shape(g, mm.inputs[1])
    if bshape is None or len(bshape) < 1:
        return f"the output features of {mm.op_type} {mm.name!r} are unknown (its second input's shape is not known)"
    n = bshape[-1]
    shape = tuple(np.shape(value))
    if shape == (n,):
        return None
    if len(shape) >= 2 and shape[-1] == n and all(d == 1 for d in shape[:-1]):
        # Leading 1s must not raise the output's rank.
        ranks = [known_rank(g, t) for t in mm.inputs[:2]]
        if all(r is not None for r in ranks) and len(shape) <= max(ranks):
            return None
        return f"{c!r} has shape {_fmt_shape(shape)} and the rank of {mm.name!r}'s output is unknown or smaller"
    return f"{c!r} has shape {_fmt_shape(shape)}, not per-feature for the {n} outputs of {mm.name!r}"


@register_constraint("residual_shape", "tn")
def residual_shape(g, r, node):
    """Adding r to node's output does not enlarge it (checked when both shapes are known)."""
    if r is None:
        return _absent(r)
    out = node.outputs[0]
    rs, os_ = g.shape(r), g.shape(out)
    if rs is None or os_ is None:
        return None  # unknown: the fused op broadcasts exactly like the Add it replaces
    if len(rs) > len(os_):
        return f"{r!r} has rank {len(rs)} > the rank {len(os_)} of {out!r}; the Add would broadcast the conv output"
    for a, b in zip(reversed(rs), reversed(os_)):
        if isinstance(a, int) and isinstance(b, int) and a not in (1, b):
            return f"{r!r} of shape {_fmt_shape(rs)} does not broadcast to {out!r} of shape {_fmt_shape(os_)}"
        if isinstance(a, int) and a != 1 and not isinstance(b, int):
            return f"{r!r} of shape {_fmt_shape(rs)} may enlarge {out!r} of shape {_fmt_shape(os_)}"
    return None


@register_constraint("scalar", "t")
def scalar(g, t):
    """t holds exactly one element (known shape)."""
    if t is None:
        return _absent(t)
    shape = known_shape(g, t)
    if shape is None:
        return f"the shape of {t!r} is unknown"
    if int(np.prod(shape)) != 1:
        return f"{t!r} has shape {_fmt_shape(shape)}, not a scalar"
    return None


@register_constraint("scalar_for", "tn")
def scalar_for(g, t, node):
    """t holds exactly one element and multiplies node's output without raising its rank (a [1] scale
    of a 0-D output would make the product [1])."""
    reason = scalar(g, t)
    if reason is not None:
        return reason
    t_rank = len(known_shape(g, t))
    if t_rank == 0:
        return None
    out_rank = known_rank(g, node.outputs[0])
    if out_rank is None:  # a node just made by a rule: a MatMul-like output has its largest input's rank, less one at most
        ranks = [known_rank(g, i) for i in node.inputs if i]
        out_rank = max((r - 1 for r in ranks if r is not None), default=None)
    if out_rank is None:
        return f"the rank of {node.outputs[0]!r} is unknown"
    if t_rank > out_rank:
        return f"{t!r} of rank {t_rank} would raise the rank of {node.outputs[0]!r} ({out_rank})"
    return None


@register_constraint("value_in", "tvv")
def value_in(g, t, lo, hi):
    """t is a constant whose every element lies in [lo, hi]."""
    if t is None:
        return _absent(t)
    value = g.constant_value(t)
    if value is None:
        return f"{t!r} is not a constant"
    v = np.asarray(value, dtype=np.float64)
    if v.size and (v.min() < lo or v.max() > hi):
        return f"{t!r} has values in [{v.min():g}, {v.max():g}], outside [{lo:g}, {hi:g}]"
    return None


@register_constraint("const_near", "tvv?")
def const_near(g, t, value, rtol=None):
    """t is a one-element constant equal to value to the precision of t's dtype (within 2 units in the
    last place: exporters round 1/sqrt(2) differently), so snapping it changes no output; a look-alike
    (1.0008 for 1) does not match. An explicit rtol opts into a looser match."""
    if t is None:
        return _absent(t)
    v = g.constant_value(t)
    if v is None:
        return f"{t!r} is not a constant"
    if np.size(v) != 1:
        return f"{t!r} has {np.size(v)} elements, expected one ({value:g})"
    arr = np.asarray(v)
    x = float(arr.astype(np.float64).reshape(-1)[0])
    if rtol is not None:
        if abs(x - value) > rtol * abs(value) + 1e-12:
            return f"{t!r} is {x:g}, expected {value:g} (rtol {rtol:g})"
        return None
    dtype = arr.dtype if arr.dtype.kind == "f" else None
    if dtype is None:  # an integer or bool constant: exact
        return None if x == value else f"{t!r} is {x:g}, expected exactly {value:g}"
    finfo = np.finfo(dtype)
    # two units in the last place of value in t's dtype; zero must be zero (to the smallest normal)
    tol = 2 * float(np.spacing(dtype.type(abs(value)))) if value else float(finfo.tiny)
    if abs(x - value) > tol:
        shown = np.format_float_positional(arr.reshape(-1)[0], trim="-")  # shortest repr in t's dtype
        return (f"{t!r} is {shown}, expected {value:g} to {dtype} precision (differs by {abs(x - value):.3g}); "
                "fusing would change the outputs")
    return None


@register_constraint("rank", "tv")
def rank(g, t, n):
    """t has rank n (known shape)."""
    if t is None:
        return _absent(t)
    r = known_rank(g, t)
    if r is None:
        return f"the rank of {t!r} is unknown"
    if r != n:
        return f"{t!r} has rank {r}, expected {n}"
    return None


@register_constraint("same_shape", "tt")
def same_shape(g, a, b):
    """a and b have the same fully known shape."""
    if a is None or b is None:
        return "an input is absent"
    sa, sb = known_shape(g, a), known_shape(g, b)
    if sa is None or sb is None:
        return f"the shape of {a if sa is None else b!r} is unknown"
    if sa != sb:
        return f"{a!r} has shape {_fmt_shape(sa)} but {b!r} has {_fmt_shape(sb)}"
    return None


@register_constraint("single_use", "n")
def single_use(g, node):
    """node's outputs have one consumer in total and none is a graph output."""
    users = []
    for out in node.outputs:
        if not out:
            continue
        if g.is_graph_output(out):
            return f"{out!r} of {node.name!r} is a graph output"
        users += [c.name for c in g.consumers(out)]
    if len(users) != 1:
        return f"{node.name!r} has {len(users)} consumers ({', '.join(users)})"
    return None


def _attr_default(node, name):
    """The default of an absent attribute, from the ONNX or graphopt schema when it declares one."""
    try:
        if node.domain == "graphopt":
            from graphopt.ops import get_schema

            return get_schema(node.op_type).attributes.get(name, (None, None))[1]
        import onnx.defs
        from onnx import helper

        schema = onnx.defs.get_schema(node.op_type, domain=node.domain or "")
        attr = schema.attributes.get(name)
        if attr is not None and attr.default_value.name:
            return helper.get_attribute_value(attr.default_value)
    except Exception:  # no schema: no default
        return None
    return None


@register_constraint("attr_equals", "nvv")
def attr_equals(g, node, name, value):
    """node's attribute name (or its schema default when absent) equals value."""
    actual = node.attr(name) if node.has_attr(name) else _attr_default(node, name)
    if isinstance(actual, bytes):
        actual = actual.decode()
    if isinstance(actual, np.ndarray):
        actual = actual.tolist()
    if isinstance(value, float) or isinstance(actual, float):
        ok = actual is not None and not isinstance(actual, (str, list)) and abs(float(actual) - float(value)) <= 1e-6
    else:
        ok = actual == value
    if not ok:
        return f"{node.name!r} has {name}={actual!r}, expected {value!r}"
    return None


@register_constraint("no_auto_pad", "n")
def no_auto_pad(g, node):
    """node has no auto_pad, or auto_pad=NOTSET."""
    pad = node.attr("auto_pad", "NOTSET")
    if isinstance(pad, bytes):
        pad = pad.decode()
    if pad not in ("NOTSET", ""):
        return f"{node.name!r} uses auto_pad={pad}"
    return None
