"""NumPy evaluation of the small shape-arithmetic ops a dynamic export is full of (private).

``fold_constants`` evaluates one node at a time; through ``graphopt.passes._evaluate`` that costs
an ONNX shape inference and an onnxruntime session per node (about 0.4 ms), which dominates folding
a 20k-node TorchScript export's ``Shape -> Gather -> Unsqueeze -> Concat`` arithmetic (thousands of
nodes once the input sizes are concrete). These ops only move values around (Identity and Reshape
too), select (Where), compare integers (Equal), do small integer arithmetic that cannot overflow (Add,
Sub, Mul) or fill a small tensor (ConstantOfShape), so NumPy gives exactly what onnxruntime computes;
an optimize run of GPT-2 20k then never imports onnxruntime. ``evaluate_shape_op`` answers ``None``
for anything outside the narrow cases it handles (another op, a legacy opset form, an index out of
range, a duplicate axis, a large input...), and the caller then takes the general path, which
decides as before.
"""

from __future__ import annotations

import math

import numpy as np

from graphopt.ir import Node

# Same limit as _evaluate._EMBED_ELEMENTS: with every input this small, the general path's shape
# inference sees every value, so it would fold the node too and compute the same result.
MAX_INPUT_ELEMENTS = 4096
_INT_INDEX = (np.dtype(np.int32), np.dtype(np.int64))
_DTYPES = {np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                 np.uint64, np.float16, np.float32, np.float64)}


def _axes(values, rank: int) -> list[int] | None:
    """Normalized axes, or None when one is out of range or repeated."""
    out = []
    for a in (int(v) for v in np.asarray(values).reshape(-1)):
        if not -rank <= a < rank:
            return None
        out.append(a + rank if a < 0 else a)
    return out if len(set(out)) == len(out) else None


def _unsqueeze(node: Node, ins: list, opset: int):
    if opset < 13 or len(ins) != 2 or ins[1].dtype != np.int64:
        return None
    axes = _axes(ins[1], ins[0].ndim + ins[1].size)
    return None if axes is None else np.expand_dims(ins[0], tuple(axes))


def _squeeze(node: Node, ins: list, opset: int):
    if opset < 13 or len(ins) != 2 or ins[1].dtype != np.int64:
        return None  # without axes: every 1-dim goes; left to the general path
    axes = _axes(ins[1], ins[0].ndim)
    if axes is None or any(ins[0].shape[a] != 1 for a in axes):
        return None
    return np.squeeze(ins[0], tuple(axes))


def _gather(node: Node, ins: list, opset: int):
    data, idx = ins
    if idx.dtype not in _INT_INDEX or data.ndim < 1:
        return None
    axis = _axes([node.attr("axis", 0)], data.ndim)
    if axis is None:
        return None
    n = data.shape[axis[0]]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        return None
    return np.take(data, np.where(idx < 0, idx + n, idx), axis=axis[0])


def _concat(node: Node, ins: list, opset: int):
    if not ins or not node.has_attr("axis") or len({a.dtype for a in ins}) != 1 or len({a.ndim for a in ins}) != 1:
        return None
    rank = ins[0].ndim
    axis = _axes([node.attr("axis")], rank) if rank else None
    if axis is None:
        return None
    rest = {a.shape[: axis[0]] + a.shape[axis[0] + 1:] for a in ins}
    return np.concatenate(ins, axis=axis[0]) if len(rest) == 1 else None


def _slice(node: Node, ins: list, opset: int):
    if opset < 10 or not 3 <= len(ins) <= 5 or any(a.dtype not in _INT_INDEX or a.ndim != 1 for a in ins[1:]):
        return None
    data = ins[0]
    starts, ends = ins[1], ins[2]
    axes = _axes(ins[3], data.ndim) if len(ins) > 3 else list(range(len(starts)))
    steps = ins[4] if len(ins) > 4 else np.ones(len(starts), np.int64)
    if axes is None or not len(starts) == len(ends) == len(axes) == len(steps) or data.ndim < 1:
        return None
    index = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, (int(v) for v in starts), (int(v) for v in ends), (int(v) for v in steps)):
        d = data.shape[a]
        if st == 0:
            return None
        s, e = s + d if s < 0 else s, e + d if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
        else:
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
        index[a] = slice(s, e if e >= 0 else None, st)
    return data[tuple(index)]


def _identity(node: Node, ins: list, opset: int):
    # A TorchScript export passes each small weight through an Identity; the tuning-size shapes fold
    # the small inputs of the nodes they feed (600-700 of them on the 20k-node GPT-2).
    return ins[0] if len(ins) == 1 else None


def _constant_of_shape(node: Node, ins: list, opset: int):
    # A fill, not integer arithmetic, but as exact: the one element of ``value`` (float32 0 without
    # it) repeated over the given dims. Small outputs only (the cap is checked before anything is
    # allocated); anything unusual (a negative dim, a shape that is not int64, a value that is not
    # one plain element) is left to the general path, which refuses or evaluates it as before.
    shape = ins[0]
    if opset < 9 or len(ins) != 1 or shape.dtype != np.int64 or shape.ndim != 1:
        return None
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims) or math.prod(dims) > MAX_INPUT_ELEMENTS:
        return None
    value = node.attr("value")
    if value is None:
        value = np.zeros(1, np.float32)
    if not isinstance(value, np.ndarray) or value.size != 1 or value.dtype not in _DTYPES:
        return None
    return np.full(dims, value.reshape(()), dtype=value.dtype)


def reshaped_dims(shape, target, allowzero: int) -> list[int] | None:
    """The output dims of ``Reshape(x of shape, target)`` by ONNX's rule: 0 copies x's dim (unless ``allowzero``),
    one -1 takes the rest; None for any target ONNX calls invalid (left to the general path)."""
    dims = [int(d) for d in target]
    if any(d < -1 for d in dims) or dims.count(-1) > 1 or (allowzero and 0 in dims and -1 in dims):
        return None
    if not allowzero:
        if any(d == 0 and i >= len(shape) for i, d in enumerate(dims)):
            return None
        dims = [shape[i] if d == 0 else d for i, d in enumerate(dims)]
    size = math.prod(shape)
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or size % known:
            return None
        dims[dims.index(-1)] = size // known
    return dims if math.prod(dims) == size else None


def _reshape(node: Node, ins: list, opset: int):
    # Pure data movement (row-major), with the dims ``reshaped_dims`` gives.
    if opset < 5 or len(ins) != 2 or ins[1].dtype != np.int64 or ins[1].ndim != 1:
        return None
    data = ins[0]
    dims = reshaped_dims(data.shape, ins[1], int(node.attr("allowzero", 0)) if opset >= 14 else 0)
    return None if dims is None else data.reshape(dims)


def _small_broadcast(ins: list) -> bool:
    """Whether the inputs broadcast together into at most MAX_INPUT_ELEMENTS elements (checked before
    computing: small inputs can broadcast into a large output, which the general path caps)."""
    try:
        return math.prod(np.broadcast_shapes(*(a.shape for a in ins))) <= MAX_INPUT_ELEMENTS
    except ValueError:  # they do not broadcast: the general path reports it
        return False


def _equal(node: Node, ins: list, opset: int):
    # integers and booleans compare exactly (floats are left to onnxruntime)
    if opset < 11 or len(ins) != 2 or ins[0].dtype != ins[1].dtype or ins[0].dtype.kind not in "biu":
        return None
    if not _small_broadcast(ins):
        return None
    return np.equal(ins[0], ins[1])


def _where(node: Node, ins: list, opset: int):
    # a selection: exact for every type; the three inputs broadcast as in NumPy
    if opset < 9 or len(ins) != 3 or ins[0].dtype != np.bool_ or ins[1].dtype != ins[2].dtype:
        return None
    if not _small_broadcast(ins):
        return None
    return np.where(ins[0], ins[1], ins[2])


#: Operands of integer Add/Sub/Mul below this magnitude cannot overflow int64, so NumPy's result is
#: the exact one onnxruntime computes (both broadcast the same way from opset 7).
_ARITHMETIC_BOUND = 2**31
_ARITHMETIC = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def _integer_arithmetic(node: Node, ins: list, opset: int):
    # Shape arithmetic (a dim times -1, an offset): int64 only; floats are left to onnxruntime.
    if opset < 7 or len(ins) != 2 or any(a.dtype != np.int64 for a in ins):
        return None
    if any(a.size and int(np.abs(a).max()) >= _ARITHMETIC_BOUND for a in ins) or not _small_broadcast(ins):
        return None
    return _ARITHMETIC[node.op_type](ins[0], ins[1])


_OPS = {"Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Gather": _gather, "Concat": _concat, "Slice": _slice,
        "ConstantOfShape": _constant_of_shape, "Add": _integer_arithmetic, "Sub": _integer_arithmetic,
        "Mul": _integer_arithmetic, "Reshape": _reshape, "Equal": _equal, "Where": _where, "Identity": _identity}


def evaluate_shape_op(node: Node, values: dict[str, np.ndarray], opset: int) -> list[np.ndarray] | None:
    """The node's single output computed with NumPy from ``values`` (input name -> array), or None
    (take the general path)."""
    fn = _OPS.get(node.op_type)
    if fn is None or node.domain != "" or len(node.outputs) != 1 or not node.outputs[0] or not all(node.inputs):
        return None
    inputs = [values.get(t) for t in node.inputs]
    if any(not isinstance(a, np.ndarray) or a.dtype not in _DTYPES or a.size > MAX_INPUT_ELEMENTS for a in inputs):
        return None
    try:
        out = fn(node, inputs, opset)
    except (ValueError, IndexError, TypeError):
        return None
    return None if out is None else [np.array(out, order="C")]  # a fresh array, 0-d kept 0-d
