"""Which own-kernel configurations the tuner profiles: those that earned their place on the H200.

``bench/prune_configs.py`` ranks every CBR configuration measured by ``bench/cbr_layers.py`` against the
fastest of all sources per (layer, batch, dtype) row (``bench/results/prune_configs_h200.md``: ResNet-50
and MobileNetV2 layers, bs1 and bs32). A measured configuration never within 5% of the fastest on any row
of its dtype is *retired*: ``candidates_for`` no longer offers it, so tuning profiles fewer candidates. A
retired configuration is still a valid lowering (``candidate_from_key`` finds it; the heuristic's
implicit-GEMM tiles are among them), so models and tuning caches that name one keep working.

The verdict is per dtype because the measurements are:
- float16 (2026-12-04, 075625a): every own configuration, the cp.async pipelined ones (``st=3/4``)
  included, against the best cuDNN and cuBLASLt plan of the same run. Only eight own configurations
  came within 5%: the depthwise and direct kernels, cuBLAS with workspace, and three implicit-GEMM
  tiles with the staged epilogue (the small-channel stems and bs1 layers). No pointwise-GEMM and no
  NHWC implicit-GEMM configuration did: cuDNN and cuBLASLt win every 1x1 and NHWC layer.
- float32 (2026-12-02): our configurations against each other only (the vendors' fp32 plans were not
  in that run), so more of them stay until a run with the providers decides.

Kept without a verdict: families not named in ``MEASURED`` (``direct_k3``, ``depthwise_nhwc``, ``cublas*``, the GemmAct
``mma_gemm`` family, attention, norms, the providers themselves).
"""

from __future__ import annotations

from graphopt.lowering.contract import Candidate

#: The families ``bench/cbr_layers_h200.json`` measured in full.
MEASURED = frozenset({"implicit_gemm", "implicit_gemm_nhwc", "pointwise_gemm", "direct"})

#: float16: within 5% of the fastest of all providers on at least one row (2026-12-04).
EARNED_FP16 = frozenset({
    "direct:opt=1",
    "direct:opt=2",
    "implicit_gemm:bm=64,bn=128,bk=32,wm=2,wn=2,splitk=1,sepi=1",
    "implicit_gemm:bm=64,bn=32,bk=32,wm=2,wn=1,splitk=1,sepi=1",
    "implicit_gemm:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1,sepi=1",
})

#: float32: within 5% of the fastest own configuration on at least one row (2026-12-02; unpipelined
#: configurations only: the pipelined ones are fp16-only).
EARNED_FP32 = frozenset({
    "direct:opt=1",
    "direct:opt=2",
    "implicit_gemm:bm=128,bn=128,bk=32,wm=2,wn=4,splitk=1,sepi=1",
    "implicit_gemm:bm=128,bn=256,bk=32,wm=2,wn=4,splitk=1,sepi=1",
    "implicit_gemm:bm=128,bn=64,bk=32,wm=2,wn=2,splitk=1,sepi=1",
    "implicit_gemm:bm=64,bn=128,bk=32,wm=2,wn=2,splitk=1,sepi=1",
    "implicit_gemm:bm=64,bn=32,bk=32,wm=2,wn=1,splitk=1,sepi=1",
    "implicit_gemm:bm=64,bn=32,bk=64,wm=2,wn=1,splitk=1",
    "implicit_gemm:bm=64,bn=32,bk=64,wm=2,wn=1,splitk=1,sepi=1",
    "implicit_gemm:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1,sepi=1",
    "implicit_gemm:bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1",
    "implicit_gemm:bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1,sepi=1",
    "implicit_gemm_nhwc:bm=128,bn=128,bk=32,wm=2,wn=4,splitk=1,sepi=1",
    "implicit_gemm_nhwc:bm=128,bn=256,bk=32,wm=2,wn=4,splitk=1,sepi=1",
    "implicit_gemm_nhwc:bm=128,bn=64,bk=32,wm=2,wn=2,splitk=1,sepi=1",
    "implicit_gemm_nhwc:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1",
    "implicit_gemm_nhwc:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1,sepi=1",
    "implicit_gemm_nhwc:bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1",
    "implicit_gemm_nhwc:bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1,sepi=1",
    "pointwise_gemm:bm=128,bn=128,bk=32,wm=2,wn=4,splitk=1,sepi=1",
    "pointwise_gemm:bm=128,bn=256,bk=32,wm=2,wn=4,splitk=1,sepi=1",
    "pointwise_gemm:bm=128,bn=64,bk=32,wm=2,wn=2,splitk=1,sepi=1",
    "pointwise_gemm:bm=64,bn=128,bk=32,wm=2,wn=2,splitk=1,sepi=1",
    "pointwise_gemm:bm=64,bn=32,bk=32,wm=2,wn=1,splitk=1",
    "pointwise_gemm:bm=64,bn=32,bk=32,wm=2,wn=1,splitk=1,sepi=1",
    "pointwise_gemm:bm=64,bn=64,bk=32,wm=2,wn=2,splitk=1,sepi=1",
    "pointwise_gemm:bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1",
    "pointwise_gemm:bm=64,bn=64,bk=64,wm=2,wn=2,splitk=1,sepi=1",
})


#: Configurations of families kept without a verdict that lost everywhere they were measured: the
#: stem's pixels-per-thread forms (``px`` > 1), on the H100 on 2026-12-06 (749f99a, MobileNetV2's stem
#: at bs1 and bs32 fp16, every stem configuration profiled by the tuner): never faster than ``px`` = 1 of
#: the same ``mv`` (bs32: 81.5 against 81.1 us at mv 8, 141-148 against 56 at mv 16, 118-124 against 54
#: at mv 32; bs1 2-3x slower). bench/NOTES_kernels.md, "The stem with pixels per thread".
RETIRED = frozenset(f"stem:mv={mv},px={px},y={y}" for mv, px in ((8, 4), (16, 4), (32, 2)) for y in ("nhwc", "nchw"))


#: dtype -> the measured configurations that earned their place (other dtypes: no verdict).
EARNED = {"float16": EARNED_FP16, "float32": EARNED_FP32}


def earns_place(cand: Candidate, dtype: str) -> bool:
    """False for a configuration the measurement of ``dtype`` covered and found never within 5% of the fastest,
    and for a ``RETIRED`` one."""
    if cand.key() in RETIRED:
        return False
    if cand.name not in MEASURED or dtype not in EARNED:
        return True
    return cand.key() in EARNED[dtype]


__all__ = ["EARNED", "EARNED_FP16", "EARNED_FP32", "MEASURED", "RETIRED", "earns_place"]
