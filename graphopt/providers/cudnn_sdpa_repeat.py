"""Grouped-query attention (``kv_groups`` > 1) as ``cudnn_sdpa``'s plain graph on K and V with every head
repeated first: the path the exports ran before rule ``attention_grouped_kv`` (repeat_kv's copies, then SDPA
on Q's heads), kept as a candidate beside cuDNN's grouped graph (``cudnn_sdpa``, which reads the grouped
heads as they are) and the own kernels (which repeat too), so the tuner can still choose it where it is the
fastest. The repeat is :func:`graphopt.kernels.attention_plan.repeat_kv_heads` (K and V repeated into the
lowering's workspace, before the plan's own workspace: on the device one strided copy a group).

Plans: the heuristic's plan of the plain graph at load time plus the first ``MAX_PLANS`` (3) cuDNN lists
for it; the graph and its plans are the plain signature's (shared with ``cudnn`` candidates of that
signature, a node with Q's heads for K and V).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.errors import TuningError
from graphopt.kernels.attention_plan import repeat_kv_heads
from graphopt.lowering.contract import Candidate, Lowering, Signature
from graphopt.ops.attention import kv_groups, ungrouped
from graphopt.providers import cudnn as base
from graphopt.providers.cudnn_sdpa import CudnnSdpa, sdpa_built, sdpa_reason

OPS = ("Attention",)
NAME = "cudnn_rkv"
MAX_PLANS = 3  # each is built, checked and timed in a cold tuning


def repeat_reason(sig: Signature) -> str | None:
    """Why ``sig`` has no repeat-then-SDPA lowering: not grouped, or the plain graph's reason."""
    if kv_groups(sig) < 2:
        return "for grouped K/V (kv_groups > 1) only: a plain signature is cudnn's"
    return sdpa_reason(ungrouped(sig))


def _plain_graph(sig: Signature, tag: str = "") -> base._Built:
    return sdpa_built(ungrouped(sig), tag)


@dataclass(frozen=True)
class CudnnSdpaRepeat(CudnnSdpa):
    """params: ``plan=<cuDNN plan name of the plain graph>``, or none for the heuristic's first plan."""

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        if sig.op not in OPS:
            return f"cuDNN SDPA candidates are for {', '.join(OPS)}"
        if kv_groups(sig) < 2:
            return repeat_reason(sig)
        return super().applies(ungrouped(sig), compute_capability)

    def graphs(self):
        return _plain_graph

    def build(self, sig: Signature, arch: str) -> Lowering:
        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        return repeat_kv_heads(CudnnSdpa(base.NAME, self.params).build(ungrouped(sig), arch), sig)


def candidates(op: str, sig: Signature | None = None) -> list[Candidate]:
    """For a grouped signature: the heuristic candidate, plus one per plan (the first ``MAX_PLANS``) of the
    plain graph when cuDNN can list them here; nothing for any other."""
    if op not in OPS or sig is None or kv_groups(sig) < 2:
        return []
    return base.plan_candidates(CudnnSdpaRepeat, NAME, op, sig, repeat_reason, _plain_graph, limit=MAX_PLANS)


def from_key(op: str, key: str) -> Candidate | None:
    return base.plan_from_key(CudnnSdpaRepeat, NAME, key) if op in OPS else None
