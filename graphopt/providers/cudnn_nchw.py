"""CBR as ``cudnn``'s fused graph with every tensor in NCHW (through strides; W as OIHW).

Why: the tuner chooses each node's lowering with the layout conversions counted
(``graphopt.tune.layout_choice``). Where a convolution's neighbours run NCHW (our depthwise and
direct kernels, which win MobileNetV2's ReLU6 depthwise layers), an NHWC cuDNN plan costs a
conversion on each side; this candidate lets cuDNN compete there without them. cuDNN runs an NCHW
graph with NCHW engines or transposes inside its plan; the timing, conversions included, says which
is faster, as for any candidate. The same graph as ``cudnn`` (:func:`graphopt.providers.cudnn.conv_graph`,
same activations and plan keys), listed and built separately (its own plans and workspaces).

Plans: the heuristic's plan at load time plus the first ``MAX_PLANS`` (3) cuDNN offers (heuristics A
first), so a cold tuning builds at most that many more plans per CBR signature than before.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.kernels import geometry as geo
from graphopt.lowering.contract import Candidate, Signature
from graphopt.providers import cudnn as base

OPS = ("CBR",)
NAME = "cudnn_nchw"
LAYOUTS = ("NCHW", "NCHW", "NCHW", "NCHW", "NCHW")  # X, W (OIHW), B (1-D), R, Y: the model's own layouts
MAX_PLANS = 3  # each plan is built, checked and timed in a cold tuning: 4 candidates a CBR signature in all


def nchw_reason(sig: Signature) -> str | None:
    """Why ``sig`` has no NCHW cuDNN graph: ``cudnn``'s reasons, and one position in and out (NCHW is
    then NHWC's memory, so ``cudnn`` covers the node in either layout; and on the H200 at bs32, 51 of
    the 56 NCHW plans of such signatures, EfficientNet-B0's squeeze-excite 1x1 convolutions, left 81-96%
    of their outputs unwritten where the NHWC graph was right; the numeric gate refused them, after a
    build and a check each; at bs1 they were right)."""
    reason = base.conv_reason(sig)
    if reason:
        return reason
    g = geo.conv_geom(sig)
    if g.H * g.W == 1 and g.OH * g.OW == 1:
        return "one spatial position: NCHW and NHWC are the same memory, and the cudnn candidate takes it"
    return None


def _nchw_graph(mod, handle, sig: Signature):
    return base.conv_graph(mod, handle, sig, layout="NCHW")


def _graph_for(sig: Signature, tag: str = "") -> base._Built:
    return base.listed(sig, _nchw_graph, "|nchw" + tag)


@dataclass(frozen=True)
class CudnnNchwConv(base.CudnnConv):
    """params: ``plan=<cuDNN plan name of the NCHW graph>``, or none for the heuristic's first plan."""

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        return LAYOUTS

    def graphs(self):
        return _graph_for

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        return super().applies(sig, compute_capability) or nchw_reason(sig)


def candidates(op: str, sig: Signature | None = None) -> list[Candidate]:
    """The heuristic candidate, plus one per plan (the first ``MAX_PLANS``) when ``sig`` is given and
    cuDNN can list them here."""
    if op not in OPS:
        return []
    return base.plan_candidates(CudnnNchwConv, NAME, op, sig, nchw_reason, _graph_for, limit=MAX_PLANS)


def from_key(op: str, key: str) -> Candidate | None:
    return base.plan_from_key(CudnnNchwConv, NAME, key) if op in OPS else None
