"""graphopt.Attention: ``Y = softmax(Q @ K^T * scale [+ mask] [causal]) @ V`` (scaled dot-product attention).

Layout: Q is [..., Sq, D] (typically [B, H, Sq, D]), V is [..., Skv, Dv]. K is [..., Skv, D], or,
with ``k_transposed=1``, already transposed as [..., D, Skv]: exactly what the score MatMul of an
export reads, so a rule hands it over without touching the Transpose that made it.

Masks (``mask_kind``): ``"none"``; ``"additive"`` (a float tensor broadcast-added to the scores,
e.g. BERT's extended mask); ``"bool"`` (True = attend: the scores get ``Where(mask, 0, mask_value)``
added, as torch's SDPA export writes it, ``mask_value`` defaulting to -inf). ``causal=1`` masks
key j > query i (top-left aligned, as torch's ``is_causal``). ``nan_to_zero=1`` turns the NaN
probabilities of fully masked rows into 0 (the IsNaN/Where torch exports put after the Softmax).
``num_heads`` is informational (0 = unknown) for kernels; the body does not use it.

``qkv_bshd=1``: Q, K and V come as ``[B, S, H, D]`` (the head split's Reshape output, before the
Transpose an export puts after it; K then never transposed, ``k_transposed=0``), rank 4; Y stays
``[B, H, Sq, Dv]``. The kernels read the heads with strides, so the three Transposes that made
``[B, H, S, D]`` copies go (rule ``attention_qkv_bshd``). Lowerings see the logical ``[B, H, S, D]``
shapes through :func:`operands` and say whether they read this layout (``bshd_ok``).
``y_bshd=1``: Y is written as ``[B, Sq, H, Dv]``, what the Transpose an export puts after the
attention makes of it (rule ``attention_y_bshd``); the same lowerings write it.
``qkv_packed=1`` (with ``qkv_bshd=1``): self-attention whose Q, K and V are one tensor
``[B, S, 3, H, D]`` given as input Q (K and V absent): the output of one projection GEMM viewed
with the heads split, so neither the Split of a packed projection (GPT-2's ``c_attn``) nor three
separate projections (BERT's query/key/value: rule ``attention_qkv_packed_gemms`` concatenates their
weights) copy anything. The lowerings read Q, K and V at offsets 0, H*D and 2*H*D of each row of
3*H*D elements.
``kv_groups=g`` (grouped-query attention; rank 4, ``qkv_bshd=0``): K and V have ``H / g`` heads, Q has H,
and head h of Q reads head ``h // g`` of K and V, exactly what repeat_kv's
``Reshape(Expand(Unsqueeze(K, 2)))`` made of them (rule ``attention_grouped_kv``), so neither repeated
copy is written. cuDNN's SDPA reads the grouped heads as they are; a lowering that does not, repeats
them into its workspace first (:func:`ungrouped` is the signature it then runs).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from graphopt.errors import RuleError, TuningError
from graphopt.ops._body import Body, dtype_token
from graphopt.ops.activations import f32
from graphopt.ops.layer_norm import flag_key, parse_flags
from graphopt.ops.schema import DOMAIN, OpSchema

NAME = "Attention"
INPUTS = (("Q", False), ("K", True), ("V", True), ("mask", True))  # K, V absent exactly with qkv_packed=1
MASK_KINDS = ("none", "additive", "bool")
ATTRIBUTES: dict[str, tuple[type, Any]] = {
    "scale": (float, None),  # absent: 1 / sqrt(D)
    "causal": (int, 0),
    "mask_kind": (str, "none"),
    "mask_value": (float, None),  # bool masks: the value added where the mask is False (absent: -inf)
    "nan_to_zero": (int, 0),
    "k_transposed": (int, 0),
    "qkv_bshd": (int, 0),
    "y_bshd": (int, 0),
    "qkv_packed": (int, 0),
    "num_heads": (int, 0),
    "kv_groups": (int, 1),  # Q heads per K/V head (grouped-query attention); 1: as many K/V heads as Q's
    "lowering": (str, None),
    "lowering_params": (str, None),
    "lowering_buckets": (str, None),  # JSON, see graphopt.tune.buckets
}
FLAG_ORDER = ("kt", "add", "bool", "mv", "causal", "nz", "scale", "bshd", "ybshd", "pk", "gq")
MIN_OPSET = 13  # Softmax over one axis (opset < 13 coerces to 2-D)

DOC = ("graphopt.Attention: Y = softmax(Q @ K^T * scale [+ mask] [causal mask]) @ V; mask_kind none | additive "
       "| bool (True = attend); k_transposed=1 takes K as [..., D, Skv]; nan_to_zero=1 zeroes fully masked rows; "
       "qkv_bshd=1 takes Q, K, V as [B, S, H, D]; y_bshd=1 writes Y as [B, Sq, H, Dv]; qkv_packed=1 takes them as one "
       "[B, S, 3, H, D] tensor (input Q; K and V absent); kv_groups=g: K and V have H / g heads, Q head h reads "
       "K/V head h // g.")


def qkv_bshd(sig) -> bool:
    """Whether the signature's Q, K and V are ``[B, S, H, D]`` (``qkv_bshd=1``)."""
    return bool(sig.attr("qkv_bshd", 0))


def kv_groups(sig) -> int:
    """Q heads per K/V head of the signature (``kv_groups``; 1 unless grouped-query attention)."""
    return int(sig.attr("kv_groups", 1) or 1)


def ungrouped(sig):
    """A grouped-query signature (``kv_groups`` > 1) as the plain one a lowering runs after repeating
    each K/V head ``kv_groups`` times: K and V with Q's heads, no ``kv_groups``. Any other: itself."""
    g = kv_groups(sig)
    if g == 1:
        return sig
    shapes = list(sig.input_shapes)
    for i in (1, 2):
        s = shapes[i]
        if s is not None and len(s) == 4:
            shapes[i] = (s[0], s[1] * g, s[2], s[3])
    attrs = {k: v for k, v in sig.attrs if k != "kv_groups"}
    return type(sig).make(sig.op, shapes, sig.dtypes, attrs, sig.layout)  # (ops sits below the lowering layer)


def qkv_packed(sig) -> bool:
    """Whether the signature's Q, K and V are one ``[B, S, 3, H, D]`` tensor (``qkv_packed=1``)."""
    return bool(sig.attr("qkv_packed", 0))


def unpacked_shape(shape: tuple) -> tuple:
    """``[B, S, 3, H, D]`` (a packed Q, K, V) -> the ``[B, S, H, D]`` of each of them."""
    return (shape[0], shape[1], shape[3], shape[4])


def swap_heads(shape: tuple) -> tuple:
    """``[B, H, S, D]`` <-> ``[B, S, H, D]``: axes 1 and 2 of a rank-4 shape swapped."""
    return (shape[0], shape[2], shape[1], shape[3])


def logical(shape: tuple, sig) -> tuple:
    """A Q, K or V shape as ``[B, H, S, D]``: axes 1 and 2 swapped where the signature gives them as
    ``[B, S, H, D]`` (``qkv_bshd=1``, rank 4), else as it is."""
    return swap_heads(shape) if shape is not None and len(shape) == 4 and qkv_bshd(sig) else shape


def operands(sig, who: str, bshd_ok: bool = False, groups_ok: bool = False) -> tuple[tuple, tuple, tuple, tuple | None, list[str]]:
    """(Q, K, V, mask shapes, dtypes) of an Attention signature, after the checks every lowering
    shares: the op, known Q/K/V shapes of one rank from 2 to 4 ([B, H, S, D]) and no empty dim.
    With ``kv_groups`` = g > 1 K and V are rank 4 with Q's batch and H / g heads; a lowering that cannot
    read them so (``groups_ok`` False) is refused (it runs :func:`ungrouped` instead).
    With ``qkv_bshd=1`` the shapes returned are the logical ``[B, H, S, D]`` ones (axes 1 and 2 of the
    given ``[B, S, H, D]`` swapped), and a lowering that cannot read that layout (``bshd_ok`` False) is
    refused. A refusal is a ``TuningError`` that starts with ``who`` (the lowering family's name)."""
    if sig.op != "Attention":
        raise TuningError(f"op {sig.op} is not Attention")
    shapes = list(sig.input_shapes) + [None] * (4 - len(sig.input_shapes))
    dtypes = list(sig.dtypes) + [""] * (4 - len(sig.dtypes))
    if qkv_packed(sig):  # one [B, S, 3, H, D] tensor: Q, K and V each its [B, S, H, D] third
        p = shapes[0]
        if p is None or len(p) != 5 or p[2] != 3:
            raise TuningError(f"{who}: qkv_packed=1 needs Q as [B, S, 3, H, D], got {p}")
        shapes[:3] = [unpacked_shape(p)] * 3
        dtypes[1:3] = [dtypes[0]] * 2
    q, k, v, m = shapes[:4]
    if q is None or k is None or v is None:
        raise TuningError(f"{who} needs known Q, K and V shapes")
    if not (2 <= len(q) <= 4 and len(k) == len(q) and len(v) == len(q)):
        raise TuningError(f"{who}: Q {q}, K {k}, V {v}: one rank from 2 to 4 ([B, H, S, D]) is supported")
    if min(q + k + v) < 1:
        raise TuningError(f"{who}: Q {q}, K {k}, V {v} has an empty dim")
    if sig.attr("y_bshd", 0) and (not bshd_ok or len(q) != 4):
        raise TuningError(f"{who}: y_bshd=1 (Y as [B, Sq, H, Dv], rank 4) is not written by this lowering"
                          if not bshd_ok else f"{who}: y_bshd=1 needs rank-4 Q, K, V, got Q {q}")
    g = kv_groups(sig)
    if g > 1:
        if not groups_ok:
            raise TuningError(f"{who}: kv_groups={g} (K and V with H / {g} heads) is not read by this lowering")
        if len(q) != 4 or q[0] != k[0] or q[0] != v[0] or k[1] != v[1] or k[1] * g != q[1]:
            raise TuningError(f"{who}: kv_groups={g} needs rank-4 Q [B, H, S, D] and K, V [B, H / {g}, S, D], "
                              f"got Q {q}, K {k}, V {v}")
    if qkv_bshd(sig):
        if not bshd_ok:
            raise TuningError(f"{who}: qkv_bshd=1 (Q, K, V as [B, S, H, D]) is not read by this lowering")
        if len(q) != 4:
            raise TuningError(f"{who}: qkv_bshd=1 needs rank-4 Q, K, V, got Q {q}")
        q, k, v = (logical(t, sig) for t in (q, k, v))
    return q, k, v, m, dtypes


def _given(present: list[bool], i: int) -> bool:
    return i < len(present) and present[i]


def _check(attrs: dict, present: list[bool]) -> str | None:
    kind = attrs.get("mask_kind", "none")
    if kind not in MASK_KINDS:
        return f"mask_kind={kind!r} must be one of {', '.join(MASK_KINDS)}"
    if (kind != "none") != _given(present, 3):
        return (f"mask_kind={kind!r} but the mask input is {'present' if _given(present, 3) else 'absent'}; "
                "give a mask exactly when mask_kind is additive or bool")
    if attrs.get("mask_value") is not None and kind != "bool":
        return "mask_value only applies to mask_kind='bool'"
    for name in ("causal", "nan_to_zero", "k_transposed", "qkv_bshd", "y_bshd", "qkv_packed"):
        if attrs.get(name, 0) not in (0, 1):
            return f"{name}={attrs[name]} must be 0 or 1"
    packed = attrs.get("qkv_packed", 0)
    if packed and not attrs.get("qkv_bshd", 0):
        return "qkv_packed=1 reads Q, K, V as [B, S, H, D] parts of one tensor: qkv_bshd must be 1"
    if packed and (_given(present, 1) or _given(present, 2)):
        return "qkv_packed=1 takes Q, K and V as one [B, S, 3, H, D] input Q: leave K and V absent"
    if not packed and not (_given(present, 1) and _given(present, 2)):
        return "K and V are required (only qkv_packed=1 leaves them absent)"
    g = attrs.get("kv_groups", 1)
    if not isinstance(g, int) or g < 1:
        return f"kv_groups={g} must be an integer >= 1 (Q heads per K/V head)"
    if g > 1 and attrs.get("qkv_bshd", 0):
        return "kv_groups > 1 takes Q, K, V as [B, H, S, D]: qkv_bshd must be 0"
    if attrs.get("qkv_bshd", 0) and attrs.get("k_transposed", 0):
        return "qkv_bshd=1 takes K as [B, Skv, H, D]: k_transposed must be 0"
    scale = attrs.get("scale")
    if scale is not None and not math.isfinite(scale):
        return f"scale={scale} must be finite"
    if attrs.get("num_heads", 0) < 0:
        return f"num_heads={attrs['num_heads']} must be >= 0 (0 = unknown)"
    return None


def _flags(attrs: dict) -> list[str]:
    kind = attrs.get("mask_kind", "none")
    flags = ["kt"] if attrs.get("k_transposed", 0) else []
    flags += {"none": [], "additive": ["add"], "bool": ["bool"]}[kind]
    flags += ["mv"] if attrs.get("mask_value") is not None else []
    flags += ["causal"] if attrs.get("causal", 0) else []
    flags += ["nz"] if attrs.get("nan_to_zero", 0) else []
    flags += ["scale"] if attrs.get("scale") is not None else []
    flags += ["bshd"] if attrs.get("qkv_bshd", 0) else []
    flags += ["ybshd"] if attrs.get("y_bshd", 0) else []
    flags += ["pk"] if attrs.get("qkv_packed", 0) else []
    flags += ["gq"] if attrs.get("kv_groups", 1) > 1 else []
    return flags


def _overload(attrs: dict, present: list[bool], dtype: int | None) -> str:
    return flag_key(_flags(attrs), dtype_token(dtype))


def _int_scalar(b: Body, value: int) -> str:
    return b.node("Constant", [], value=helper.make_tensor("value", TensorProto.INT64, [], [value]))


def _causal(b: Body, scores: str) -> str:
    """Where(key index > query index, -inf, scores) with Shape/Gather/Range (opset >= 11)."""
    shape = b.node("Shape", [scores])
    sq = b.node("Gather", [shape, _int_scalar(b, -2)], axis=0)
    skv = b.node("Gather", [shape, _int_scalar(b, -1)], axis=0)
    zero, one = _int_scalar(b, 0), _int_scalar(b, 1)
    rows = b.node("Unsqueeze", [b.node("Range", [zero, sq, one]), b.node(
        "Constant", [], value=helper.make_tensor("value", TensorProto.INT64, [1], [1]))])
    cols = b.node("Range", [zero, skv, one])
    future = b.node("Greater", [cols, rows])  # [Sq, Skv]
    return b.node("Where", [future, b.const(-math.inf, scores), scores])


def _shape_part(b: Body, shape: str, axes: list[int]) -> str:
    """The given axes of a shape tensor (int64 [len(axes)])."""
    idx = b.node("Constant", [], value=helper.make_tensor("value", TensorProto.INT64, [len(axes)], axes))
    return b.node("Gather", [shape, idx], axis=0)


def _repeat_heads(b: Body, t: str, q: str) -> str:
    """K or V [B, Hkv, ., .] with each head repeated H / Hkv times (H: Q's heads), as repeat_kv writes it:
    Reshape(Expand(Unsqueeze(t, 2), [B, Hkv, H / Hkv, ., .]), [B, H, ., .])."""
    st, sq = b.node("Shape", [t]), b.node("Shape", [q])
    heads = _shape_part(b, sq, [1])
    groups = b.node("Div", [heads, _shape_part(b, st, [1])])
    lead, rest = _shape_part(b, st, [0, 1]), _shape_part(b, st, [2, 3])
    two = b.node("Constant", [], value=helper.make_tensor("value", TensorProto.INT64, [1], [2]))
    expanded = b.node("Expand", [b.node("Unsqueeze", [t, two]), b.node("Concat", [lead, groups, rest], axis=0)])
    return b.node("Reshape", [expanded, b.node("Concat", [_shape_part(b, st, [0]), heads, rest], axis=0)])


def _body(overload: str, opset: int):
    if opset < MIN_OPSET:
        raise RuleError(f"graphopt.{NAME}: function bodies need default-domain opset >= {MIN_OPSET} "
                        f"(Softmax over the last axis), got {opset}")
    flags, dtype = parse_flags(NAME, overload, FLAG_ORDER)
    if "add" in flags and "bool" in flags or "mv" in flags and "bool" not in flags:
        raise RuleError(f"graphopt.{NAME}: malformed overload key {overload!r}: at most one of add/bool, "
                        "and mv only with bool")
    if "bshd" in flags and ("kt" in flags or "gq" in flags) or "pk" in flags and "bshd" not in flags:
        raise RuleError(f"graphopt.{NAME}: malformed overload key {overload!r}: bshd takes K untransposed, "
                        "pk comes with bshd, gq without it")
    b = Body(opset, dtype)
    qkv = ("Q", "K", "V")
    if "pk" in flags:  # one [B, S, 3, H, D] input: its thirds (Gather on axis 2) are Q, K, V as [B, S, H, D]
        qkv = tuple(b.node("Gather", ["Q", _int_scalar(b, i)], axis=2) for i in range(3))
    # [B, S, H, D] inputs (qkv_bshd=1) become [B, H, S, D] first, as the Transposes the rule removed made them
    q_in, k_in, v_in = (b.node("Transpose", [t], perm=[0, 2, 1, 3]) if "bshd" in flags else t for t in qkv)
    if "gq" in flags:  # K and V with H / g heads: each repeated g times, as the nodes the rule replaced did
        k_in, v_in = _repeat_heads(b, k_in, q_in), _repeat_heads(b, v_in, q_in)
    # K^T: given as is (k_transposed=1), else the last two axes of a rank-4 [B, H, Skv, D] K swapped
    # (Transpose needs the rank in its perm).
    kt = k_in if "kt" in flags else b.node("Transpose", [k_in], perm=[0, 1, 3, 2])
    if "scale" in flags:
        q = b.node("Mul", [q_in, b.const_ref("scale", "Q")])
    else:  # 1 / sqrt(D) from Q's last dim at run time
        d = b.node("Cast", [b.node("Gather", [b.node("Shape", ["Q"]), _int_scalar(b, -1)], axis=0)],
                   to=TensorProto.FLOAT)
        inv = b.node("Reciprocal", [b.node("Sqrt", [d])])
        q = b.node("Mul", [q_in, b._cast_like(inv, "Q")])
    scores = b.node("MatMul", [q, kt])
    if "add" in flags:
        scores = b.node("Add", [scores, "mask"])
    elif "bool" in flags:
        value = b.const_ref("mask_value", "Q") if "mv" in flags else b.const(-math.inf, "Q")
        scores = b.node("Add", [scores, b.node("Where", ["mask", b.const(0.0, "Q"), value])])
    if "causal" in flags:
        scores = _causal(b, scores)
    p = b.node("Softmax", [scores], axis=-1)
    if "nz" in flags:
        p = b.node("Where", [b.node("IsNaN", [p]), b.const(0.0, "Q"), p])
    if "ybshd" in flags:  # [B, H, Sq, Dv] -> [B, Sq, H, Dv], the Transpose the rule removed
        b.node("Transpose", [b.node("MatMul", [p, v_in])], "Y", perm=[0, 2, 1, 3])
    else:
        b.node("MatMul", [p, v_in], "Y")
    return b.function(NAME, overload, [n for n, _ in INPUTS], ["Y"], sorted(ATTRIBUTES),
                      f"{DOC} Variant {overload!r}, opset {opset}.", DOMAIN)


def _reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    q_in, k_in, v_in, mask = inputs
    if attrs.get("qkv_packed", 0):
        packed = np.asarray(q_in)
        if packed.ndim != 5 or packed.shape[2] != 3:
            raise RuleError(f"graphopt.Attention reference: qkv_packed=1 needs Q as [B, S, 3, H, D], got {packed.shape}")
        q_in, k_in, v_in = packed[:, :, 0], packed[:, :, 1], packed[:, :, 2]
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q_in, k_in, v_in))
    if attrs.get("qkv_bshd", 0):
        if q.ndim != 4:
            raise RuleError(f"graphopt.Attention reference: qkv_bshd=1 needs rank-4 Q, K, V, got Q {q.shape}")
        q, k, v = (np.swapaxes(t, 1, 2) for t in (q, k, v))
    g = int(attrs.get("kv_groups", 1) or 1)
    if g > 1:  # grouped-query: head h of Q reads head h // g of K and V
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or k.shape[1] * g != q.shape[1] or v.shape[1] != k.shape[1]:
            raise RuleError(f"graphopt.Attention reference: kv_groups={g} needs Q [B, H, S, D] and K, V with H / {g} "
                            f"heads, got Q {q.shape}, K {k.shape}, V {v.shape}")
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    kt = k if attrs.get("k_transposed", 0) else np.swapaxes(k, -1, -2)
    if q.shape[-1] != kt.shape[-2]:
        raise RuleError(f"graphopt.Attention reference: Q {q.shape} and K^T {kt.shape} disagree on the head dim")
    scale = f32(attrs["scale"]) if attrs.get("scale") is not None else 1.0 / math.sqrt(q.shape[-1])
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.matmul(q * scale, kt)
        kind = attrs.get("mask_kind", "none")
        if kind == "additive":
            s = s + np.asarray(mask, dtype=np.float64)
        elif kind == "bool":
            mv = f32(attrs["mask_value"]) if attrs.get("mask_value") is not None else -math.inf
            s = s + np.where(np.asarray(mask, dtype=bool), 0.0, mv)
        if attrs.get("causal", 0):
            sq, skv = s.shape[-2:]
            s = np.where(np.arange(skv)[None, :] > np.arange(sq)[:, None], -math.inf, s)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - m)
        p = e / e.sum(axis=-1, keepdims=True)  # fully masked rows: NaN, as onnxruntime's Softmax
        if attrs.get("nan_to_zero", 0):
            p = np.where(np.isnan(p), 0.0, p)
        y = np.matmul(p, v)
    if attrs.get("y_bshd", 0):
        if y.ndim != 4:
            raise RuleError(f"graphopt.Attention reference: y_bshd=1 needs a rank-4 Y, got {y.shape}")
        y = np.swapaxes(y, 1, 2)
    return [y.astype(np.asarray(q_in).dtype)]


def _output_shapes(shapes: list, attrs: dict) -> list:
    """Y is Q's shape with V's last dim: [..., Sq, Dv] (batch dims broadcast); with qkv_bshd=1 Q and V
    are [B, S, H, D] and Y is [B, H, Sq, Dv]; with qkv_packed=1 Q is [B, S, 3, H, D] and stands for all three;
    with kv_groups > 1 Y has Q's heads."""
    q, v = shapes[0], shapes[2]
    if attrs.get("qkv_packed", 0) and len(q) == 5:
        q = v = unpacked_shape(q)
    if attrs.get("qkv_bshd", 0) and len(q) == 4 and len(v) == 4:
        q, v = swap_heads(q), swap_heads(v)
    if attrs.get("kv_groups", 1) > 1 and len(q) == 4 and len(v) == 4:  # V has H / kv_groups heads
        v = tuple(q[:2]) + tuple(v[2:])
    batch = np.broadcast_shapes(tuple(q[:-2]), tuple(v[:-2]))
    y = tuple(batch) + (q[-2], v[-1])
    return [swap_heads(y) if attrs.get("y_bshd", 0) and len(y) == 4 else y]


def _check_input(i: int, shape: tuple, dtype: str, attrs, rng) -> np.ndarray | None:
    """Q, K, V: N(0, 1). The mask on its own terms: additive N(0, 1) of the data dtype, or bool with
    ~70% True and key 0 always attended (no fully masked row, whose NaN output a norm cannot compare)."""
    if i != 3:
        return None
    kind = attrs.get("mask_kind", "none")
    if (kind.decode() if isinstance(kind, bytes) else kind) == "bool":
        m = rng.random(shape) < 0.7
        m[..., 0] = True
        return m
    return rng.standard_normal(shape).astype(dtype)


SCHEMA = OpSchema(name=NAME, inputs=INPUTS, attributes=ATTRIBUTES, doc=DOC, _check=_check,
                  _overload=_overload, _needs_dtype=lambda a, p: True, _body=_body, _reference=_reference, _output_shapes=_output_shapes,
                  _check_input=_check_input, host_check_inputs=(3,), data_dtype_input=0)
