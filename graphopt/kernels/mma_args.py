"""The argument list of ``mma_gemm`` (``mma_gemm.cu``), built from named values in one place.

The kernel takes 44 positional arguments; every tensor-core family (CBR's ``implicit_gemm``,
``implicit_gemm_nhwc`` and ``pointwise_gemm``, GemmAct's ``mma_gemm``) fills them here by name, each
with the NumPy scalar type the kernel's C signature declares. The defaults are the plain GEMM
view: no batch strides, no conv geometry (``OHW = OW = sh = sw = 1``), a bias per row, no residual,
no split-K workspace and no gather table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_NULL = np.uint64(0)


def ptr(a: Any) -> Any:
    """A kernel pointer argument: the array, or a null pointer for an absent optional input."""
    return _NULL if a is None else a


def mma_args(A, B, Y, *, M: int, N: int, K: int, splits: int, act, bias=None, R=None, ws=None, counters=None,
             ktab=None, avec: int = 0, bvec: int = 0, sA: int = 0, sB: int = 0, sY: int = 0, ldb: int = 0,
             C: int = 0, H: int = 0, W: int = 0, OHW: int = 1, OW: int = 1, sh: int = 1, sw: int = 1, ph: int = 0,
             pw: int = 0, Mtot: int = 0, alpha: float = 1.0, beta: float = 1.0,
             bias_strides: tuple[int, int, int] = (0, 1, 0), res_strides: tuple[int, int, int] = (0, 0, 0),
             KWd: int = 1, dh: int = 1, dw: int = 1, Cg: int = 1) -> tuple:
    """``mma_gemm``'s arguments in the order of its signature (``act`` is a ``geometry.ActArgs``;
    ``bias_strides`` / ``res_strides`` are (batch, row, column) element strides)."""
    i32, i64, f32 = np.int32, np.int64, np.float32
    return (
        A, B, ptr(bias), ptr(R), Y, ptr(ws), ptr(counters), ptr(ktab),
        i32(M), i32(N), i32(K), i32(splits), i32(avec), i32(bvec),
        i64(sA), i64(sB), i64(sY), i32(ldb),
        i32(C), i32(H), i32(W), i32(OHW), i32(OW), i32(sh), i32(sw), i32(ph), i32(pw), i32(Mtot),
        f32(alpha), f32(beta),
        i64(bias_strides[0]), i32(bias_strides[1]), i32(bias_strides[2]),
        i64(res_strides[0]), i32(res_strides[1]), i32(res_strides[2]),
        i32(act.code), f32(act.alpha), f32(act.beta), f32(act.lo), f32(act.hi),
        i32(KWd), i32(dh), i32(dw), i32(Cg),
    )
