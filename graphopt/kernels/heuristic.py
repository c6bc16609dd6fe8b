"""The documented lowering heuristic: what graphopt picks when nothing was profiled.

It is used with ``--gpu none``, when the target GPU is absent and the tuning cache has no entry,
and as the fallback when every profiled candidate failed. It looks only at the node's signature
and the target's compute capability (``None`` when unknown), never at the machine it runs on, so
the same model and ``--gpu`` always give the same choice.

Rules for ``CBR``. The kernels (``graphopt/kernels/cbr.py``) see one conv group as a GEMM with
Mg = M/group output channels (tiled by ``bm``), Npix = N*Ho*Wo output pixels (tiled by ``bn``) and
K = C/group*kh*kw. First match wins:

1. Input or weight shape unknown                      -> ``direct`` ``opt=1`` (works for every shape).
2. Depthwise (one input channel per group)            -> ``direct`` ``opt=1`` (cuDNN's fused graph
   loses 3-9x to torch there at bs32, while ``direct`` beats it: ``bench/results/cudnn_layers_h200.md``).
2b. float16 / bfloat16, group 1, K = C*kh*kw >= 64 (MobileNetV2's 3-channel stem, K=27, was the one
   dense layer cuDNN lost at both batch sizes), capability >= 8.0 (or unknown), a graph cuDNN's pointwise ops can
   express in one op (``graphopt.providers.cudnn.conv_reason``, not the ``cudnn_pointwise.COMPOSED`` hard sigmoids,
   which only compete when profiled) -> ``cudnn`` with no plan: the cuDNN frontend's
   fused conv+bias+residual+activation graph in NHWC, its own heuristic's first plan chosen when the
   node is loaded. Measured on the H200 (best plan, in a CUDA graph): 2.3x torch eager at bs1 and 1.3x
   at bs32 (geomean over ResNet-50 / MobileNetV2's dense layers). Where cuDNN is not installed at
   run time, the runtime takes this heuristic's own-kernel choice instead (``providers=False``).
3. Tiny channel counts: Mg < 16 or K < 16              -> ``direct`` ``opt=1`` (too thin for tiles).
4. Compute capability known and below 8.0 (no mma.sync fp16/tf32 path): grouped -> ``direct``,
   otherwise ``cublas_ws`` (im2col + cuBLAS + fused epilogue).
5. Group 1 and few output pixels (Npix <= 1024: batch 1 at 32x32 or less) -> ``cublas_ws``
   (cuBLAS on graphopt's own handle; im2col first unless 1x1). Measured on the H200 at bs1 fp16
   (``bench/results/kernel_explore_h200.json``): fastest on 9 of 11 ResNet-50 / MobileNetV2 layers,
   e.g. r50.l3.c2 22 us against 46 us for the best tensor-core tile and 27 us for cuDNN.
6. 1x1 kernel, stride 1, no padding, group 1          -> ``pointwise_gemm``
   ``bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1,sepi=1`` (the GEMM reads NCHW directly; fastest or within
   5% of the fastest on the most bs32 rows of ``bench/results/cbr_layers_h200.json``), ``cublas_ws``
   where that tile does not apply.
7. Everything else                                     -> ``implicit_gemm`` with a tile by size:
   ``bm=128`` when Mg >= 128 else 64; ``bn=128`` when Npix >= 4096 else 64; warps ``wm=2`` and
   ``wn=4`` for the 128x128 tile, else ``wm=2,wn=2``; ``bk=32``; ``splitk=1`` (split-K is left to
   profiling). An unknown capability (``--gpu none``) is treated as 8.0.

The names and params are exactly those of the kernels' candidates (``Candidate.key()``), so the
runtime can rebuild the chosen candidate from the node's ``lowering`` / ``lowering_params``.

Rules for ``GemmAct``: float16 / bfloat16 with a bias or an activation that cuBLASLt's epilogue
expresses (bias over the last dimension; none, Relu, GeluTanh), capability >= 8.0 or unknown ->
``cublaslt`` with no params (its heuristic's first algorithm at load time; the reasons are in the
code); where cuBLASLt is missing at run time the runtime takes ``providers=False``, which is:
``cublas_ws`` (cuBLAS reaches the matrix peak on large GEMMs,
680 TFLOP/s fp16 measured on the H200 per design.md; the bias and activation run in one fused
epilogue kernel). ``cublas_ws`` calls cuBLAS through graphopt's own handle and workspace
(``graphopt.kernels.blas``), which a CUDA graph can capture; it timed the same as ``cupy.matmul``
(181.6 against 181.3 us at 4096^3 fp16, ``kernel_explore_h200.json``).

A rule's tile is checked with the candidate's own ``applies``; where it does not apply (say, channels
that are not a multiple of the tile's ``bk``) the next rule's choice is taken.

Rules for ``Attention`` and ``LayerNorm`` / ``RMSNorm``: see ``_attention`` and ``_norm`` below (cuDNN's
SDPA for half-precision attention where it applies; the own ``rows`` kernel for norms, which beat
torch, with cuDNN's norm competing only when profiled).
Rules for ``RoPE``: ``rope`` with 16-byte loads (``vec`` 8 for fp16, 4 for fp32) where the cos/sin
tables' last axis is contiguous and the rows split into whole loads, else ``vec=1`` (a thread per
rotated pair, any broadcast).
Rules for ``GroupNorm``: ``groups`` (one CTA per sample and group) with 16-byte loads where the
spatial size allows; 32 warps per CTA for at most 512 (sample, group) blocks, 16 up to 2048, else 8,
fewer where the group is smaller than one pass of the CTA.
Rules for ``GatedMLP``: always ``cublas_glu`` (the two GEMMs on cuBLAS, the gate in one fused kernel).
Each falls back to ``default`` where its kernel does not apply (a dtype or shape it lacks).

Other ``graphopt`` ops have no rules here yet: they get ``default`` (the runtime's only kernel)
unless a rule is added with ``register_heuristic``.
"""

from __future__ import annotations

import math
from typing import Callable

from graphopt.lowering.contract import Signature
from graphopt.ops.attention import logical as logical_qkv
from graphopt.ops.cbr import conv_output

# Lowering names shared with graphopt/kernels (a candidate's ``name``) and written into the model.
CBR_DIRECT = "direct"
CBR_IMPLICIT_GEMM = "implicit_gemm"
CBR_CUBLAS = "cublas_ws"
CBR_POINTWISE = "pointwise_gemm"
POINTWISE_PARAMS = "bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1,sepi=1"
GEMM_CUBLAS = "cublas_ws"
# Npix (N*Ho*Wo) at or below which cuBLAS beats the tensor-core tiles (bs1, measured on the H200).
SMALL_NPIX = 1024
DEFAULT_LOWERING = "default"
DIRECT_PARAMS = "opt=1"

# Treated as the target when the compute capability is unknown (``--gpu none``).
ASSUMED_CC = (8, 0)

HeuristicFn = Callable[[Signature, "tuple[int, int] | None"], "tuple[str, str, str]"]
_HEURISTICS: dict[str, HeuristicFn] = {}


def register_heuristic(op_type: str) -> Callable[[HeuristicFn], HeuristicFn]:
    """Decorator: ``fn(sig, cc) -> (lowering, params_str, reason)`` becomes the rule for ``op_type``."""

    def deco(fn: HeuristicFn) -> HeuristicFn:
        _HEURISTICS[op_type] = fn
        return fn

    return deco


def heuristic_lowering(op_type: str, sig: Signature, cc: tuple[int, int] | None, *,
                       providers: bool = True) -> tuple[str, str, str]:
    """Return ``(lowering_name, params_str, reason)`` for one node; see the module docstring.
    ``providers=False`` keeps to graphopt's own kernels (the runtime's choice where a vendor library
    is missing)."""
    fn = _HEURISTICS.get(op_type)
    if fn is None:
        return DEFAULT_LOWERING, "", f"no heuristic rules for graphopt.{op_type}; the runtime's device fallback is used"
    if op_type in _PROVIDER_AWARE:
        return fn(sig, cc, providers=providers)
    return fn(sig, cc)


def _ints(value, n: int, fill: int) -> list[int]:
    if value is None:
        return [fill] * n
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def _known(shape) -> bool:
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


def conv_geometry(sig: Signature) -> dict | None:
    """GEMM view of a CBR signature (``None`` when the input or weight shape is unknown).

    Keys: n, c, m (output channels), group, kernel, strides, dilations, pads, out (spatial output
    sizes), gemm_m, gemm_n, gemm_k.
    """
    x = sig.input_shapes[0] if sig.input_shapes else None
    w = sig.input_shapes[1] if len(sig.input_shapes) > 1 else None
    if not (_known(x) and _known(w)) or len(x) < 3 or len(w) != len(x):
        return None
    nsp = len(x) - 2
    n, c, spatial = x[0], x[1], list(x[2:])
    m, kernel = w[0], list(w[2:])
    group = int(sig.attr("group", 1) or 1)
    strides = _ints(sig.attr("strides"), nsp, 1)
    dilations = _ints(sig.attr("dilations"), nsp, 1)
    pads = _ints(sig.attr("pads"), 2 * nsp, 0)
    auto_pad = sig.attr("auto_pad", "NOTSET") or "NOTSET"
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    _, out = conv_output(spatial, kernel, strides, dilations, auto_pad, pads if auto_pad == "NOTSET" else None)
    gemm_m = n * math.prod(out)
    return dict(
        n=n, c=c, m=m, group=group, kernel=kernel, strides=strides, dilations=dilations, pads=pads,
        auto_pad=auto_pad, out=out, gemm_m=gemm_m, gemm_n=m, gemm_k=(c // max(group, 1)) * math.prod(kernel),
    )


def _applies(sig: Signature, name: str, params: str, cc: tuple[int, int]) -> bool:
    """Whether the kernels' own candidate ``name:params`` takes this signature."""
    from graphopt.kernels.registry import candidate_from_key

    try:
        cand = candidate_from_key(sig.op, f"{name}:{params}" if params else name)
        return cand.applies(sig, cc) is None
    except Exception:  # an incomplete signature (unknown dims) or an unknown key: do not take the rule
        return False


_PROVIDER_AWARE = {"CBR", "Attention"}
CBR_CUDNN = "cudnn"
CUDNN_DTYPES = ("float16", "bfloat16")
CUDNN_MIN_K = 64  # C*kh*kw: MobileNetV2's stem (3 channels, K=27) ran 3-7x slower through cuDNN than torch


@register_heuristic("CBR")
def _cbr(sig: Signature, cc: tuple[int, int] | None, providers: bool = True) -> tuple[str, str, str]:
    g = conv_geometry(sig)
    if g is None:
        return CBR_DIRECT, DIRECT_PARAMS, "input or weight shape unknown: direct convolution handles every shape"
    group = max(g["group"], 1)
    mg, k, npix = g["m"] // group, g["gemm_k"], g["gemm_m"]
    if g["c"] // group == 1 and group > 1:
        return CBR_DIRECT, DIRECT_PARAMS, "depthwise convolution: direct convolution"
    if (providers and group == 1 and k >= CUDNN_MIN_K and (cc is None or cc >= (8, 0)) and sig.dtypes
            and sig.dtypes[0] in CUDNN_DTYPES):
        from graphopt.providers.cudnn import conv_reason
        from graphopt.providers.cudnn_pointwise import COMPOSED

        # a composed activation (HardSwish, HardSigmoidMul: four pointwise ops) competes when profiled,
        # but is not the unprofiled default until a device run has measured it
        if conv_reason(sig) is None and sig.attr("activation", "none") not in COMPOSED:
            return CBR_CUDNN, "", "dense half-precision convolution: cuDNN's fused conv graph (NHWC), its heuristic's plan"
    if mg < 16 or k < 16:
        return CBR_DIRECT, DIRECT_PARAMS, f"tiny channel counts ({mg} output channels per group, K={k}; < 16): too thin for GEMM tiles"
    eff_cc = cc if cc is not None else ASSUMED_CC
    if eff_cc < (8, 0):
        if group > 1:
            return CBR_DIRECT, DIRECT_PARAMS, f"grouped convolution on sm {cc[0]}.{cc[1]} (no mma.sync path): direct convolution"
        return CBR_CUBLAS, "", f"no mma.sync fp16/tf32 path on sm {cc[0]}.{cc[1]}: im2col + cuBLAS"
    pointwise = (
        group == 1 and all(v == 1 for v in g["kernel"]) and all(v == 1 for v in g["strides"])
        and all(v == 0 for v in g["pads"]) and g["auto_pad"] in ("NOTSET", "VALID")
    )
    if group == 1 and npix <= SMALL_NPIX:
        return CBR_CUBLAS, "", f"few output pixels (Npix={npix} <= {SMALL_NPIX}): cuBLAS plus fused epilogue"
    if pointwise:
        if _applies(sig, CBR_POINTWISE, POINTWISE_PARAMS, eff_cc):
            return CBR_POINTWISE, POINTWISE_PARAMS, "1x1 stride-1 convolution is a plain GEMM on NCHW: pointwise tensor-core tile"
        return CBR_CUBLAS, "", "1x1 stride-1 convolution is a plain GEMM: cuBLAS plus fused epilogue"
    bm = 128 if mg >= 128 else 64
    bn = 128 if npix >= 4096 else 64
    wm, wn = (2, 4) if (bm, bn) == (128, 128) else (2, 2)
    params = f"bm={bm},bn={bn},bk=32,wm={wm},wn={wn},splitk=1"
    return CBR_IMPLICIT_GEMM, params, f"implicit GEMM (Mg={mg}, Npix={npix}, K={k}): tile by size"


_PROVIDER_AWARE.add("GemmAct")
GEMM_CUBLASLT = "cublaslt"
CUBLASLT_DTYPES = ("float16", "bfloat16")


@register_heuristic("GemmAct")
def _gemm_act(sig: Signature, cc: tuple[int, int] | None, providers: bool = True) -> tuple[str, str, str]:
    # cuBLASLt where its epilogue does the node's bias and/or activation (half precision, sm >= 8.0
    # or unknown). What this rests on: ``cublas_ws`` is the same cuBLAS GEMM followed by our own
    # bias/activation kernel, and that kernel reached only 0.15-0.17 of copy bandwidth on the H200
    # (slower than torch's), an extra full read and write of Y; cuBLASLt applies the bias and
    # activation in the GEMM's own epilogue, as torch's fused addmm does. Not yet measured on the
    # device against cublas_ws: bench/gemm_act.py's cublaslt_best_us / own_best_us columns will say.
    # A plain GEMM (no bias, no activation) stays on cublas_ws: there is no epilogue to save.
    if (providers and sig.dtypes and sig.dtypes[0] in CUBLASLT_DTYPES and (cc is None or cc >= (8, 0))
            and (sig.attr("activation", "none") != "none" or (len(sig.input_shapes) > 2 and sig.input_shapes[2] is not None))):
        from graphopt.providers.cublaslt import shape_reason

        if shape_reason(sig) is None:
            return GEMM_CUBLASLT, "", "bias/activation in cuBLASLt's GEMM epilogue (its heuristic's algorithm)"
    return GEMM_CUBLAS, "", "cuBLAS GEMM plus one fused bias/activation epilogue kernel"


def _first_applying(sig: Signature, keys, cc) -> str | None:
    for key in keys:
        name, _, params = key.partition(":")
        if _applies(sig, name, params, cc):
            return key
    return None


@register_heuristic("LayerNorm")
@register_heuristic("RMSNorm")
def _norm(sig: Signature, cc: tuple[int, int] | None) -> tuple[str, str, str]:
    """``rows`` with 16-byte loads where the row allows, the smallest CTA from 4 warps up that holds the
    row (a CTA per row; the profiler picks among all of them when it can)."""
    keys = [f"rows:warps={w},items={it},vec={v}" for v in (8, 4, 1) for w in (4, 8, 16, 32, 2, 1) for it in (1, 2, 4, 8)]
    key = _first_applying(sig, keys, cc or ASSUMED_CC)
    if key is None:
        return DEFAULT_LOWERING, "", "no norm kernel takes this shape or dtype: the runtime's device fallback"
    name, _, params = key.partition(":")
    return name, params, "one row per CTA in registers, 16-byte loads where the row length allows"


ATTN_CUDNN = "cudnn"
ATTN_CUDNN_MIN_KEYS = 128  # the shortest key length cuDNN's SDPA was measured at (within 6% of torch SDPA)
ATTN_CUDNN_HEAD_DIMS = (64, 128)  # head dims measured


@register_heuristic("Attention")
def _attention(sig: Signature, cc: tuple[int, int] | None, providers: bool = True) -> tuple[str, str, str]:
    """fp16 / bf16 where cuDNN's SDPA takes the signature (``graphopt.providers.cudnn_sdpa.sdpa_reason``),
    capability >= 8.0 (or unknown), head dim 64 or 128 and at least 128 keys (bf16: any length and head
    dim, the own kernels have no bf16): ``cudnn``, its heuristic's plan at load time. Measured on the H200
    (``bench/transformer_kernels.py``, seq 128-4096, hd 64/128, causal or not): within 6% of torch SDPA,
    where ``flash_mma`` reaches 0.25-0.34x of it. Otherwise (and where cuDNN is missing at run time,
    ``providers=False``): short keys (< 512): the scores fit one softmax pass (``cublas_softmax``:
    cuBLAS GEMMs around one fused softmax kernel, configured by ``_softmax_keys``); longer: the
    tensor-core flash kernel (``flash_mma``, two stages), else the CUDA-core ``flash``."""
    q = sig.input_shapes[0] if sig.input_shapes else None
    v = logical_qkv(sig.input_shapes[2], sig) if len(sig.input_shapes) > 2 else None
    skv = v[-2] if v is not None and len(v) >= 2 else 0
    if providers and q is not None and (cc is None or cc >= (8, 0)) and sig.dtypes and sig.dtypes[0] in CUDNN_DTYPES:
        from graphopt.providers.cudnn_sdpa import sdpa_reason

        measured = skv >= ATTN_CUDNN_MIN_KEYS and q[-1] in ATTN_CUDNN_HEAD_DIMS
        if sdpa_reason(sig) is None and (measured or sig.dtypes[0] == "bfloat16"):
            return ATTN_CUDNN, "", f"half-precision attention over {skv} keys: cuDNN's fused SDPA, its heuristic's plan"
    soft = _softmax_keys(sig)
    flash_mma = [f"flash_mma:hd={hd},bn={bn},stages=2" for hd in (16, 32, 64, 128) for bn in (64, 128)]
    flash = [f"flash:dmax={d},bm={bm},warps={w}" for d in (32, 64, 128) for bm, w in ((64, 4), (32, 4), (16, 4))]
    order = soft + flash_mma + flash if skv < 512 else flash_mma + soft + flash
    key = _first_applying(sig, order, cc or ASSUMED_CC) if q is not None else None
    if key is None:
        return DEFAULT_LOWERING, "", "no attention kernel takes this shape or dtype: the runtime's device fallback"
    name, _, params = key.partition(":")
    return name, params, f"attention over {skv} keys: {name}"


#: CTAs that keep every SM of an H100 / H200 (132) busy twice over: what the short-row softmax's
#: lanes a row are chosen to reach.
SOFTMAX_FILL_CTAS = 2 * 132


def _softmax_keys(sig: Signature) -> list[str]:
    """``cublas_softmax`` configurations in the order the heuristic tries them (the first that applies
    wins): short-row groups of lanes with 16-byte loads, the fewest lanes a row whose grid still fills
    the GPU (``SOFTMAX_FILL_CTAS``) first; then a CTA a row; the same without 16-byte loads. Measured on
    the H100 (2026-12-06, BERT-base fp32 at 128 keys, the tuning cache of bench/results/
    e2e_h100_bert_fp32_e7bf785_log.txt's call): at bs32 (49,152 rows) ``lanes=8,vec=4`` took 94.6 us
    against 215.9 for ``warps=4``, the first choice before; at bs1 (1,536 rows) ``lanes=32,vec=4`` 15.9
    against 18.8. The fp16 memory table agrees (``lanes=8,vec=8`` for BERT-base's bs32 scores)."""
    from graphopt.errors import TuningError
    from graphopt.kernels.attention_cublas import SOFTMAX_LANES
    from graphopt.kernels.source import VEC16
    from graphopt.ops.attention import operands

    try:
        q, _, _, _, dtypes = operands(sig, "heuristic", bshd_ok=True, groups_ok=True)
        rows, vec = math.prod(q[:-1]), VEC16.get(dtypes[0], 1)
    except TuningError:
        rows, vec = 0, 1
    first = next((n for n in SOFTMAX_LANES if rows * n >= 256 * SOFTMAX_FILL_CTAS), SOFTMAX_LANES[-1])
    lanes = sorted(SOFTMAX_LANES, key=lambda n: (n < first, n if n >= first else -n))  # first, wider, then narrower
    vecs = [f",vec={vec}"] if vec > 1 else []
    keys = [f"cublas_softmax:lanes={n}{v}" for v in vecs for n in lanes]
    keys += [f"cublas_softmax:warps={w}{v}" for v in vecs for w in (1, 2, 4, 8)]
    keys += [f"cublas_softmax:lanes={n}" for n in lanes]
    return keys + [f"cublas_softmax:warps={w}" for w in (4, 8, 2, 1)]


def _first_or_default(sig: Signature, cc, keys, why: str) -> tuple[str, str, str]:
    key = _first_applying(sig, keys, cc or ASSUMED_CC)
    if key is None:
        return DEFAULT_LOWERING, "", f"no {sig.op} kernel takes this shape or dtype: the runtime's device fallback"
    name, _, params = key.partition(":")
    return name, params, why


@register_heuristic("RoPE")
def _rope(sig: Signature, cc: tuple[int, int] | None) -> tuple[str, str, str]:
    keys = ["rope:vec=8", "rope:vec=4", "rope:vec=1"]
    return _first_or_default(sig, cc, keys, "one kernel; 16-byte loads where the tables' last axis is contiguous")


GROUPNORM_FEW_BLOCKS = 512    # N * groups at or below which a CTA gets 32 warps (2 CTAs fill an SM)
GROUPNORM_SOME_BLOCKS = 2048  # ... 16 warps; more blocks: 8 warps


@register_heuristic("GroupNorm")
def _group_norm(sig: Signature, cc: tuple[int, int] | None) -> tuple[str, str, str]:
    """Fewer (sample, group) blocks get larger CTAs so the SMs stay full; ``applies`` drops CTAs larger
    than the group needs."""
    x = sig.input_shapes[0] if sig.input_shapes else None
    groups = int(sig.attr("num_groups", 1) or 1)
    blocks = x[0] * groups if x is not None and len(x) >= 2 else 0
    first = 32 if blocks <= GROUPNORM_FEW_BLOCKS else 16 if blocks <= GROUPNORM_SOME_BLOCKS else 8
    warps = [w for w in (32, 16, 8, 4) if w <= first]
    keys = [f"groups:warps={w},vec={v}" for v in (8, 4, 1) for w in warps]
    return _first_or_default(sig, cc, keys, f"one CTA per (sample, group) ({blocks} blocks), fp32 statistics, "
                                            "16-byte loads where the size allows")


@register_heuristic("GatedMLP")
def _gated_mlp(sig: Signature, cc: tuple[int, int] | None) -> tuple[str, str, str]:
    return _first_or_default(sig, cc, ["cublas_glu"], "two cuBLAS GEMMs sharing X, then one fused gate kernel")
