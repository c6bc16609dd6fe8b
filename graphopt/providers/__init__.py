"""Vendor-library lowering candidates, competing with graphopt's own kernels for each fused node.

- ``cudnn``: cuDNN frontend operation graphs (``nvidia-cudnn-frontend`` with cuDNN 9), each engine
  plan a candidate: CBR as one fused conv_fprop + bias + residual + activation graph in NHWC
  (``cudnn``, which also holds the library state and plan keys the others share); Attention as
  one SDPA graph (``cudnn_sdpa``; for grouped K/V also on the heads repeated first, ``cudnn_sdpa_repeat``);
  LayerNorm / SkipLayerNorm / RMSNorm as the normalization forward in
  its inference phase (``cudnn_norm``); CBR with fewer than 8 input channels (a stem) on
  channel-padded tensors (``cudnn_cpad``), or as the convolution alone followed by graphopt's bias +
  activation pass (``cudnn_split``: cuDNN's non-fusing engines); CBR's graph with every tensor NCHW
  (``cudnn_nchw``), for where the neighbouring nodes run NCHW.
- ``cudnn_matmul``: GemmAct as a cuDNN frontend matmul + bias + activation graph, each plan a candidate.
- ``cublaslt``: GemmAct and 1x1 CBR as one cuBLASLt matmul with a bias/ReLU/GELU epilogue (ctypes,
  graphopt's own handle and workspace: capturable), each algorithm of its heuristic a candidate;
  image stems (at most 4 input channels) as im2col rows in the workspace, then the same matmul.

A provider imports without its library: its candidates then report in ``applies`` why they cannot
run (package missing, no GPU, shape unsupported), which the tuner shows as a reason; CPU-only
installs work unchanged.
"""

from __future__ import annotations

from typing import Sequence

from graphopt.lowering.contract import Candidate, Signature
from graphopt.providers import (cublaslt, cudnn, cudnn_cpad, cudnn_matmul, cudnn_nchw, cudnn_norm, cudnn_sdpa, cudnn_sdpa_repeat,
                                cudnn_split)

# op -> provider modules that offer candidates for it
_BY_OP: dict[str, list] = {}
for _mod in (cudnn, cudnn_nchw, cudnn_cpad, cudnn_split, cudnn_sdpa, cudnn_sdpa_repeat, cudnn_norm, cudnn_matmul, cublaslt):
    for _op in _mod.OPS:
        _BY_OP.setdefault(_op, []).append(_mod)


def provider_candidates(op: str, sig: Signature | None = None) -> list[Candidate]:
    """Every provider's candidates for ``op``: with ``sig``, each of its plans where the library can
    list them for that signature (else one candidate that says why not)."""
    return [c for mod in _BY_OP.get(op, []) for c in mod.candidates(op, sig)]


def provider_from_key(op: str, key: str) -> Candidate | None:
    """The provider candidate recorded as ``key`` (its plans are per signature, so not enumerable)."""
    for mod in _BY_OP.get(op, []):
        cand = mod.from_key(op, key)
        if cand is not None:
            return cand
    return None


def provider_reasons() -> dict[str, str | None]:
    """provider name -> None when it can offer candidates here, else why not (for reports)."""
    return {"cudnn": cudnn.unavailable(), "cublaslt": cublaslt.unavailable()}


__all__: Sequence[str] = ["provider_candidates", "provider_from_key", "provider_reasons"]
