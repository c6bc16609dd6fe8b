"""Which own-kernel configurations the tuner profiles: those that earned their place on the H200.

``bench/prune_configs.py`` ranks every CBR configuration measured by ``bench/cbr_layers.py`` against the
fastest of all sources per (layer, batch, dtype) row, cuDNN's best plan included
(``bench/results/prune_configs_h200.md``: ResNet-50 and MobileNetV2 layers, bs1 and bs32). A measured
configuration that was never within 5% of the fastest on any row is *retired*: ``candidates_for`` no longer
offers it, so tuning profiles fewer candidates. A retired configuration is still a valid lowering
(``candidate_from_key`` finds it; the heuristic's implicit-GEMM tiles are among them), so models and
tuning caches that name one keep working.

Kept without a verdict, because the measurement does not cover them: the cp.async pipelined configs
(``st=3/4``: not in the measured candidate set), the GemmAct ``mma_gemm`` family (GEMM shapes, not conv
layers), and every family not named here (``direct_k3``, ``cublas*``, attention, norms, providers).
"""

from __future__ import annotations

from graphopt.lowering.contract import Candidate

#: The families ``bench/cbr_layers_h200.json`` measured in full (their unpipelined configs).
MEASURED = frozenset({"implicit_gemm", "implicit_gemm_nhwc", "pointwise_gemm", "direct"})

#: Measured configurations within 5% of the fastest (own or cuDNN) on at least one row.
EARNED = frozenset({
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


def earns_place(cand: Candidate) -> bool:
    """False for a configuration the measurement covered and found never within 5% of the fastest."""
    if cand.name not in MEASURED or cand.param("st") is not None:
        return True
    return cand.key() in EARNED


__all__ = ["EARNED", "MEASURED", "earns_place"]
