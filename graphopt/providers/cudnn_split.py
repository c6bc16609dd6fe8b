"""CBR stems as cuDNN's convolution alone, then graphopt's bias + activation pass over its output.

Why: cuDNN runs a fused conv + bias + activation graph only on its runtime-fusion engines, and a
convolution alone on every engine it has. For a stem (fewer than 8 input channels) the fused engines
are the slow ones: on the H200 at bs32 fp16 (``bench/results/cbr_layers_h200.json``, 2026-12-07) the
best fused plan ran ResNet-50's 7x7 stem in 195.2 us, channel-padded 211.8, im2col + cuBLASLt 213.8,
while torch channels_last, which runs cuDNN's convolution alone and adds the bias and the ReLU in
separate kernels, took 189.0 (178.9 in a CUDA graph). The convolution's output (51 MB there) then
costs one more read and write in graphopt's 16-byte vector epilogue (``epilogue_gemm_vec``: the NHWC
output is rows of M channels with one bias row, as a GEMM's), about 25 us at the copy rate; the
tuner's timing, the pass included, decides where that pays. Only stems get the candidate: on other
layers the fused plans run at 155-202 TFLOP/s and the extra pass could only lose (and each plan is
built and timed in a cold tuning).

Every plan cuDNN lists for the convolution-only graph (heuristics A, then the fallback list; the
inexact ones deselected as for ``cudnn``) is a candidate keyed by its name; ``cudnn_split_cpad`` offers the
same on ``cudnn_cpad``'s channel-padded operands (C zero-padded to 8 in the workspace). A third form
with the tensors declared 32-byte aligned, as torch declares them, was removed: on an H100 it timed as the
16-byte form on every plan, engine 63 (torch's first-layer engine) included, which builds at 16 bytes since
the convolution takes the model's own end pads (bench/NOTES_kernels.md, sixteenth session).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.kernels.gemm_act import epilogue_launcher, vector_epilogue_kernel
from graphopt.kernels.source import VEC16, instance, source_hash
from graphopt.lowering.contract import Lowering, Signature
from graphopt.providers import cudnn as base
from graphopt.providers import cudnn_cpad

OPS = ("CBR",)
NAME = "cudnn_split"
NAME_PAD = "cudnn_split_cpad"  # the same on channel-padded operands (cudnn_cpad's padding)
LAYOUTS = base.LAYOUTS  # X, W (KRSC), B, R, Y: as ``cudnn``'s fused graph


def split_reason(sig: Signature) -> str | None:
    """Why this CBR has no convolution-then-epilogue candidate (before any library call), or None."""
    reason = cudnn_cpad.stem_reason(sig, "the split")
    if reason:
        return reason
    try:
        geo.act_args(sig)
    except TuningError as exc:
        return str(exc)
    g = geo.conv_geom(sig)
    if len(sig.input_shapes) > 3 and sig.input_shapes[3] is not None:
        return "a residual input: the epilogue here adds a bias only"
    vec = VEC16[geo.dtype_of(sig)]
    if g.M % vec:
        return f"{g.M} output channels: the vector epilogue needs a multiple of {vec}"
    return None


def conv_only(sig: Signature) -> Signature:
    """``sig`` without its bias, residual and activation: the graph cuDNN is given."""
    attrs = {k: v for k, v in sig.attrs if k not in ("activation", "act_alpha", "act_beta", "clip_min", "clip_max")}
    return Signature.make(sig.op, list(sig.input_shapes[:2]), list(sig.dtypes[:2]), attrs, sig.layout)


def _graph_for(sig: Signature, tag: str = "") -> base._Built:
    return base.listed(conv_only(sig), base.conv_graph, "|split" + tag)


def _padded_graph_for(sig: Signature, tag: str = "") -> base._Built:
    return base.listed(cudnn_cpad.padded(conv_only(sig)), base.conv_graph, "|splitpad" + tag)


def epilogue(sig: Signature, arch: str | None = None):
    """``run(y, bias)``: ``y = act(y + bias)`` in place over the NHWC output (rows of M channels, one bias
    row): ``gemm_act.epilogue_launcher``, 16 bytes a load where ``y`` and ``bias`` are aligned."""
    g = geo.conv_geom(sig)
    rows = g.N * g.OH * g.OW
    run = epilogue_launcher(geo.dtype_of(sig), rows * g.M, rows, g.M, geo.act_args(sig), arch=arch)
    return lambda y, bias: run(y, bias, 1.0, 1.0)


@dataclass(frozen=True)
class CudnnSplitConv(base.CudnnCandidate):
    """params: ``plan=<cuDNN plan name of the convolution-only graph>``, or none for the heuristic's first."""

    graph_op = "CBR"

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        return LAYOUTS

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        if sig.op not in OPS:
            return f"cuDNN candidates here are for {', '.join(OPS)}"
        return base.unavailable_reason(compute_capability) or split_reason(sig)

    def source_hash(self) -> str:
        return super().source_hash() + "+" + source_hash("elementwise.cu")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        dt = geo.dtype_of(sig)
        return [("elementwise.cu", instance("epilogue_gemm", dt)), vector_epilogue_kernel(dt)]

    def graphs(self):
        return _graph_for

    def build(self, sig: Signature, arch: str) -> Lowering:
        b, index, ws_bytes = self._plan(sig)
        t = b.tensors
        has_bias = len(sig.input_shapes) > 2 and sig.input_shapes[2] is not None
        # no bias and no activation: the convolution is the whole node
        after = epilogue(sig, arch) if has_bias or geo.act_args(sig).code != 0 else None
        operands, total = self._operands(sig, ws_bytes, arch)

        def launch(inputs, outputs, workspace):
            xp, wp = operands(inputs[0], inputs[1], workspace)
            pack = {t["X"]: base._Dl(xp), t["W"]: base._Dl(wp), t["Y"]: base._Dl(outputs[0])}
            base.execute(b, pack, workspace[:ws_bytes] if ws_bytes else None, index)
            if after is not None:
                after(outputs[0], inputs[2] if has_bias else None)

        return Lowering(launch=launch, outputs=1, workspace_bytes=total, capturable=True, barrier=True,
                        layouts=self.layouts(sig), versions=base.versions())

    def _operands(self, sig: Signature, ws_bytes: int, arch: str):
        """``(operands(X, W, workspace) -> (x, w) for the plan, workspace bytes in all)``: X and W as given."""
        return (lambda X, W, workspace: (X, W)), ws_bytes


@dataclass(frozen=True)
class CudnnSplitPaddedConv(CudnnSplitConv):
    """``cudnn_split`` on channel-padded operands (``cudnn_cpad``'s padding: C zero-padded to 8 in the
    lowering's workspace, X read as NCHW and W as OIHW): the convolution-only graph of the padded
    signature, then the same pass. Why both: padding makes every pixel one 16-byte vector and the
    reduction a multiple of the MMA's k-step, for 8/C times the multiply-adds; which engine list then
    wins is the timing's to say."""

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        return cudnn_cpad.LAYOUTS

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        return super().kernels(sig) + [("elementwise.cu", instance("pad_channels_nhwc", geo.dtype_of(sig)))]

    def graphs(self):
        return _padded_graph_for

    def _operands(self, sig: Signature, ws_bytes: int, arch: str):
        return cudnn_cpad.channel_padder(sig, ws_bytes, arch)


def candidates(op: str, sig: Signature | None = None) -> list:
    """The heuristic candidate, plus one per plan of the convolution-only graph where cuDNN can list them
    here (all of them, as ``cudnn`` offers its fused graph's: torch with ``cudnn.benchmark`` times the
    whole list too, and only a network's one or two stems take this candidate), of the unpadded and the
    channel-padded graph; nothing for a signature that is no stem."""
    if op not in OPS or (sig is not None and split_reason(sig) is not None):
        return []
    return (base.plan_candidates(CudnnSplitConv, NAME, op, sig, split_reason, _graph_for)
            + base.plan_candidates(CudnnSplitPaddedConv, NAME_PAD, op, sig, split_reason, _padded_graph_for))


def from_key(op: str, key: str):
    if op not in OPS:
        return None
    return base.plan_from_key(CudnnSplitConv, NAME, key) or base.plan_from_key(CudnnSplitPaddedConv, NAME_PAD, key)
