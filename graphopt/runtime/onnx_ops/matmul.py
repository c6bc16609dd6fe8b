"""MatMul and Gemm: every product goes through ``ctx.matmul`` (capture-safe cuBLAS on CUDA, float32
accumulation for half precision)."""

from __future__ import annotations

from graphopt.runtime.onnx_ops.registry import op


@op("MatMul")
def _matmul(ctx, ins):
    return [ctx.matmul(ins[0], ins[1])]


@op("Gemm")
def _gemm(ctx, ins):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    if ctx.attr("transA", 0):
        a = a.T
    if ctx.attr("transB", 0):
        b = b.T
    y = ctx.matmul(a, b)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if alpha != 1.0:
        y = y * y.dtype.type(alpha)
    if c is not None:
        y = y + (c * c.dtype.type(beta) if beta != 1.0 else c)
    return [y.astype(a.dtype)]
