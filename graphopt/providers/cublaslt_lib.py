"""The few cuBLASLt C calls graphopt makes, through ctypes, with its own handle, stream and workspace.

Why ctypes: CuPy refuses every cuBLAS call during CUDA-graph capture, while the library itself,
called with our own handle, stream and workspace, was captured and replayed correctly on the H200
(../shared/design.md). ``cublasLtMatmul`` takes the stream and the workspace as arguments, so a
call is capturable as long as no descriptor is created during capture (they are made at build time).

Every enum value and struct layout below is from NVIDIA's ``cublasLt.h`` (cuBLAS 11.x-13.x; the
values are part of the ABI and unchanged since they were introduced): one table, ``ENUM``.
:class:`Api` wraps the library object, so the CPU tests hand it a fake library that records calls.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from graphopt.errors import TuningError
from graphopt.kernels.blas import library_candidates

# --- from cublasLt.h / cublas_api.h / library_types.h ------------------------------------------
ENUM = {
    # cudaDataType_t (library_types.h)
    "CUDA_R_32F": 0, "CUDA_R_16F": 2, "CUDA_R_16BF": 14,
    # cublasComputeType_t (cublas_api.h)
    "CUBLAS_COMPUTE_32F": 68,
    # cublasOperation_t
    "CUBLAS_OP_N": 0, "CUBLAS_OP_T": 1,
    # cublasLtMatmulDescAttributes_t
    "CUBLASLT_MATMUL_DESC_TRANSA": 3,            # int32
    "CUBLASLT_MATMUL_DESC_TRANSB": 4,            # int32
    "CUBLASLT_MATMUL_DESC_EPILOGUE": 7,          # uint32 (cublasLtEpilogue_t)
    "CUBLASLT_MATMUL_DESC_BIAS_POINTER": 8,      # const void*
    "CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE": 10,  # int64
    # cublasLtEpilogue_t
    "CUBLASLT_EPILOGUE_DEFAULT": 1, "CUBLASLT_EPILOGUE_RELU": 2, "CUBLASLT_EPILOGUE_BIAS": 4,
    "CUBLASLT_EPILOGUE_RELU_BIAS": 6, "CUBLASLT_EPILOGUE_GELU": 32, "CUBLASLT_EPILOGUE_GELU_BIAS": 36,
    # cublasLtMatrixLayoutAttribute_t
    "CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT": 5,           # int32
    "CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET": 6,  # int64
    # cublasLtMatmulPreferenceAttributes_t
    "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES": 1,     # uint64
    "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES": 5,   # uint32 (default 256)
    "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES": 6,
    "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES": 7,
    "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES": 8,
    # cublasLtMatmulAlgoConfigAttributes_t
    "CUBLASLT_ALGO_CONFIG_ID": 0, "CUBLASLT_ALGO_CONFIG_TILE_ID": 1, "CUBLASLT_ALGO_CONFIG_SPLITK_NUM": 2,
    "CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME": 3, "CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING": 4,
    "CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION": 5, "CUBLASLT_ALGO_CONFIG_STAGES_ID": 6,
    "CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID": 7, "CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID": 8,
}
CUBLAS_STATUS_SUCCESS = 0

# An algorithm's configuration, as read back with cublasLtMatmulAlgoConfigGetAttribute: key name in
# a candidate's params -> (attribute, C type of its value). INNER_SHAPE / CLUSTER_SHAPE (uint16) are
# newer than cuBLAS 11; a library that does not know them leaves them out of the key.
CONFIG = (
    ("algo", "CUBLASLT_ALGO_CONFIG_ID", ctypes.c_int32),
    ("tile", "CUBLASLT_ALGO_CONFIG_TILE_ID", ctypes.c_uint32),
    ("stages", "CUBLASLT_ALGO_CONFIG_STAGES_ID", ctypes.c_uint32),
    ("splitk", "CUBLASLT_ALGO_CONFIG_SPLITK_NUM", ctypes.c_uint32),
    ("red", "CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME", ctypes.c_uint32),
    ("swizzle", "CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING", ctypes.c_uint32),
    ("custom", "CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION", ctypes.c_uint32),
    ("inner", "CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID", ctypes.c_uint16),
    ("cluster", "CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID", ctypes.c_uint16),
)


class Algo(ctypes.Structure):
    """cublasLtMatmulAlgo_t: ``uint64_t data[8]`` (64 bytes)."""

    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t: algo, size_t workspaceSize, cublasStatus_t state, float
    wavesCount, int reserved[4] (96 bytes)."""

    _fields_ = [("algo", Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


SONAMES = ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")
_P, _I, _U64, _I64, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
_SIGNATURES = {
    "cublasLtCreate": [_P],
    "cublasLtMatmulDescCreate": [_P, _I, _I],
    "cublasLtMatmulDescSetAttribute": [_P, _I, _P, _SZ],
    "cublasLtMatrixLayoutCreate": [_P, _I, _U64, _U64, _I64],
    "cublasLtMatrixLayoutSetAttribute": [_P, _I, _P, _SZ],
    "cublasLtMatmulPreferenceCreate": [_P],
    "cublasLtMatmulPreferenceSetAttribute": [_P, _I, _P, _SZ],
    "cublasLtMatmulAlgoGetHeuristic": [_P, _P, _P, _P, _P, _P, _P, _I, _P, _P],
    "cublasLtMatmulAlgoConfigGetAttribute": [_P, _I, _P, _SZ, _P],
    "cublasLtMatmulAlgoConfigSetAttribute": [_P, _I, _P, _SZ],
    "cublasLtMatmulAlgoInit": [_P, _I, _I, _I, _I, _I, _I, _I, _P],
    "cublasLtMatmulAlgoCheck": [_P, _P, _P, _P, _P, _P, _P, _P],
    "cublasLtMatmul": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _SZ, _P],
}

_STATE: dict[str, Any] = {}  # "api" (an Api) or "reason" (why there is none); per process
_lock = threading.Lock()


def _open_library():
    errors = []
    for name in library_candidates("libcublasLt", SONAMES):
        try:
            lib = ctypes.CDLL(name)
            lib.cublasLtMatmulAlgoGetHeuristic  # noqa: B018 (the symbol must exist)
        except (OSError, AttributeError) as exc:
            errors.append(str(exc)[:100])
            continue
        for fn, args in _SIGNATURES.items():
            getattr(lib, fn).argtypes = args
            getattr(lib, fn).restype = ctypes.c_int
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
        lib.cublasLtGetVersion.argtypes = []
        return lib, None
    return None, ("libcublasLt not found (install the nvidia-cublas pip package or set CUDA_PATH): "
                  + "; ".join(errors[:1]))


def api() -> "Api | None":
    """The process's :class:`Api`, or None when libcublasLt cannot be loaded (see :func:`unavailable`)."""
    with _lock:
        if "reason" not in _STATE:
            lib, reason = _open_library()
            _STATE["api"], _STATE["reason"] = (Api(lib) if lib is not None else None), reason
    return _STATE["api"]


def unavailable() -> str | None:
    """None when libcublasLt loads here, else why not."""
    api()
    return _STATE["reason"]


def _check(status: int, what: str) -> None:
    if status != CUBLAS_STATUS_SUCCESS:
        raise TuningError(f"{what} failed with cuBLAS status {status}")


class Api:
    """Python-level calls on a libcublasLt object (ctypes.CDLL, or a test fake with the same names).

    Out-parameters are passed as ``ctypes.byref(obj)`` and attribute values as
    ``ctypes.byref(<ctypes scalar>)``, so a fake reads and writes them through ``arg._obj``.
    """

    def __init__(self, lib):
        self.lib = lib
        self._handles: dict[int, ctypes.c_void_p] = {}

    def version(self) -> int:
        return int(self.lib.cublasLtGetVersion())

    def handle(self, device: int) -> ctypes.c_void_p:
        """One cuBLASLt handle per device, created on first use."""
        h = self._handles.get(device)
        if h is None:
            h = ctypes.c_void_p()
            _check(self.lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
            self._handles[device] = h
        return h

    def _set(self, fn: str, obj, attr: str, value) -> None:
        _check(getattr(self.lib, fn)(obj, ENUM[attr], ctypes.byref(value), ctypes.sizeof(value)), f"{fn}({attr})")

    def matmul_desc(self, transa: int, transb: int, epilogue: str) -> ctypes.c_void_p:
        """A matmul descriptor with fp32 compute and fp32 alpha/beta (the scale type)."""
        d = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(d), ENUM["CUBLAS_COMPUTE_32F"], ENUM["CUDA_R_32F"]),
               "cublasLtMatmulDescCreate")
        self._set("cublasLtMatmulDescSetAttribute", d, "CUBLASLT_MATMUL_DESC_TRANSA", ctypes.c_int32(transa))
        self._set("cublasLtMatmulDescSetAttribute", d, "CUBLASLT_MATMUL_DESC_TRANSB", ctypes.c_int32(transb))
        self._set("cublasLtMatmulDescSetAttribute", d, "CUBLASLT_MATMUL_DESC_EPILOGUE", ctypes.c_uint32(ENUM[epilogue]))
        return d

    def set_bias(self, desc, pointer: int) -> None:
        self._set("cublasLtMatmulDescSetAttribute", desc, "CUBLASLT_MATMUL_DESC_BIAS_POINTER", ctypes.c_void_p(pointer))

    def layout(self, dtype: str, rows: int, cols: int, ld: int, batch: int = 1, stride: int = 0) -> ctypes.c_void_p:
        """A column-major matrix layout; ``batch`` > 1 adds the strided-batch attributes."""
        lay = ctypes.c_void_p()
        _check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), ENUM[dtype], rows, cols, ld),
               "cublasLtMatrixLayoutCreate")
        if batch > 1:
            self._set("cublasLtMatrixLayoutSetAttribute", lay, "CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT", ctypes.c_int32(batch))
            self._set("cublasLtMatrixLayoutSetAttribute", lay, "CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET",
                      ctypes.c_int64(stride))
        return lay

    def preference(self, max_workspace: int, alignment: int) -> ctypes.c_void_p:
        """Search preferences: at most ``max_workspace`` bytes, operands aligned to ``alignment`` bytes."""
        p = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(p)), "cublasLtMatmulPreferenceCreate")
        self._set("cublasLtMatmulPreferenceSetAttribute", p, "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES",
                  ctypes.c_uint64(max_workspace))
        for m in "ABCD":
            self._set("cublasLtMatmulPreferenceSetAttribute", p, f"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{m}_BYTES",
                      ctypes.c_uint32(alignment))
        return p

    def heuristic(self, handle, desc, la, lb, lc, ld, pref, count: int) -> list[HeuristicResult]:
        """The algorithms cuBLASLt's heuristic offers, best first (those whose state is success)."""
        results = (HeuristicResult * count)()
        n = ctypes.c_int(0)
        status = self.lib.cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, ld, pref, count, results, ctypes.byref(n))
        if status != CUBLAS_STATUS_SUCCESS:  # NOT_SUPPORTED: no algorithm for this problem
            return []
        return [HeuristicResult.from_buffer_copy(results[i]) for i in range(n.value)
                if results[i].state == CUBLAS_STATUS_SUCCESS]

    def config(self, algo: Algo) -> tuple[tuple[str, int], ...]:
        """The algorithm's configuration (id, tile, stages, split-K, ...): its stable identity."""
        out = []
        for key, attr, ctype in CONFIG:
            v, written = ctype(0), ctypes.c_size_t(0)
            status = self.lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), ENUM[attr], ctypes.byref(v),
                                                                   ctypes.sizeof(v), ctypes.byref(written))
            if status == CUBLAS_STATUS_SUCCESS:
                out.append((key, int(v.value)))
        return tuple(out)

    def algo_from_config(self, handle, desc, la, lb, lc, ld, dtype: str, config: dict) -> tuple[Algo, int]:
        """The algorithm with this configuration (``cublasLtMatmulAlgoInit`` + config attributes),
        checked against the problem by ``cublasLtMatmulAlgoCheck``: (algo, workspace bytes)."""
        algo = Algo()
        t = ENUM[dtype]
        _check(self.lib.cublasLtMatmulAlgoInit(handle, ENUM["CUBLAS_COMPUTE_32F"], ENUM["CUDA_R_32F"], t, t, t, t,
                                               int(config["algo"]), ctypes.byref(algo)), "cublasLtMatmulAlgoInit")
        for key, attr, ctype in CONFIG[1:]:
            if key in config:
                self._set("cublasLtMatmulAlgoConfigSetAttribute", ctypes.byref(algo), attr, ctype(int(config[key])))
        res = HeuristicResult()
        _check(self.lib.cublasLtMatmulAlgoCheck(handle, desc, la, lb, lc, ld, ctypes.byref(algo), ctypes.byref(res)),
               "cublasLtMatmulAlgoCheck")
        return algo, int(res.workspaceSize)

    def matmul(self, handle, desc, alpha, a, la, b, lb, beta, d, ld, algo: Algo, workspace: int, ws_bytes: int,
               stream: int) -> int:
        """``D = epilogue(alpha * op(A) op(B) + beta * D)`` on ``stream`` (C is D: in place, beta 0
        here); returns the cuBLAS status."""
        return self.lib.cublasLtMatmul(handle, desc, ctypes.byref(alpha), ctypes.c_void_p(a), la, ctypes.c_void_p(b), lb,
                                       ctypes.byref(beta), ctypes.c_void_p(d), ld, ctypes.c_void_p(d), ld,
                                       ctypes.byref(algo), ctypes.c_void_p(workspace or None), ws_bytes,
                                       ctypes.c_void_p(stream or None))
