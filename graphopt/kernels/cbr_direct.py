"""CBR's ``direct`` and ``direct_k3`` families: a direct convolution, ``opt`` output columns per thread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from graphopt.kernels import geometry as geo
from graphopt.kernels.cbr_common import applied, check_common, check_out, prepare_residual, res_plan
from graphopt.kernels.mma_args import ptr
from graphopt.kernels.source import get_kernel, instance, source_hash
from graphopt.lowering.contract import Candidate, Signature


@dataclass(frozen=True)
class DirectConv(Candidate):
    """(a) Direct convolution; ``opt`` consecutive output columns per thread."""
    ordinary_launch = True  # its launch is one own kernel (Candidate.ordinary_launch)

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        reason = check_common(sig)
        if reason:
            return reason
        g = geo.conv_geom(sig)
        opt = self.param("opt", 1)
        if opt > 1 and g.OW < opt:
            return f"output width {g.OW} < opt={opt}"
        if self.name == "direct_k3" and not (g.KW == 3 and g.dw == 1 and g.sw in (1, 2)):
            return "direct_k3 needs a 3-wide window, W dilation 1 and W stride 1 or 2"
        if g.C // g.G * g.KH * g.KW > 4608 and g.C // g.G > 64:
            return "reduction too long for a direct convolution (use a GEMM lowering)"
        return None

    def source_hash(self) -> str:
        return source_hash("direct_conv.cu")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        """(source, template instance) pairs ``build`` compiles (for parallel prebuilding)."""
        return [("direct_conv.cu", instance("direct_conv", geo.dtype_of(sig), *self._tmpl(sig)))]

    def _tmpl(self, sig: Signature) -> tuple[int, int, int]:
        opt = int(self.param("opt", 1))
        if self.name == "direct_k3":
            return opt, 3, geo.conv_geom(sig).sw
        return opt, 0, 0

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        g, dt = applied(self, sig)
        opt = int(self.param("opt", 1))
        kern = get_kernel("direct_conv.cu", instance("direct_conv", dt, *self._tmpl(sig)))
        rst, mat = res_plan(sig, g)
        act = geo.act_args(sig)
        owt = -(-g.OW // opt)
        total = g.N * g.M * g.OH * owt
        grid = (-(-total // 256),)
        i32, f32 = np.int32, np.float32
        geom = tuple(i32(v) for v in (g.N, g.C, g.H, g.W, g.M, g.OH, g.OW, g.KH, g.KW, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.G))
        tail_act = (i32(act.code), f32(act.alpha), f32(act.beta), f32(act.lo), f32(act.hi))

        def launch(inputs, outputs):
            X, Wt, B, R = (list(inputs) + [None, None])[:4]
            y = check_out(outputs, g, dt)
            R = prepare_residual(R, g, mat)
            rs = (0, 0, 0) if R is None else ((0, 0, 0) if mat else rst)
            if mat and R is not None:
                rs = (g.M * g.OH * g.OW, g.OH * g.OW, 1)
            kern(grid, (256,), (X, Wt, ptr(B), ptr(R), y) + geom + tuple(i32(v) for v in rs) + tail_act)

        return launch


__all__ = ["DirectConv"]
