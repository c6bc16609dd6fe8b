"""CBR lowering candidates: y = act(Conv(X, W, B) + R), NCHW in and out.

- ``direct``         (a) direct convolution, one thread per ``opt`` output columns;
- ``depthwise_nhwc``     a depthwise convolution in NHWC (``cbr_depthwise``), 16 bytes of channels per thread;
- ``stem``               a convolution of at most 4 input channels (image stems; ``cbr_stem``): NCHW in, NHWC
                         or NCHW out, ``mv`` output channels a thread, every weight in shared memory;
- ``implicit_gemm``  (b) tensor-core implicit GEMM (mma.sync fp16 / tf32), epilogue fused,
                         reading NCHW directly (no layout conversion, so none is counted);
- ``cublas``         (c) cuBLAS through ``cupy.matmul`` (1x1 stride-1 convs as a batched GEMM on
                         NCHW as it is, others after an im2col kernel), then one fused epilogue.

Every ``launch(inputs, outputs)`` takes ``inputs = [X, W, B or None, R or None]`` (CuPy arrays of the
signature's dtype) and ``outputs = [Y]`` (C-contiguous, the conv output shape) and enqueues on the
current CuPy stream.

Each family lives in its own module (``cbr_direct``, ``cbr_mma``, ``cbr_cublas``), what they share in
``cbr_common``, the tensor-core tile configurations in ``mma_tiles``; this module lists them all.
"""

from __future__ import annotations

from graphopt.kernels.cbr_cublas import CublasConv
from graphopt.kernels.cbr_depthwise import ROW_GROUPS, TILES, DepthwiseNhwcConv
from graphopt.kernels.cbr_direct import DirectConv
from graphopt.kernels.cbr_mma import ImplicitGemmConv, ImplicitGemmNhwcConv, PointwiseGemmConv
from graphopt.kernels.cbr_stem import stem_candidates
from graphopt.kernels.mma_tiles import mma_family
from graphopt.lowering.contract import Candidate


def cbr_candidates() -> list[Candidate]:
    """Every CBR candidate, in a fixed order (applies() prunes per signature)."""
    out: list[Candidate] = [DirectConv("direct", (("opt", o),)) for o in (1, 2, 4)]
    out += [DirectConv("direct_k3", (("opt", o),)) for o in (4, 8)]
    out.append(DepthwiseNhwcConv("depthwise_nhwc", ()))
    out += [DepthwiseNhwcConv("depthwise_nhwc", (("rows", r),)) for r in ROW_GROUPS]
    out += [DepthwiseNhwcConv("depthwise_nhwc", (("tile", f"{h}x{w}"),)) for h, w in TILES]
    out += stem_candidates()
    out += mma_family(ImplicitGemmConv, "implicit_gemm", pipelined=False)
    out += mma_family(ImplicitGemmNhwcConv, "implicit_gemm_nhwc")
    out += mma_family(PointwiseGemmConv, "pointwise_gemm")
    out.append(CublasConv("cublas", ()))
    out.append(CublasConv("cublas_ws", ()))
    return out


__all__ = ["cbr_candidates"]
