"""Conv (1-D and 2-D), hand-written because neither NumPy nor CuPy has a convolution: depthwise as
multiply-adds over window slices, anything else as im2col + one (batched) GEMM through ``ctx.matmul``."""

from __future__ import annotations

from graphopt.runtime.onnx_ops.registry import for_accumulation, op
from graphopt.runtime.onnx_ops.windows import conv_geometry, window_slices


class _Attrs2D:
    """Wraps a node's attributes, turning 1-D geometry attributes into their 2-D (H=1) form."""

    def __init__(self, ctx):
        self.ctx = ctx

    def attr(self, name, default=None):
        v = self.ctx.attr(name, None)
        if v is None:
            return default
        if name in ("strides", "dilations"):
            return [1] + list(v)
        if name == "pads":
            return [0, v[0], 0, v[1]]
        if name == "kernel_shape":
            return [1] + list(v)
        return v


@op("Conv")
def conv(ctx, ins):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    one_d = x.ndim == 3
    actx = ctx
    if one_d:
        x, w, actx = x[:, :, None, :], w[:, :, None, :], _Attrs2D(ctx)
    if x.ndim != 4:
        raise NotImplementedError("Conv supports 1-D and 2-D convolutions")
    y = conv2d(ctx, actx, x, w)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1).astype(y.dtype)
    if one_d:
        y = y[:, :, 0, :]
    return [y.astype(x.dtype)]


def conv2d(ctx, actx, x, w):
    """NCHW 2-D convolution without bias: depthwise as KH*KW multiply-adds, else im2col + one GEMM.

    Hand-written because neither NumPy nor CuPy has a convolution; every GEMM goes through
    ``ctx.matmul`` (capture-safe cuBLAS on CUDA). Groups become a batch of G GEMMs.
    """
    xp = ctx.xp
    N, C, H, W = x.shape
    M, Cg, KH, KW = w.shape
    G = actx.attr("group", 1)
    strides, dil, pads, outs = conv_geometry(actx, [H, W], [KH, KW])
    OH, OW = outs
    if Cg == 1 and G == C and M == C:  # depthwise: no GEMM at all
        sl = window_slices(xp, x, [KH, KW], strides, dil, pads, outs, 0)
        wa = for_accumulation(ctx, w)
        y = None
        for k, s in enumerate(sl):
            term = for_accumulation(ctx, s) * wa[:, 0, k // KW, k % KW].reshape(1, C, 1, 1)
            y = term if y is None else y + term
        return y.astype(x.dtype)
    K = Cg * KH * KW
    if KH == KW == 1 and strides == [1, 1] and not any(pads) and G == 1:
        cols = x.reshape(N, C, H * W)  # 1x1 stride-1 convolution: the input is already the column matrix
    else:
        sl = window_slices(xp, x, [KH, KW], strides, dil, pads, outs, 0)
        # (N, C, KH*KW, OH, OW): c major, (kh, kw) minor. Filled slice by slice rather than with
        # xp.stack: CuPy's stack of many arrays may upload a pointer table from the host, which a
        # CUDA-graph capture refuses.
        stacked = xp.empty((N, C, KH * KW, OH, OW), dtype=x.dtype)
        for k, s in enumerate(sl):
            stacked[:, :, k] = s
        cols = stacked.reshape(N, G, K, OH * OW)
        if G == 1:
            cols = cols.reshape(N, K, OH * OW)
    if G == 1:
        y = ctx.matmul(w.reshape(M, K), cols)  # (M, K) x (N, K, P): one strided batched GEMM
        return y.reshape(N, M, OH, OW)
    cols = xp.ascontiguousarray(cols.transpose(1, 2, 0, 3)).reshape(G, K, N * OH * OW)
    y = ctx.matmul(xp.ascontiguousarray(w.reshape(G, M // G, K)), cols)  # (G, M/G, N*P)
    y = y.reshape(G, M // G, N, OH * OW).transpose(2, 0, 1, 3)
    return xp.ascontiguousarray(y).reshape(N, M, OH, OW)
