"""``fold_pad_into_conv``: fold a zero constant-mode Pad of the spatial axes into the next Conv."""

from __future__ import annotations

import numpy as np

from graphopt.ir import Graph, Node

from graphopt.passes._conv import copied_attrs
from graphopt.passes._util import Trace, only_consumer, opset_version, report

NAME = "fold_pad_into_conv"


def _pads_of(graph: Graph, pad: Node, rank_hint: int | None):
    """(begin, end) per axis for a zero constant-mode Pad, or the reason it is not one."""
    mode = pad.attr("mode", "constant")
    if mode != "constant":
        return f"mode is {mode!r}, not 'constant'"
    if opset_version(graph) < 11:
        pads = pad.attr("pads", pad.attr("paddings"))
        if pads is None:
            return "the Pad has no pads attribute"
        value = float(pad.attr("value", 0.0))
        axes = None
    else:
        if len(pad.inputs) < 2 or not pad.inputs[1]:
            return "the Pad has no pads input"
        pads = graph.constant_value(pad.inputs[1])
        if pads is None:
            return f"pads {pad.inputs[1]!r} is not a constant"
        value = 0.0
        if len(pad.inputs) > 2 and pad.inputs[2]:
            v = graph.constant_value(pad.inputs[2])
            if v is None or v.size != 1:
                return f"constant_value {pad.inputs[2]!r} is not a constant scalar"
            value = float(np.asarray(v).reshape(-1)[0])
        axes = None
        if len(pad.inputs) > 3 and pad.inputs[3]:
            axes = graph.constant_value(pad.inputs[3])
            if axes is None:
                return f"axes {pad.inputs[3]!r} is not a constant"
            axes = [int(a) for a in np.asarray(axes).reshape(-1)]
    if value != 0.0:
        return f"the pad value is {value}, not 0"
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    if len(pads) % 2:
        return f"pads has odd length {len(pads)}"
    half = len(pads) // 2
    if axes is None:
        return pads[:half], pads[half:]
    if rank_hint is None:
        return "the Pad has an axes input and the Conv input rank is unknown"
    if len(axes) != half or len({a % rank_hint for a in axes}) != half or any(not -rank_hint <= a < rank_hint for a in axes):
        return f"axes {axes} do not match pads of length {len(pads)}"
    begin, end = [0] * rank_hint, [0] * rank_hint
    for i, a in enumerate(axes):
        begin[a % rank_hint], end[a % rank_hint] = pads[i], pads[half + i]
    return begin, end


def _conv_rank(graph: Graph, conv: Node) -> int | None:
    if len(conv.inputs) > 1 and conv.inputs[1]:
        w_shape = graph.shape(conv.inputs[1])
        if w_shape is not None:
            return len(w_shape)
    kernel = conv.attr("kernel_shape")
    return None if kernel is None else len(kernel) + 2


def _match(graph: Graph, conv: Node):
    """(pad, new conv pads) for a foldable Pad -> Conv, or the reason."""
    pad = graph.producer(conv.inputs[0]) if conv.inputs and conv.inputs[0] else None
    if pad is None or pad.op_type != "Pad" or pad.domain != "":
        return None  # not a Pad -> Conv at all: nothing to report
    if only_consumer(graph, conv.inputs[0]) is not conv or conv.inputs.count(conv.inputs[0]) != 1:
        return f"the Pad output {conv.inputs[0]!r} has another consumer or is a graph output"
    auto_pad = conv.attr("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        return f"the Conv has auto_pad={auto_pad!r} (its padding depends on the input size)"
    rank = _conv_rank(graph, conv)
    pads = _pads_of(graph, pad, rank)
    if isinstance(pads, str):
        return pads
    begin, end = pads
    if rank is not None and len(begin) != rank:
        return f"pads cover {len(begin)} axes but the Conv input has rank {rank}"
    if len(begin) < 3:
        return f"pads cover {len(begin)} axes; a Conv input has at least 3"
    if begin[0] or begin[1] or end[0] or end[1]:
        return "the Pad pads the batch or channel axis"
    if any(p < 0 for p in begin + end):
        return "the Pad has negative pads (a crop)"
    spatial = len(begin) - 2
    # auto_pad VALID means no padding (any pads attribute is ignored); the result is NOTSET + pads.
    conv_pads = [0] * (2 * spatial) if auto_pad == "VALID" else conv.attr("pads", [0] * (2 * spatial))
    if len(conv_pads) != 2 * spatial:
        return f"the Conv pads {conv_pads} do not have {2 * spatial} entries"
    new = [conv_pads[i] + begin[2 + i] for i in range(spatial)] + [conv_pads[spatial + i] + end[2 + i] for i in range(spatial)]
    return pad, new


def fold_pad_into_conv(graph: Graph, *, trace: Trace = None) -> int:
    """Fold ``Conv(Pad(x))`` into ``Conv(x)`` with the Pad's amounts added to the Conv's ``pads``.

    Legal when the Pad is constant-mode with value 0 and constant, non-negative pads on the spatial
    axes only (attribute form for opset < 11, input form with optional axes for opset >= 11), the
    Conv has ``auto_pad`` NOTSET or VALID (SAME_* depend on the input size), and the Pad output is read only by the Conv (as its data input)
    and is not a graph output. A Conv's own pads are zeros added to its input, so the result is the
    same for any strides, dilations and groups. Returns the number of folds.
    """
    changes = 0
    for g, conv in graph.find("Conv"):  # through the op index, not a walk over every node
        if conv.op_type != "Conv" or conv.domain != "" or conv not in g:
            continue
        match = _match(g, conv)
        if match is None:
            continue
        if isinstance(match, str):
            report(trace, NAME, conv, match)
            continue
        pad, new_pads = match
        attrs = copied_attrs(conv)
        attrs["pads"] = new_pads
        if "auto_pad" in attrs:
            attrs["auto_pad"] = "NOTSET"
        note = f"graphopt:{NAME} folded Pad {pad.name!r}"
        g.replace_subgraph(
            [pad, conv],
            [
                dict(
                    op_type="Conv",
                    inputs=[pad.inputs[0]] + list(conv.inputs[1:]),
                    outputs=list(conv.outputs),
                    attrs=attrs,
                    name=conv.name,
                    doc_string=f"{conv.doc_string}\n{note}" if conv.doc_string else note,
                )
            ],
        )
        changes += 1
    return changes
