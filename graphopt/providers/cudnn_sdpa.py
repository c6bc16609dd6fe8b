"""cuDNN frontend candidates for graphopt.Attention: one fused SDPA graph (``pygraph.sdpa``), every
engine plan a candidate (keys, plan listing, workspace per plan and the library state are
``graphopt.providers.cudnn``'s).

The graph reads Q ``[B, H, Sq, D]``, K ``[B, Hk, Skv, D]``, V ``[B, Hk, Skv, Dv]`` and writes Y
``[B, H, Sq, Dv]``, all row-major (ranks 2 and 3 get leading 1s); ``Hk`` is H, 1 (K/V broadcast
over the heads, which cuDNN runs as multi-query attention) or H / ``kv_groups`` (grouped-query
attention: cuDNN reads head h // kv_groups of K and V for Q's head h, as the op does, so the grouped
K and V are bound as they are). fp16 / bf16 in and out, fp32 softmax.
How each form of the op is lowered:

- ``scale``: cuDNN's ``attn_scale`` (absent: 1/sqrt(D), as the op).
- ``causal=1``: cuDNN's top-left causal mask (the op's: key j > query i is masked).
- ``mask_kind="additive"``: the mask is cuDNN's ``bias`` ``[b|1, h|1, Sq, Skv]``. A mask that also
  broadcasts over the query or key axis (BERT's ``[B, 1, 1, Skv]``) is expanded into the workspace
  first (one broadcast copy per run), as cuDNN's bias has full Sq x Skv.
- ``mask_kind="bool"`` (True = attend, ``mask_value`` or -inf elsewhere): turned into that additive
  bias in the workspace by one elementwise kernel, then as above. cuDNN's own padding mask takes
  sequence lengths, which the op does not carry (its masks are tensors): a key-padding mask runs
  as this bias, exactly, whatever its pattern.
- ``qkv_bshd=1``: Q, K and V as ``[B, S, H, D]``: the graph's tensors take those strides (cuDNN's
  SDPA reads any strides with the head dim contiguous), no copy; ``y_bshd=1``: O written with those strides;
  ``qkv_packed=1``: Q, K, V the thirds of one ``[B, S, 3, H, D]`` input, bound at offsets 0, H*D, 2*H*D.
- ``k_transposed=1``: cuDNN needs the head dim contiguous (stride 1) in K, so K^T ``[.., D, Skv]`` is
  transposed into the workspace first (one copy of K).
- ``nan_to_zero=1``: with a mask, rows that are fully masked have NaN probabilities in the op; Y's
  NaNs are set to 0 after the graph (an in-place elementwise kernel). Without a mask no row can
  be fully masked (a causal row always keeps key 0), so it changes nothing.

Not lowered (``applies`` says why): float32 (cuDNN's fused attention is fp16/bf16), head dims that
are not a multiple of 8 or above 128 (256 when D == Dv on sm90+), K/V leading dims other than Q's
(or 1 head), masks of another dtype than the data, compute capability below 8.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphopt.errors import TuningError
from graphopt.lowering.contract import Candidate, Lowering, Signature, workspace_offset
from graphopt.ops.attention import kv_groups
from graphopt.ops.attention import operands as attention_operands
from graphopt.providers import cudnn as base

OPS = ("Attention",)
NAME = base.NAME
DTYPES = {"float16": "HALF", "bfloat16": "BFLOAT16"}
NAN_BITS = {"float16": 0x7C00, "bfloat16": 0x7F80}  # |bits| above this is a NaN
LAYOUTS = ("rowmajor",) * 5  # Q, K, V, mask, Y
MAX_ELEMS = 2**31 - 1


@dataclass(frozen=True)
class SdpaGeom:
    B: int
    H: int
    Hk: int
    Sq: int
    Skv: int
    D: int
    Dv: int
    dtype: str
    scale: float
    causal: bool
    kt: bool
    kind: str  # none | additive | bool
    mask4: tuple[int, ...] | None  # the mask's shape with leading 1s to rank 4
    bias_dims: tuple[int, ...] | None  # cuDNN's bias [b|1, h|1, Sq, Skv]
    mask_value: float
    nan_to_zero: bool
    bshd: bool = False  # Q, K, V given as [B, S, H, D] (qkv_bshd=1): strided tensors, no copy
    ybshd: bool = False  # O written as [B, Sq, H, Dv] (y_bshd=1)
    packed: bool = False  # Q, K, V the thirds of one [B, S, 3, H, D] input (qkv_packed=1): rows 3 * H * D apart

    @property
    def bias_in_workspace(self) -> bool:
        """The bias is made in the workspace (bool masks, masks broadcast over Sq or Skv)."""
        return self.kind == "bool" or (self.kind == "additive" and tuple(self.mask4) != tuple(self.bias_dims))

    def workspace_parts(self, plan_bytes: int) -> tuple[int, int, int]:
        """(offset of K's transposed copy, offset of the bias, total bytes) after the plan's own."""
        k_off = workspace_offset(plan_bytes)
        b_off = k_off + (workspace_offset(self.B * self.Hk * self.Skv * self.D * 2) if self.kt else 0)
        total = b_off + (workspace_offset(math.prod(self.bias_dims) * 2) if self.bias_in_workspace else 0)
        return k_off, b_off, total


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _lead(shape) -> tuple[int, int]:
    lead = (1, 1) + tuple(int(d) for d in shape[:-2])
    return lead[-2], lead[-1]


def sdpa_geom(sig: Signature) -> SdpaGeom:
    """The graph's dims, or ``TuningError`` saying why cuDNN's SDPA does not take this signature."""
    q, k, v, m, dtypes = attention_operands(sig, "cuDNN SDPA", bshd_ok=True, groups_ok=True)
    dt = dtypes[0]
    if dt not in DTYPES:
        raise TuningError(f"cuDNN SDPA needs fp16/bf16 (got {dt or 'unknown'})")
    if dtypes[1] != dt or dtypes[2] != dt:
        raise TuningError(f"cuDNN SDPA needs Q, K, V of one dtype, got {dtypes[:3]}")
    attrs = dict(sig.attrs)
    kt = bool(attrs.get("k_transposed", 0))
    B, H = _lead(q)
    Bk, Hk = _lead(k)
    Bv, Hv = _lead(v)
    if (Bk, Hk) != (Bv, Hv) or Bk != B or Hk not in (H, 1, H // kv_groups(sig)):
        raise TuningError(f"cuDNN SDPA here needs K/V leading dims equal to Q's {[B, H]} (or one head, "
                          f"broadcast over Q's heads, or H / kv_groups), got K {list(k)}, V {list(v)}")
    Sq, D = int(q[-2]), int(q[-1])
    Skv, kd = (int(k[-1]), int(k[-2])) if kt else (int(k[-2]), int(k[-1]))
    if kd != D or int(v[-2]) != Skv:
        raise TuningError(f"Attention Q {q}, K {k} (k_transposed={int(kt)}), V {v} disagree on the head dim or keys")
    Dv = int(v[-1])
    if D % 8 or Dv % 8:
        raise TuningError(f"cuDNN SDPA needs head dims that are multiples of 8, got D={D}, Dv={Dv}")
    if max(D, Dv) > 256 or (D != Dv and max(D, Dv) > 128):
        raise TuningError(f"cuDNN SDPA takes head dims up to 128 (256 when D == Dv), got D={D}, Dv={Dv}")
    if min(B, H, Sq, Skv) < 1:
        raise TuningError("cuDNN SDPA: empty dims")
    if max(B * H * Sq * max(D, Dv), B * Hk * Skv * max(D, Dv), B * H * Sq * Skv) > MAX_ELEMS:
        raise TuningError("cuDNN SDPA here: tensors over 2**31 elements")
    kind = _text(attrs.get("mask_kind", "none"))
    mask4 = bias_dims = None
    if kind not in ("none", "additive", "bool"):
        raise TuningError(f"Attention mask_kind={kind!r}")
    if kind != "none":
        if m is None or len(m) > 4:
            raise TuningError(f"cuDNN SDPA needs a known mask shape of rank <= 4, got {m}")
        want = dt if kind == "additive" else "bool"
        if dtypes[3] != want:
            raise TuningError(f"cuDNN SDPA takes a {kind} mask of dtype {want} here (its bias has the data's "
                              f"dtype), got {dtypes[3] or 'unknown'}")
        mask4 = (1,) * (4 - len(m)) + tuple(int(d) for d in m)
        for have, full in zip(mask4, (B, H, Sq, Skv)):
            if have not in (1, full):
                raise TuningError(f"Attention mask {tuple(m)} does not broadcast to [B, H, Sq, Skv] = {[B, H, Sq, Skv]}")
        bias_dims = (mask4[0], mask4[1], Sq, Skv)
    scale = attrs.get("scale")
    mv = attrs.get("mask_value")
    return SdpaGeom(B, H, Hk, Sq, Skv, D, Dv, dt, float(np.float32(scale)) if scale is not None else 1.0 / math.sqrt(D),
                    bool(attrs.get("causal", 0)), kt, kind, mask4, bias_dims,
                    -math.inf if mv is None else float(np.float32(mv)), bool(attrs.get("nan_to_zero", 0)),
                    bool(attrs.get("qkv_bshd", 0)), bool(attrs.get("y_bshd", 0)), bool(attrs.get("qkv_packed", 0)))


def sdpa_reason(sig: Signature) -> str | None:
    """Why cuDNN's SDPA does not take this signature (no library call), or None."""
    try:
        sdpa_geom(sig)
    except TuningError as e:
        return str(e)
    return None


def _contig(dims) -> list[int]:
    strides, acc = [], 1
    for d in reversed(list(dims)):
        strides.append(acc)
        acc *= int(d)
    return strides[::-1]


def _bshd(dims, packed: bool = False) -> list[int]:
    """Strides of logical [B, H, S, D] dims stored as [B, S, H, D] (qkv_bshd=1), or as one third of a
    [B, S, 3, H, D] tensor (qkv_packed=1: rows 3 * H * D apart)."""
    b, h, s, d = (int(x) for x in dims)
    row = (3 if packed else 1) * h * d
    return [s * row, d, row, 1]


def sdpa_graph(mod, handle, sig: Signature):
    """The cuDNN frontend graph of an Attention signature: (graph, tensors {"Q", "K", "V", "bias"?, "O"}, geometry)."""
    g = sdpa_geom(sig)
    dt = getattr(mod.data_type, DTYPES[g.dtype])
    f32 = mod.data_type.FLOAT
    graph = mod.pygraph(io_data_type=dt, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    dims = {"Q": [g.B, g.H, g.Sq, g.D], "K": [g.B, g.Hk, g.Skv, g.D], "V": [g.B, g.Hk, g.Skv, g.Dv]}
    if g.kind != "none":
        dims["bias"] = list(g.bias_dims)
    t = {n: graph.tensor(name=n, dim=d, stride=_bshd(d, g.packed) if g.bshd and n != "bias" else _contig(d),
                         data_type=dt)
         for n, d in dims.items()}
    kw: dict[str, Any] = {}
    if "bias" in t:
        kw["bias"] = t["bias"]
    if g.causal:
        kw["use_causal_mask"] = True
    o, _ = graph.sdpa(name="sdpa", q=t["Q"], k=t["K"], v=t["V"], generate_stats=False, attn_scale=g.scale, **kw)
    od = [g.B, g.H, g.Sq, g.Dv]
    o.set_output(True).set_data_type(dt).set_dim(od).set_stride(_bshd(od) if g.ybshd else _contig(od))
    t["O"] = o
    return graph, t, g


def sdpa_built(sig: Signature, tag: str = ""):
    return base.listed(sig, sdpa_graph, tag)


_KERNELS: dict[str, Any] = {}


def _kernel(name: str):
    """The elementwise kernels on 16-bit patterns (any 16-bit float): bool mask -> bias, NaN -> 0."""
    if name not in _KERNELS:
        import cupy

        if name == "bool_bias":
            _KERNELS[name] = cupy.ElementwiseKernel("bool m, uint16 on, uint16 off", "uint16 y",
                                                    "y = m ? on : off", "graphopt_cudnn_bool_bias")
        else:
            _KERNELS[name] = cupy.ElementwiseKernel("uint16 lim", "uint16 y", "if ((y & 0x7fff) > lim) y = 0",
                                                    "graphopt_cudnn_nan_to_zero")
    return _KERNELS[name]


def bits16(value: float, dtype: str) -> int:
    """The 16-bit pattern of ``value`` in ``dtype`` (float16 or bfloat16)."""
    if dtype == "bfloat16":
        import ml_dtypes  # onnx's dependency: always there

        return int(np.array(value, dtype=ml_dtypes.bfloat16).view(np.uint16))
    return int(np.array(value, dtype=np.float16).view(np.uint16))


def _region(workspace, offset: int, dims) -> Any:
    import cupy

    n = math.prod(dims) * 2
    return workspace[offset:offset + n].view(cupy.uint16).reshape(tuple(dims))


@dataclass(frozen=True)
class CudnnSdpa(base.CudnnCandidate):
    """params: ``plan=<cuDNN plan name>``, or none for the heuristic's first plan at load time."""

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        return LAYOUTS  # what build() declares

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        if sig.op not in OPS:
            return f"cuDNN SDPA candidates are for {', '.join(OPS)}"
        reason = base.unavailable_reason(compute_capability, (8, 0), "cuDNN SDPA (fp16/bf16)") or sdpa_reason(sig)
        if reason is None:
            g = sdpa_geom(sig)
            if max(g.D, g.Dv) > 128 and tuple(compute_capability) < (9, 0):
                return f"cuDNN SDPA takes head dims above 128 from sm90 on, got D={g.D} on {tuple(compute_capability)}"
        return reason

    def graphs(self):
        return sdpa_built

    def build(self, sig: Signature, arch: str) -> Lowering:
        b, index, plan_bytes = self._plan(sig)
        g: SdpaGeom = b.extra
        t = b.tensors
        k_off, b_off, total = g.workspace_parts(plan_bytes)
        on, off = bits16(0.0, g.dtype), bits16(g.mask_value, g.dtype)
        fix_nan = g.nan_to_zero and g.kind != "none"

        def launch(inputs, outputs, workspace):
            import cupy

            q, k, v, m = (list(inputs) + [None] * 4)[:4]
            y = outputs[0]
            if g.packed:  # one [B, S, 3, H, D] tensor: K and V start H * D and 2 * H * D elements in
                flat = q.reshape(-1)
                q, k, v = flat, flat[g.H * g.D:], flat[2 * g.H * g.D:]
            if g.kt:  # K^T [.., D, Skv] -> K [.., Skv, D], contiguous
                kbuf = _region(workspace, k_off, (g.B, g.Hk, g.Skv, g.D))
                cupy.copyto(kbuf, k.view(cupy.uint16).reshape(g.B, g.Hk, g.D, g.Skv).swapaxes(-1, -2))
                k = kbuf
            pack = {t["Q"]: base.bind(q), t["K"]: base.bind(k), t["V"]: base.bind(v), t["O"]: base.bind(y)}
            if g.kind != "none":
                if g.bias_in_workspace:
                    bias = _region(workspace, b_off, g.bias_dims)
                    if g.kind == "bool":
                        _kernel("bool_bias")(m.reshape(g.mask4), np.uint16(on), np.uint16(off), bias)
                    else:
                        cupy.copyto(bias, m.view(cupy.uint16).reshape(g.mask4))
                    m = bias
                pack[t["bias"]] = base.bind(m)
            base.execute(b, pack, workspace, index)
            if fix_nan:
                _kernel("nan_to_zero")(np.uint16(NAN_BITS[g.dtype]), y.view(cupy.uint16))

        return Lowering(launch=launch, outputs=1, workspace_bytes=total, capturable=True, barrier=True,
                        layouts=LAYOUTS, versions=base.versions())


def candidates(op: str, sig: Signature | None = None) -> list[Candidate]:
    if op not in OPS:
        return []
    return base.plan_candidates(CudnnSdpa, NAME, op, sig, sdpa_reason, sdpa_built)


def from_key(op: str, key: str) -> Candidate | None:
    return base.plan_from_key(CudnnSdpa, NAME, key) if op in OPS else None
