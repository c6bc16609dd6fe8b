"""CBR's ``cublas`` and ``cublas_ws`` families: cuBLAS on NCHW (after im2col unless 1x1), then one
fused epilogue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from graphopt.kernels import blas
from graphopt.kernels import geometry as geo
from graphopt.kernels.cbr_common import applied, check_common, check_out, is_pointwise, prepare_residual, res_plan
from graphopt.kernels.mma_args import ptr
from graphopt.kernels.source import get_kernel, instance, source_hash
from graphopt.lowering.contract import Candidate, Lowering, Signature


@dataclass(frozen=True)
class CublasConv(Candidate):
    """(c) cuBLAS on NCHW: 1x1 stride-1 directly, other convs after im2col. ``cublas`` calls it
    through ``cupy.matmul``, ``cublas_ws`` through graphopt's own handle and workspace
    (graphopt.kernels.blas: capturable in a CUDA graph)."""

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        reason = check_common(sig)
        if reason:
            return reason
        g = geo.conv_geom(sig)
        if g.C // g.G == 1 and g.M // g.G == 1:
            return "depthwise convolution: a GEMM per channel is pointless"
        cols = g.N * g.C * g.KH * g.KW * g.OH * g.OW
        if not is_pointwise(g) and cols * 4 > 4 * 2**30:
            return "im2col buffer over 4 GiB"
        if cols > geo.INT32_MAX and not is_pointwise(g):
            return "im2col buffer over 2**31 elements"
        return None

    def source_hash(self) -> str:
        return source_hash("elementwise.cu") + (f"+blas{blas.VERSION}" if self.name == "cublas_ws" else "")

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        dt = geo.dtype_of(sig)
        out = [("elementwise.cu", instance("epilogue_nchw", dt))]
        if not is_pointwise(geo.conv_geom(sig)):
            out.append(("elementwise.cu", instance("im2col", dt)))
        return out

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        import cupy

        g, dt = applied(self, sig)
        epi = get_kernel("elementwise.cu", instance("epilogue_nchw", dt))
        pointwise = is_pointwise(g)
        OHW = g.OH * g.OW
        Mg, K = g.M // g.G, (g.C // g.G) * g.KH * g.KW
        cols = None
        if not pointwise:
            i2c = get_kernel("elementwise.cu", instance("im2col", dt))
            cols = cupy.empty((g.N, g.G, K, OHW), dtype=dt)
            i2c_total = g.N * g.C * g.KH * g.KW * OHW
            i2c_args = tuple(np.int32(v) for v in (g.N, g.C, g.H, g.W, g.KH, g.KW, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.OH, g.OW))
        rst, mat = res_plan(sig, g)
        act = geo.act_args(sig)
        total = g.N * g.M * OHW
        egrid = (min(-(-total // 256), 132 * 32),)
        i32, i64, f32 = np.int32, np.int64, np.float32
        tail_act = (i32(act.code), f32(act.alpha), f32(act.beta), f32(act.lo), f32(act.hi))

        own = self.name == "cublas_ws"

        def launch(inputs, outputs):
            X, Wt, B, R = (list(inputs) + [None, None])[:4]
            y = check_out(outputs, g, dt)
            if own:
                Wc, Xc = cupy.ascontiguousarray(Wt), cupy.ascontiguousarray(X)
                if pointwise:
                    blas.gemm(Wc, Xc, y, g.M, OHW, g.C, batch=g.N, stride_b=g.C * OHW, stride_c=g.M * OHW)
                else:
                    i2c((min(-(-i2c_total // 256), 132 * 32),), (256,), (Xc, cols) + i2c_args)
                    for gi in range(g.G):
                        blas.gemm(Wc, cols, y, Mg, OHW, K, batch=g.N, stride_b=g.G * K * OHW, stride_c=g.M * OHW,
                                  a_offset=gi * Mg * K, b_offset=gi * K * OHW, c_offset=gi * Mg * OHW)
            elif pointwise:
                cupy.matmul(Wt.reshape(g.M, g.C), X.reshape(g.N, g.C, OHW), out=y.reshape(g.N, g.M, OHW))
            else:
                i2c((min(-(-i2c_total // 256), 132 * 32),), (256,), (X, cols) + i2c_args)
                cupy.matmul(Wt.reshape(g.G, Mg, K), cols, out=y.reshape(g.N, g.G, Mg, OHW))
            if B is None and R is None and act.code == 0:
                return
            R = prepare_residual(R, g, mat)
            rs = (0, 0, 0)
            if R is not None:
                rs = (g.M * OHW, OHW, 1) if mat else rst
            epi(egrid, (256,), (y, ptr(B), ptr(R), i64(total), i32(g.M), i32(OHW), i32(rs[0]), i32(rs[1]), i32(rs[2])) + tail_act)

        # cupy.matmul refuses stream capture; the runtime's own cuBLAS handle does not
        return Lowering(launch=lambda ins, outs, ws: launch(ins, outs), capturable=own)


__all__ = ["CublasConv"]
