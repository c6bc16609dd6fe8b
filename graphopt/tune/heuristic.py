"""The documented lowering heuristic: what graphopt picks when nothing was profiled.

It is used with ``--gpu none``, when the target GPU is absent and the tuning cache has no entry,
and as the fallback when every profiled candidate failed. It looks only at the node's signature
and the target's compute capability (``None`` when unknown), never at the machine it runs on, so
the same model and ``--gpu`` always give the same choice.

Rules for ``CBR`` (a convolution seen as a GEMM with M = N*Ho*Wo output pixels, N = output channels
and K = C/group*kh*kw reduction length), first match wins:

1. Input or weight shape unknown                      -> ``direct`` (works for every shape).
2. Depthwise (group == C) or other grouped convs       -> ``direct`` (each group is a tiny GEMM).
3. Tiny channel counts: N < 16 or K < 16               -> ``direct`` (too thin for tensor-core tiles).
4. 1x1 kernel, stride 1, no padding, dilation 1        -> ``gemm_cublas`` (it already is a GEMM).
5. Compute capability known and below 7.0 (no tensor cores), or fp32 below 8.0 (no tf32)
                                                       -> ``gemm_cublas`` (im2col + cuBLAS).
6. Everything else                                     -> ``implicit_gemm`` with a tile by size:
   - M*N >= 2**20 and N >= 128: ``bm=128,bn=128``; N < 128 (or smaller problems): ``bm=128,bn=64``;
     M < 4096 (batch-1 late layers): ``bm=64,bn=64``;
   - ``bk=32`` for fp16 and ``bk=16`` for fp32 (the same bytes per stage);
   - ``stages=3`` from compute capability 8.0 (cp.async), ``stages=2`` below. An unknown
     capability (``--gpu none``) is treated as 8.0, the most common data-centre target.

Rules for ``GemmAct``: always ``cublas_epilogue`` (cuBLAS is near the matrix peak at every size
we measured; the bias and activation run in one fused epilogue kernel).

Other ``graphopt`` ops have no rules here yet: they get ``default`` (the runtime's only kernel)
unless a rule is added with ``register_heuristic``.
"""

from __future__ import annotations

import math
from typing import Callable

from graphopt.kernels.base import Signature

# Lowering names shared with graphopt/kernels (a candidate's ``name``) and written into the model.
CBR_DIRECT = "direct"
CBR_IMPLICIT_GEMM = "implicit_gemm"
CBR_GEMM_CUBLAS = "gemm_cublas"
GEMM_CUBLAS_EPILOGUE = "cublas_epilogue"
GEMM_TILED = "tiled_gemm"
DEFAULT_LOWERING = "default"

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


def heuristic_lowering(op_type: str, sig: Signature, cc: tuple[int, int] | None) -> tuple[str, str, str]:
    """Return ``(lowering_name, params_str, reason)`` for one node; see the module docstring."""
    fn = _HEURISTICS.get(op_type)
    if fn is None:
        return DEFAULT_LOWERING, "", f"no heuristic rules for graphopt.{op_type}; the runtime's default kernel is used"
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
    out = []
    for i in range(nsp):
        eff = dilations[i] * (kernel[i] - 1) + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(math.ceil(spatial[i] / strides[i]))
        elif auto_pad == "VALID":
            out.append((spatial[i] - eff) // strides[i] + 1)
        else:
            out.append((spatial[i] + pads[i] + pads[i + nsp] - eff) // strides[i] + 1)
    gemm_m = n * math.prod(out)
    return dict(
        n=n, c=c, m=m, group=group, kernel=kernel, strides=strides, dilations=dilations, pads=pads,
        auto_pad=auto_pad, out=out, gemm_m=gemm_m, gemm_n=m, gemm_k=(c // max(group, 1)) * math.prod(kernel),
    )


@register_heuristic("CBR")
def _cbr(sig: Signature, cc: tuple[int, int] | None) -> tuple[str, str, str]:
    g = conv_geometry(sig)
    if g is None:
        return CBR_DIRECT, "", "input or weight shape unknown: direct convolution handles every shape"
    if g["group"] > 1:
        kind = "depthwise" if g["group"] == g["c"] else f"grouped (group={g['group']})"
        return CBR_DIRECT, "", f"{kind} convolution: direct convolution"
    if g["gemm_n"] < 16 or g["gemm_k"] < 16:
        return CBR_DIRECT, "", (
            f"tiny channel counts (N={g['gemm_n']}, K={g['gemm_k']} < 16): too thin for tensor-core tiles"
        )
    pointwise = (
        all(k == 1 for k in g["kernel"]) and all(s == 1 for s in g["strides"])
        and all(p == 0 for p in g["pads"]) and all(d == 1 for d in g["dilations"])
        and g["auto_pad"] in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
    )
    if pointwise:
        return CBR_GEMM_CUBLAS, "", "1x1 stride-1 convolution is a plain GEMM: cuBLAS plus fused epilogue"
    fp16 = bool(sig.dtypes) and sig.dtypes[0] in ("float16", "bfloat16")
    if cc is not None and (cc < (7, 0) or (not fp16 and cc < (8, 0))):
        return CBR_GEMM_CUBLAS, "", f"no tensor-core path for {sig.dtypes[0] if sig.dtypes else '?'} on sm {cc[0]}.{cc[1]}: im2col + cuBLAS"
    eff_cc = cc if cc is not None else ASSUMED_CC
    mm, nn = g["gemm_m"], g["gemm_n"]
    if mm < 4096:
        bm, bn = 64, 64
    elif mm * nn >= 2**20 and nn >= 128:
        bm, bn = 128, 128
    else:
        bm, bn = 128, 64
    bk = 32 if fp16 else 16
    stages = 3 if eff_cc >= (8, 0) else 2
    params = f"bm={bm},bn={bn},bk={bk},stages={stages}"
    return CBR_IMPLICIT_GEMM, params, f"implicit GEMM M={mm} N={nn} K={g['gemm_k']}: tile by size"


@register_heuristic("GemmAct")
def _gemm_act(sig: Signature, cc: tuple[int, int] | None) -> tuple[str, str, str]:
    return GEMM_CUBLAS_EPILOGUE, "", "cuBLAS GEMM plus one fused bias/activation epilogue kernel"
