"""What every Attention lowering starts from: the signature's integers (``attention_plan``), the operand
checks of a launch (``_arrays``, ``_mask_args``) and the shared set-up of the kernel families that live
in ``attention.cu`` (``_AttentionKernels``). The families: ``graphopt.kernels.attention_cublas``
(``cublas_softmax``) and ``graphopt.kernels.attention`` (``flash``, ``flash_mma``, and the candidate list).

Grouped-query attention (``kv_groups`` = g > 1: K and V with H / g heads): the kernels read K and V with
Q's heads, so every family runs the op's :func:`~graphopt.ops.attention.ungrouped` signature (its plan,
instance and checks) after repeating each K/V head g times into the lowering's workspace
(:func:`repeat_kv_heads`): the copies repeat_kv's Expand nodes made before the rule folded them, no more."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels.mma_args import ptr
from graphopt.kernels.source import get_kernel, source_hash
from graphopt.lowering.contract import Lowering, Signature, as_lowering, workspace_offset
from graphopt.ops.attention import kv_groups
from graphopt.ops.attention import operands as attention_operands
from graphopt.ops.attention import swap_heads, ungrouped

SUPPORTED_DTYPES = ("float16", "float32")
MASK_CODES = {"none": 0, "additive": 1, "bool": 2}


@dataclass(frozen=True)
class AttnPlan:
    B: int
    H: int
    Sq: int
    Skv: int
    D: int
    Dv: int
    kt: bool
    scale: float
    mask: int  # MASK_CODES value
    mask_shape: tuple[int, ...] | None
    mask_strides: tuple[int, int, int, int]  # elements over (b, h, i, j); 0 where it broadcasts
    mask_value: float
    causal: int
    nan_to_zero: int
    dtype: str
    out_shape: tuple[int, ...]
    bshd: int = 0  # Q, K, V given as [B, S, H, D] (qkv_bshd=1); the dims above are the logical ones
    ybshd: int = 0  # Y written as [B, Sq, H, Dv] (y_bshd=1)
    packed: int = 0  # Q, K, V the thirds of one [B, S, 3, H, D] input (qkv_packed=1, with bshd)

    @property
    def layout_flags(self) -> int:
        """The kernels' ``bshd`` argument: bit 0 Q/K/V as [B, S, H, D], bit 1 Y as [B, Sq, H, Dv], bit 2
        Q/K/V packed in one [B, S, 3, H, D] tensor."""
        return self.bshd | (self.ybshd << 1) | (self.packed << 2)

    @property
    def Z(self) -> int:
        return self.B * self.H


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _lead2(shape: tuple[int, ...]) -> tuple[int, int]:
    lead = (1, 1) + tuple(shape[:-2])
    return int(lead[-2]), int(lead[-1])


def _mask_strides(mshape: tuple[int, ...], full: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    if len(mshape) > 4:
        raise TuningError(f"Attention mask of rank {len(mshape)} (at most 4: [B, H, Sq, Skv])")
    m4 = (1,) * (4 - len(mshape)) + tuple(int(s) for s in mshape)
    strides, acc = [0, 0, 0, 0], 1
    for ax in range(3, -1, -1):
        if m4[ax] not in (1, full[ax]):
            raise TuningError(f"Attention mask {tuple(mshape)} does not broadcast to [B, H, Sq, Skv] = {list(full)}")
        strides[ax] = acc if m4[ax] != 1 else 0
        acc *= m4[ax]
    return tuple(strides)  # type: ignore[return-value]


def attention_plan(sig: Signature) -> AttnPlan:
    """The integers the kernels take, or ``TuningError`` saying why the signature is not supported. A
    grouped-query signature gives its :func:`ungrouped` plan: the kernels read the repeated heads."""
    sig = ungrouped(sig)
    q, k, v, m, dtypes = attention_operands(sig, "Attention", bshd_ok=True)
    if not (q[:-2] == k[:-2] == v[:-2]):
        raise TuningError(f"Attention Q {q}, K {k}, V {v} must share their leading (batch, head) dims "
                          "(K/V broadcast over heads is not supported)")
    dt = dtypes[0]
    if dt not in SUPPORTED_DTYPES or dtypes[1] != dt or dtypes[2] != dt:
        raise TuningError(f"Attention dtypes {dtypes[:3]} (Q, K, V of one of {', '.join(SUPPORTED_DTYPES)})")
    attrs = dict(sig.attrs)
    kt = bool(attrs.get("k_transposed", 0))
    Sq, D = int(q[-2]), int(q[-1])
    Skv, kd = (int(k[-1]), int(k[-2])) if kt else (int(k[-2]), int(k[-1]))
    if kd != D:
        raise TuningError(f"Attention K {k} (k_transposed={int(kt)}) and Q {q} disagree on the head dim")
    if int(v[-2]) != Skv:
        raise TuningError(f"Attention V {v} has {v[-2]} keys, K has {Skv}")
    Dv = int(v[-1])
    B, H = _lead2(q)
    kind = _text(attrs.get("mask_kind", "none"))
    if kind not in MASK_CODES:
        raise TuningError(f"Attention mask_kind={kind!r}")
    strides = (0, 0, 0, 0)
    if kind != "none":
        if m is None:
            raise TuningError(f"Attention mask_kind={kind!r} needs a known mask shape")
        want = dt if kind == "additive" else "bool"
        if dtypes[3] != want:
            raise TuningError(f"Attention {kind} mask of dtype {dtypes[3]} (the kernels read {want})")
        strides = _mask_strides(m, (B, H, Sq, Skv))
    if max(B * H * Sq * Skv, B * H * Sq * D, B * H * Skv * max(D, Dv)) > 2**62 or max(Sq, Skv, D, Dv) > 2**31 - 1:
        raise TuningError("Attention tensors too large for the kernels' indexing")
    scale = attrs.get("scale")
    scale = float(np.float32(scale)) if scale is not None else 1.0 / math.sqrt(D)
    mv = attrs.get("mask_value")
    return AttnPlan(B, H, Sq, Skv, D, Dv, kt, scale, MASK_CODES[kind], None if m is None else tuple(m), strides,
                    -math.inf if mv is None else float(np.float32(mv)), int(attrs.get("causal", 0)),
                    int(attrs.get("nan_to_zero", 0)), dt, _out_shape(q, Dv, attrs),
                    int(attrs.get("qkv_bshd", 0)), int(attrs.get("y_bshd", 0)), int(attrs.get("qkv_packed", 0)))


def _out_shape(q, Dv: int, attrs) -> tuple[int, ...]:
    y = tuple(int(s) for s in q[:-1]) + (Dv,)
    return swap_heads(y) if attrs.get("y_bshd", 0) else y


def _arrays(p: AttnPlan, inputs, outputs, what: str):
    ins = list(inputs) + [None] * (4 - len(inputs))
    Q, K, V, M = ins[:4]
    Y = outputs[0]
    if p.packed:  # one [B, S, 3, H, D] tensor: K and V start H * D and 2 * H * D elements after Q
        n = 3 * p.Z * p.Sq * p.D
        if Q is None or str(Q.dtype) != p.dtype or not Q.flags.c_contiguous or int(Q.size) != n:
            raise TuningError(f"{what}: packed Q, K, V must be a C-contiguous {p.dtype} array of {n} elements, "
                              f"got {None if Q is None else (Q.dtype, Q.shape)}")
        flat = Q.reshape(-1)
        Q, K, V = flat, flat[p.H * p.D:], flat[2 * p.H * p.D:]  # views: the kernels read 3 * H * D apart
        ins_sizes = (("Y", Y, p.Z * p.Sq * p.Dv),)
    else:
        ins_sizes = (("Q", Q, p.Z * p.Sq * p.D), ("K", K, p.Z * p.Skv * p.D), ("V", V, p.Z * p.Skv * p.Dv),
                     ("Y", Y, p.Z * p.Sq * p.Dv))
    for name, a, n in ins_sizes:
        if a is None or str(a.dtype) != p.dtype or not a.flags.c_contiguous or int(a.size) != n:
            raise TuningError(f"{what}: {name} must be a C-contiguous {p.dtype} array of {n} elements, "
                              f"got {None if a is None else (a.dtype, a.shape)}")
    if p.mask:
        want = p.dtype if p.mask == 1 else "bool"
        n = int(np.prod(p.mask_shape))
        if M is None or str(M.dtype) != want or not M.flags.c_contiguous or int(M.size) != n:
            raise TuningError(f"{what}: the mask must be a C-contiguous {want} array of {n} elements")
    return Q, K, V, (M if p.mask else None), Y


def _mask_args(p: AttnPlan, M):
    sb, sh, si, sj = p.mask_strides
    return (ptr(M), np.int64(sb), np.int64(sh), np.int64(si), np.int64(sj), np.float32(p.mask_value),
            np.int32(p.causal))


_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
_RAW = {2: "uint16", 4: "uint32"}  # copied as raw bits: any float of that size (bf16 arrays are uint16 views)


def _xp(a):
    """The array module of ``a``: NumPy for a NumPy array (the CPU tests), else CuPy."""
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


MAX_PITCH = 2**31 - 1  # bytes: cudaMemcpy2D's pitch limit


def repeat_copies(dst: int, src: int, row: int, rows: int, groups: int) -> list[tuple[int, int, int, int, int, int]]:
    """``cudaMemcpy2DAsync`` arguments (dst, dpitch, src, spitch, width, height) that write each of ``rows``
    contiguous ``row``-byte blocks at ``src`` ``groups`` times into ``dst``, as ``[rows, groups, row]``: copy g
    writes every block's g-th repeat (rows ``groups * row`` bytes apart). On the H100, CuPy's broadcast copy of
    repeat_kv ran at 0.5-1.0 TB/s against 3.0 for a copy (NOTES_kernels, nineteenth session)."""
    return [(dst + g * row, groups * row, src, row, row, rows) for g in range(groups)]


def repeat_kv_heads(built, sig: Signature) -> Lowering:
    """A grouped-query signature's lowering (``kv_groups`` = g: K and V with H / g heads) from ``built``, a
    lowering of its :func:`ungrouped` signature: each launch first repeats every K and V head g times into
    the workspace (K at offset 0, then V, then ``built``'s own workspace, each 256-byte aligned; on the device
    one strided copy a group, :func:`repeat_copies`), then runs ``built`` on the repeated tensors. Those
    copies are plain stream operations (nothing starts before they finish), so ``built`` runs without its
    stream barrier (its ``unordered_launch``). Any K layout (``k_transposed`` too): the heads are axis 1."""
    groups = kv_groups(sig)
    k_shape, v_shape = sig.input_shapes[1], sig.input_shapes[2]
    size = _ITEMSIZE.get(sig.dtypes[1]) if len(sig.dtypes) > 2 and sig.dtypes[1] == sig.dtypes[2] else None
    if (groups < 2 or sig.attr("qkv_bshd", 0) or k_shape is None or v_shape is None or len(k_shape) != 4
            or len(v_shape) != 4 or k_shape[:2] != v_shape[:2] or size is None):
        raise TuningError(f"kv_groups={groups}: K {k_shape}, V {v_shape} ({sig.dtypes[1:3]}) cannot be repeated here")
    base = as_lowering(built)
    B, hkv = int(k_shape[0]), int(k_shape[1])

    k_bytes, v_bytes = (groups * int(np.prod(s)) * size for s in (k_shape, v_shape))
    v_off = workspace_offset(k_bytes)
    own_off = workspace_offset(v_off + v_bytes)
    raw = _RAW[size]

    def repeated(workspace, offset: int, n: int, t):
        tail = tuple(t.shape[2:])
        dst = workspace[offset:offset + n].view(raw).reshape((B, hkv, groups) + tail)
        xp = _xp(t)
        row = n // (B * hkv * groups)  # bytes of one head
        if xp is np or not t.flags.c_contiguous or groups * row > MAX_PITCH:
            xp.copyto(dst, t.view(raw).reshape((B, hkv, 1) + tail))
        else:  # one strided DMA copy a group: CuPy's broadcast copyto ran at a sixth to a third of the copy bandwidth
            stream = xp.cuda.get_current_stream().ptr
            for args in repeat_copies(dst.data.ptr, t.data.ptr, row, B * hkv, groups):
                xp.cuda.runtime.memcpy2DAsync(*args, xp.cuda.runtime.memcpyDeviceToDevice, stream)
        return dst.reshape((B, hkv * groups) + tail).view(t.dtype)

    def run(inputs, outputs, workspace):
        q, k, v, m = (list(inputs) + [None] * 4)[:4]
        for name, t in (("K", k), ("V", v)):
            if t is None or t.ndim != 4 or t.shape[0] != B or t.shape[1] != hkv:
                raise TuningError(f"kv_groups={groups}: {name} must be [{B}, {hkv}, ., .], got "
                                  f"{None if t is None else t.shape}")
        own = workspace[own_off:own_off + base.workspace_bytes] if base.workspace_bytes else None
        return base.unordered_launch([q, repeated(workspace, 0, k_bytes, k), repeated(workspace, v_off, v_bytes, v), m],
                                     outputs, own)

    return Lowering(launch=run, outputs=base.outputs, workspace_bytes=own_off + base.workspace_bytes,
                    capturable=base.capturable, layouts=base.layouts, versions=base.versions)


class _AttentionKernels:
    """What the attention families share: their kernels live in ``attention.cu``, one template
    instance per signature (``_instance``), and ``build`` starts the same way (``_prologue``). A family
    writes ``_build`` for the plain signature; ``build`` adds the head repeat of a grouped-query one."""

    def build(self, sig: Signature, arch: str):
        groups = kv_groups(sig)
        if groups == 1:
            return self._build(sig, arch)
        return repeat_kv_heads(self._build(ungrouped(sig), arch), sig)

    def _build(self, sig: Signature, arch: str):
        raise NotImplementedError

    def _instance(self, sig: Signature) -> str:
        raise NotImplementedError

    def source_hash(self) -> str:
        return source_hash("attention.cu")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        return [("attention.cu", self._instance(sig))]

    def _prologue(self, sig: Signature):
        """(the plan, the compiled kernel); ``TuningError`` when the candidate does not apply."""
        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        return attention_plan(sig), get_kernel("attention.cu", self._instance(sig))
