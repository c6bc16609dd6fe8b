"""CBR with fewer than 8 input channels (a network's stem) as a cuDNN graph on channel-padded tensors.

Why: with 3 input channels a convolution's reduction (C x KH x KW = 147 for ResNet-50's 7x7 stem, 27
for MobileNetV2's 3x3 one) is no multiple of the tensor cores' 8-element steps, and a pixel of an
NHWC fp16 tensor is 6 bytes, not one 16-byte vector. Measured on the H200 at bs32 fp16
(``bench/results/cbr_layers_h200.json``, 2026-12-04): cuDNN's NHWC engines, torch channels_last and
our implicit GEMM all run ResNet-50's stem in 189-206 us, ten times its floor (~20 us: the 51 MB output
written once), and these two stems were the only layers where torch beat the chosen lowering.
TensorRT pads a first layer's channels for the same reason. Here C is padded with zeros to 8: every
pixel becomes one 16-byte vector and the reduction a multiple of 8, for 8/C times the multiply-adds,
on tensor cores. The lowering reads X as NCHW (a stem's input is the graph input) and W as OIHW,
writes both channel-padded NHWC into its own workspace (``pad_channels_nhwc`` in
``graphopt/kernels/elementwise.cu``, one launch each), then runs the cuDNN graph of the padded
signature (:func:`graphopt.providers.cudnn.conv_graph`); B, R and Y are bound as in ``cudnn``.
Every plan cuDNN lists for the padded graph is a candidate, keyed by its name, and competes with
the unpadded plans and our kernels: where padding does not pay, it loses the tuning.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphopt.kernels import geometry as geo
from graphopt.kernels.source import get_kernel, instance, source_hash
from graphopt.lowering.contract import Lowering, Signature, workspace_offset
from graphopt.providers import cudnn as base

OPS = ("CBR",)
NAME = "cudnn_cpad"
CPAD = geo.STEM_CHANNELS  # channels after padding: one 16-byte vector per fp16 pixel, a multiple of the MMA's k-step
DTYPES = ("float16", "float32")  # the pad kernel's types (graphopt.kernels.source.CTYPE)
# X in NCHW and W in OIHW as the model has them (padded by the lowering itself), B, R and Y as ``cudnn``
LAYOUTS = ("NCHW", "NCHW", "NHWC", "NHWC", "NHWC")  # B and R say Y's layout (a node may omit them)


def stem_reason(sig: Signature, what: str = "the padding") -> str | None:
    """Why this CBR is no stem that a cuDNN stem candidate (``what``: this module's padding,
    ``cudnn_split``'s split) takes (before any library call), or None: cuDNN's reasons, fp16 / fp32,
    group 1, fewer than ``CPAD`` input channels, 2-D."""
    reason = base.conv_reason(sig)
    if reason:
        return reason
    g = geo.conv_geom(sig)
    if geo.dtype_of(sig) not in DTYPES:
        return f"dtype {geo.dtype_of(sig)} ({what} here: {', '.join(DTYPES)})"
    if geo.is_stem(g):
        return None
    if g.G != 1:  # what geo.is_stem found missing, in its order
        return f"grouped conv (group={g.G}): {what} is for dense stems"
    if g.C >= geo.STEM_CHANNELS:
        return f"{g.C} input channels: {what} is for fewer than {geo.STEM_CHANNELS}"
    return f"1-D conv: {what} is for 2-D stems"


def pad_reason(sig: Signature) -> str | None:
    """Why padding this CBR's channels does not apply (before any library call), or None."""
    return stem_reason(sig, "the channel padding")


def padded(sig: Signature) -> Signature:
    """``sig`` with X and W carrying ``CPAD`` channels (the graph cuDNN is given)."""
    x, w = sig.input_shapes[0], sig.input_shapes[1]
    shapes = [(x[0], CPAD) + tuple(x[2:]), (w[0], CPAD) + tuple(w[2:])] + list(sig.input_shapes[2:])
    return Signature.make(sig.op, shapes, sig.dtypes, dict(sig.attrs), sig.layout)


def _graph_for(sig: Signature, tag: str = "") -> base._Built:
    return base.listed(padded(sig), base.conv_graph, "|cpad" + tag)


def workspace_parts(sig: Signature, cudnn_bytes: int) -> tuple[int, int, int]:
    """(offset of padded X, offset of padded W, total bytes) of the lowering's workspace."""
    g = geo.conv_geom(sig)
    esz = np.dtype(geo.dtype_of(sig)).itemsize
    x_off = workspace_offset(cudnn_bytes)
    w_off = x_off + workspace_offset(g.N * g.H * g.W * CPAD * esz)
    return x_off, w_off, w_off + workspace_offset(g.M * g.KH * g.KW * CPAD * esz)


def channel_padder(sig: Signature, cudnn_bytes: int, arch: str | None = None):
    """``(pad_operands, total)``: ``pad_operands(X, W, workspace) -> (xp, wp)`` writes X (NCHW) and W (OIHW)
    channel-padded NHWC into the workspace after the plan's ``cudnn_bytes`` (``pad_channels_nhwc``, one
    launch each); ``total``: the workspace's bytes in all (:func:`workspace_parts`)."""
    g = geo.conv_geom(sig)
    pad = get_kernel("elementwise.cu", instance("pad_channels_nhwc", geo.dtype_of(sig)), arch)
    x_off, w_off, total = workspace_parts(sig, cudnn_bytes)
    x_pixels, w_pixels = g.N * g.H * g.W, g.M * g.KH * g.KW
    x_args = (np.int64(x_pixels), np.int32(g.C), np.int32(CPAD), np.int32(g.H * g.W))
    w_args = (np.int64(w_pixels), np.int32(g.C), np.int32(CPAD), np.int32(g.KH * g.KW))
    x_grid, w_grid = (min(-(-x_pixels // 256), 132 * 16),), (min(-(-w_pixels // 256), 132 * 16),)

    def pad_operands(X, W, workspace):
        xp = workspace[x_off:w_off].view(X.dtype)
        wp = workspace[w_off:total].view(X.dtype)
        pad(x_grid, (256,), (X, xp) + x_args)
        pad(w_grid, (256,), (W, wp) + w_args)
        return xp, wp

    return pad_operands, total


@dataclass(frozen=True)
class CudnnPaddedConv(base.CudnnCandidate):
    """params: ``plan=<cuDNN plan name of the padded graph>``, or none for the heuristic's first plan."""

    graph_op = "CBR"

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        return LAYOUTS

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        if sig.op not in OPS:
            return f"cuDNN candidates here are for {', '.join(OPS)}"
        return base.unavailable_reason(compute_capability) or pad_reason(sig)

    def source_hash(self) -> str:
        return super().source_hash() + "+" + source_hash("elementwise.cu")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        return [("elementwise.cu", instance("pad_channels_nhwc", geo.dtype_of(sig)))]

    def graphs(self):
        return _graph_for

    def build(self, sig: Signature, arch: str) -> Lowering:
        b, index, ws_bytes = self._plan(sig)
        pad_operands, total = channel_padder(sig, ws_bytes, arch)
        t = b.tensors

        def launch(inputs, outputs, workspace):
            xp, wp = pad_operands(inputs[0], inputs[1], workspace)
            pack = {t["X"]: base._Dl(xp), t["W"]: base._Dl(wp), t["Y"]: base._Dl(outputs[0])}
            for name, a in zip(("B", "R"), inputs[2:4]):
                if a is not None and name in t:
                    pack[t[name]] = base._Dl(a)
            base.execute(b, base.bind_constants(t, pack), workspace[:ws_bytes] if ws_bytes else None, index)

        return Lowering(launch=launch, outputs=1, workspace_bytes=total, capturable=True, barrier=True,
                        layouts=LAYOUTS, versions=base.versions())


def candidates(op: str, sig: Signature | None = None) -> list:
    """The heuristic candidate, plus one per plan of the padded graph where cuDNN can list them here;
    nothing for a signature the padding is not for (so its report stays short)."""
    if op not in OPS or (sig is not None and pad_reason(sig) is not None):
        return []
    return base.plan_candidates(CudnnPaddedConv, NAME, op, sig, pad_reason, _graph_for)


def from_key(op: str, key: str):
    return base.plan_from_key(CudnnPaddedConv, NAME, key) if op in OPS else None
