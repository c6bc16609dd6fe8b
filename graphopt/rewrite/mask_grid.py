"""What a mask computed at run time holds at its query and key positions: the proof behind
``causal_mask`` (``rewrite/causal.py``) for a mask that is not a constant.

Exports of decoder models with a dynamic sequence length build the causal mask on every call:
``Where(Expand(LessOrEqual(key, query), ..), 0, min)`` with key ``[.., 1, S]`` and query ``[.., S, 1]`` both
``Unsqueeze(Range(0, S, 1))`` (transformers' LLaMA family, from either exporter). Exports with a static length
and a dynamic batch keep a constant causal table And-ed with a padding mask made of ones (``ones_like``
of the input ids, gathered), which is True everywhere whatever its shape. :func:`mask_grid` follows the mask
back through such ops, keeping each tensor as an expression of the positions (i, j) on its last two axes,
and returns the mask's values on a grid that decides every position:

* symbolic lengths: the expression may compare positions only with positions (no integer constant meets a
  position, no arithmetic on one). Its value then depends only on which of i < j, i == j, i > j holds, and
  the 3 x 3 grid has every case;
* integer lengths (a constant table, for one): the whole [Sq, Skv] grid, up to ``MAX_CELLS``.

The dims it needs (a Range's length, the mask's last two) are computed along the same ops (:func:`dims`) from
the entries of the shape arithmetic (``dim_sources``): a TorchScript export computes the Range's bound and the
Expand's target from ``Shape``, which onnx's inference names afresh (``unk__``).

Why by hand: onnx's reference evaluator and the constant folding need concrete shapes, and evaluating at a
few concrete lengths proves nothing (a sliding-window mask is causal up to its window). onnxruntime's symbolic
shape inference was tried for the dims and is not a proof: where it cannot decide (``Slice`` ends against
symbolic dims, ``Squeeze`` without axes) it assumes, and a wrong assumption would make a mask causal that is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from onnx import TensorProto, helper

from graphopt.rewrite.dim_sources import dim_source, entry_size, known_size, same_size, vector_length

MAX_DEPTH = 32
MAX_CELLS = 1 << 24
ORDER_GRID = 3  # i < j, i == j and i > j each hold somewhere on a 3 x 3 grid

COMPARE = {"Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater,
           "GreaterOrEqual": np.greater_equal, "Equal": np.equal}
LOGICAL = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}
# ops whose every output element is an element of their (first) input: a uniform input stays uniform
SAME_ELEMENTS = {"Gather", "GatherND", "GatherElements", "Reshape", "Squeeze", "Unsqueeze", "Transpose",
                 "Slice", "Tile", "Flatten", "Identity", "Expand"}


class NotAMaskGrid(Exception):
    """The mask's values are not proven as a function of its query and key positions (the reason)."""


@dataclass(frozen=True)
class Const:
    value: np.ndarray  # 0-d: the same at every position


@dataclass(frozen=True)
class Index:
    axis: int  # negative: the position along this axis of the tensor
    range: str  # the Range output it reads: its length is that tensor's dim (``dims``)


@dataclass(frozen=True)
class Table:
    array: np.ndarray  # a constant tensor, aligned with the trailing axes


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple
    to: int = 0  # Cast's target


def _rank(g, t: str) -> int:
    shape = g.shape(t)
    if shape is None:
        raise NotAMaskGrid(f"the rank of {t!r} is unknown")
    return len(shape)


def _is_int(g, t: str, want: int) -> bool:
    """``t`` is an integer constant equal to ``want`` (a float Range bound of 0.5 is not 0)."""
    value = g.constant_value(t) if t else None
    return value is not None and value.dtype.kind in "iu" and value.size == 1 and int(value.reshape(-1)[0]) == want


def _ints(g, t: str) -> list[int] | None:
    value = g.constant_value(t) if t else None
    return None if value is None or value.dtype.kind not in "iu" else [int(x) for x in np.asarray(value).reshape(-1)]


def exact_value(g, t: str) -> np.ndarray | None:
    """``g.constant_value(t)``, with -inf where the fp16 conversion clamped the source model's minus infinity to
    -1e4 (``Graph.fp16_clamped``, set by ``graphopt.precision``; those positions must still hold -1e4): the mask
    the source model meant. Only for a value the mask adds (a Where's branch, the mask itself), never for one a
    comparison reads."""
    value = g.constant_value(t)
    clamped = g.root.fp16_clamped.get(t) if value is not None else None
    if clamped is None or clamped.shape != value.shape or not np.all(value[clamped] == value.dtype.type(-1e4)):
        return value
    return np.where(clamped, value.dtype.type(-np.inf), value)


def _constant(value: np.ndarray):
    flat = np.asarray(value).reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return Const(np.asarray(flat[0]))
    if flat.size > MAX_CELLS:
        raise NotAMaskGrid(f"a constant of {flat.size} elements")
    return Table(np.asarray(value))


def _unsqueezed(e, in_rank: int, axes: list[int], memo: dict | None = None):
    """``e`` of a rank-``in_rank`` tensor, as an expression of ``Unsqueeze(tensor, axes)`` (shared subexpressions
    once: ``memo`` by identity)."""
    memo = {} if memo is None else memo
    if id(e) not in memo:
        memo[id(e)] = _unsqueezed_node(e, in_rank, axes, memo)
    return memo[id(e)]


def _unsqueezed_node(e, in_rank: int, axes: list[int], memo: dict):
    out_rank = in_rank + len(axes)
    new = sorted(a + out_rank if a < 0 else a for a in axes)
    kept = [q for q in range(out_rank) if q not in new]  # output position of each input axis
    if isinstance(e, Index):
        return Index(kept[in_rank + e.axis] - out_rank, e.range)
    if isinstance(e, Table):
        arr = e.array.reshape((1,) * (in_rank - e.array.ndim) + e.array.shape)
        return Table(np.expand_dims(arr, tuple(new)))
    if isinstance(e, Op):
        return Op(e.name, tuple(_unsqueezed(a, in_rank, axes, memo) for a in e.args), e.to)
    return e


def term(g, t: str, depth: int = 0, as_value: bool = True, memo: dict | None = None):
    """The expression of tensor ``t``'s values (raises ``NotAMaskGrid``). ``as_value``: t is what the mask adds
    (``exact_value`` applies), not what a comparison reads. ``memo``: one walk per tensor (a mask built as
    ``And(x, x)`` n times would be walked 2^n times)."""
    memo = {} if memo is None else memo
    key = (t, as_value)
    if key not in memo:
        memo[key] = _term(g, t, depth, as_value, memo)
    return memo[key]


def _term(g, t: str, depth: int, as_value: bool, memo: dict):
    if depth > MAX_DEPTH:
        raise NotAMaskGrid(f"{t!r} is computed by more than {MAX_DEPTH} ops")
    value = exact_value(g, t) if as_value else g.constant_value(t)
    if value is not None:
        return _constant(value)
    node = g.producer(t)
    if node is None:
        raise NotAMaskGrid(f"{t!r} is a graph input")
    op, ins = node.op_type, node.inputs
    if node.domain not in ("", "ai.onnx"):
        raise NotAMaskGrid(f"{t!r} comes from {node.domain}.{op}")
    if op == "ConstantOfShape":
        fill = node.attr("value")
        return Const(np.asarray(0.0, np.float32) if fill is None else np.asarray(fill).reshape(-1)[0])
    if op == "Range":
        if not (_is_int(g, ins[0], 0) and _is_int(g, ins[2], 1)):
            raise NotAMaskGrid(f"Range {node.name!r} is not Range(0, n, 1) over integers")
        return Index(-1, t)
    if op in SAME_ELEMENTS or op == "Cast":
        inner = term(g, ins[0], depth + 1, as_value, memo)
        if isinstance(inner, Const):  # every element one of the input's: the same value
            if op != "Cast":
                return inner
            return Const(inner.value.astype(helper.tensor_dtype_to_np_dtype(int(node.attr("to")))))
        if op == "Cast":
            return Op("Cast", (inner,), int(node.attr("to")))
        if op in ("Expand", "Identity"):  # broadcast over leading axes / a copy: the trailing axes keep their positions
            return inner
        if op == "Unsqueeze":
            axes = _ints(g, ins[1]) if len(ins) > 1 else node.attr("axes")
            if axes is None:
                raise NotAMaskGrid(f"Unsqueeze {node.name!r} has axes computed at run time")
            return _unsqueezed(inner, _rank(g, ins[0]), list(axes))
        raise NotAMaskGrid(f"{op} {node.name!r} moves the positions of a value that is not uniform")
    if op == "Where":  # the condition is read; the branches are the values
        return Op(op, tuple(term(g, x, depth + 1, k > 0 and as_value, memo) for k, x in enumerate(ins)))
    if op in COMPARE or op in LOGICAL or op == "Not":
        return Op(op, tuple(term(g, x, depth + 1, False, memo) for x in ins))
    raise NotAMaskGrid(f"{op} {node.name!r} is not followed ({t!r})")


def _broadcast(*shapes):
    """Numpy broadcasting of dims that are ints, names (``known_size``) or None (unknown); None where the rank
    is unknown. An axis is 1 where every operand's is, the one size the others share otherwise, else None."""
    if any(sh is None for sh in shapes):
        return None
    rank = max(len(sh) for sh in shapes)
    out = []
    for k in range(rank):
        sizes = [sh[len(sh) - rank + k] for sh in shapes if len(sh) - rank + k >= 0]
        big = [d for d in sizes if d != 1]
        out.append(1 if not big else big[0] if all(same_size(d, big[0]) for d in big) else None)
    return tuple(out)


def _target_dims(g, target: str):
    """The sizes an Expand's 1-D target asks for, entry by entry (``dim_source``), None where unknown."""
    n = vector_length(g, target)
    return None if n is None else tuple(entry_size(g, dim_source(g, target, k)) for k in range(n))


def dims(g, t: str, depth: int = 0, memo: dict | None = None):
    """The dims of ``t`` in the mask's cone, as its ops compute them from their inputs' (so a Range's length is
    the dim its bound reads, where onnx's inference names it afresh), each completed by the IR's where unknown."""
    memo = {} if memo is None else memo
    if t not in memo:
        memo[t] = _dims(g, t, depth, memo)
    return memo[t]


def _dims(g, t: str, depth: int, memo: dict):
    ir = g.shape(t)
    ir = None if ir is None else tuple(d if known_size(d) else None for d in ir)
    node = g.producer(t) if depth <= MAX_DEPTH else None
    mine = None
    if node is not None and node.domain in ("", "ai.onnx") and g.constant_value(t) is None:
        op, ins = node.op_type, node.inputs
        if op == "Range":
            mine = (entry_size(g, dim_source(g, ins[1], 0)),)
        elif op == "Unsqueeze":
            inner, axes = dims(g, ins[0], depth + 1, memo), _ints(g, ins[1]) if len(ins) > 1 else node.attr("axes")
            if inner is not None and axes is not None:
                out_rank = len(inner) + len(axes)
                new = {a + out_rank if a < 0 else a for a in axes}
                it = iter(inner)
                mine = tuple(1 if q in new else next(it) for q in range(out_rank))
        elif op == "Expand":
            mine = _broadcast(dims(g, ins[0], depth + 1, memo), _target_dims(g, ins[1]))
        elif op in COMPARE or op in LOGICAL or op in ("Not", "Where", "Cast", "Identity"):
            mine = _broadcast(*(dims(g, x, depth + 1, memo) for x in ins))
    if mine is None or ir is None or len(ir) != len(mine):
        return mine if mine is not None else ir
    return tuple(m if m is not None else i for m, i in zip(mine, ir))


def _kind(e, memo: dict | None = None) -> str:
    """'P' a raw position, 'B' a value that depends on positions only through comparisons of positions with
    positions, 'F' a value that depends on none; raises NotAMaskGrid when a position meets anything else.
    (``memo``, by node identity: an expression shares its subexpressions, as the graph shares tensors.)"""
    memo = {} if memo is None else memo
    if id(e) in memo:
        return memo[id(e)]
    if isinstance(e, Const):
        kind = "F"
    elif isinstance(e, Index):
        kind = "P"
    elif isinstance(e, Table):
        raise NotAMaskGrid("a constant table")
    else:
        kinds = [_kind(a, memo) for a in e.args]
        if e.name in COMPARE and kinds == ["P", "P"]:
            kind = "B"
        elif e.name == "Cast" and kinds == ["P"] and e.to == TensorProto.INT64:
            kind = "P"
        elif "P" in kinds:
            raise NotAMaskGrid(f"a position goes into {e.name} with something other than a position")
        else:
            kind = "B" if "B" in kinds else "F"
    memo[id(e)] = kind
    return kind


def _leaves(e, kind: type) -> list:
    """The leaves of expression ``e`` of type ``kind`` (Index or Table), each shared subexpression once."""
    found, seen, todo = [], set(), [e]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, kind):
            found.append(x)
        elif isinstance(x, Op):
            todo.extend(x.args)
    return found


def _table_rows(arr: np.ndarray) -> np.ndarray:
    """The table's [rows, cols], the same for every leading entry (else NotAMaskGrid)."""
    arr = arr.reshape((1,) * (2 - arr.ndim) + arr.shape) if arr.ndim < 2 else arr
    lead = arr.reshape((-1,) + arr.shape[-2:])
    if not all(np.array_equal(lead[0], x) for x in lead[1:]):
        raise NotAMaskGrid("a constant table differs across its leading axes")
    return lead[0]


def _evaluate(e, rows: np.ndarray, cols: np.ndarray, memo: dict | None = None):
    memo = {} if memo is None else memo
    if id(e) not in memo:
        memo[id(e)] = _evaluate_node(e, rows, cols, memo)
    return memo[id(e)]


def _evaluate_node(e, rows: np.ndarray, cols: np.ndarray, memo: dict):
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Index):
        return rows if e.axis == -2 else cols
    if isinstance(e, Table):
        sub = _table_rows(e.array)
        return sub[rows if sub.shape[0] > 1 else 0 * rows, cols if sub.shape[1] > 1 else 0 * cols]
    args = [_evaluate(a, rows, cols, memo) for a in e.args]
    if e.name in COMPARE:
        return COMPARE[e.name](*args)
    if e.name in LOGICAL:
        return LOGICAL[e.name](*args)
    if e.name == "Not":
        return np.logical_not(args[0])
    if e.name == "Where":
        return np.where(*args)
    return np.asarray(args[0]).astype(helper.tensor_dtype_to_np_dtype(e.to))


def fits_scores(shape, scores) -> str | None:
    """None where a mask of dims ``shape`` adds to scores of dims ``scores`` ([..., Sq, Skv]: ints, names or None)
    without growing them: each of its dims proven the scores' or 1 (the query and key axes: the scores'), and no
    more axes than they have. A mask that broadcast the scores up (a [S, S] mask on one query row, a batch of 2 on a
    batch of 1) would change the output's shape, which causal=1 does not; else the reason."""
    if shape is None or scores is None or len(shape) < 2 or len(shape) > len(scores):
        return f"its dims {shape} are not proven to fit the attention's scores {scores}"
    for k in range(1, len(shape) + 1):
        d, want = shape[-k], scores[-k]
        if not same_size(d, want) and not (k > 2 and d == 1):
            return f"its dims {list(shape)} are not proven to fit the attention's scores {list(scores)}"
    return None


def mask_grid(g, mask: str, scores: Callable[[], tuple]) -> np.ndarray:
    """The values of ``mask`` on a grid that decides every position of its attention (``scores()``: the dims of
    the attention's scores, [..., Sq, Skv], ints, names or None): 3 x 3 where its expression depends on positions
    only through comparisons with each other, else its whole [Sq, Skv] (integer sizes). Raises ``NotAMaskGrid``
    with the reason otherwise. Its dims must fit the scores (``fits_scores``), and each Range's length must be the
    size of the axis it indexes, so a position is never a broadcast copy of position 0."""
    memo: dict = {}
    e = term(g, mask, memo=memo)
    for ix in _leaves(e, Index):
        if ix.axis not in (-2, -1):
            raise NotAMaskGrid(f"it reads the position on axis {ix.axis}, not only the query's and the key's")
    dim_memo: dict = {}
    shape = dims(g, mask, memo=dim_memo)
    why = fits_scores(shape, scores())
    if why:
        raise NotAMaskGrid(why)
    for ix in _leaves(e, Index):
        length = (dims(g, ix.range, memo=dim_memo) or (None,))[0]
        if not same_size(length, shape[ix.axis]):
            raise NotAMaskGrid(f"a Range of length {length} indexes an axis of size {shape[ix.axis]}")
    try:
        _kind(e)
        n, m = ORDER_GRID, ORDER_GRID
    except NotAMaskGrid as why:
        n, m = shape[-2:]
        if not (isinstance(n, int) and isinstance(m, int)) or n * m > MAX_CELLS:
            raise NotAMaskGrid(f"{why} with dims [{n}, {m}] not proven small integers") from None
        for tab in _leaves(e, Table):
            a, b = _table_rows(tab.array).shape
            if a not in (1, n) or b not in (1, m):
                raise NotAMaskGrid(f"a constant table of [{a}, {b}] does not cover [{n}, {m}]")
    rows, cols = np.arange(n)[:, None], np.arange(m)[None, :]
    dtype = helper.tensor_dtype_to_np_dtype(g.dtype(mask)) if g.dtype(mask) else None
    out = np.broadcast_to(np.asarray(_evaluate(e, rows, cols)), (n, m))
    return out.astype(dtype) if dtype is not None else out
