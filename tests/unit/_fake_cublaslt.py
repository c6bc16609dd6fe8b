"""A fake libcublasLt for the CPU tests: a Python object with the library's function names that
records every call (FakeLt), and one that also computes what cuBLASLt would on host memory from the
descriptors it was given (EmulatedLt); plus signature helpers shared by the cuBLASLt provider tests."""

from __future__ import annotations

import ctypes

import numpy as np

from graphopt.lowering import Signature
from graphopt.providers import cublaslt_lib as lt

E = lt.ENUM
# per algorithm the fake's heuristic returns: config values in lt.CONFIG order (inner/cluster unknown)
ALGOS = [(21, 20, 8, 1, 0, 1, 0), (6, 18, 10, 4, 2, 0, 0), (21, 24, 8, 1, 0, 0, 1)]


def _val(arg):
    """The value behind ``ctypes.byref(x)`` or a plain ctypes scalar."""
    obj = getattr(arg, "_obj", arg)
    return getattr(obj, "value", obj)


class FakeLt:
    """Stands in for ctypes.CDLL('libcublasLt.so'): every call is logged as (name, args...)."""

    def __init__(self, algos=ALGOS, workspaces=(0, 4096, 1 << 20)):
        self.log: list = []
        self.algos, self.workspaces = list(algos), list(workspaces)
        self._next = 100

    def _new(self, out):
        self._next += 1
        out._obj.value = self._next
        return self._next

    def cublasLtGetVersion(self):
        return 130100

    def cublasLtCreate(self, h):
        self.log.append(("create", self._new(h)))
        return 0

    def cublasLtMatmulDescCreate(self, d, compute, scale):
        self.log.append(("desc", self._new(d), compute, scale))
        return 0

    def cublasLtMatmulDescSetAttribute(self, d, attr, buf, size):
        self.log.append(("desc_set", _val(d), attr, _val(buf), size))
        return 0

    def cublasLtMatrixLayoutCreate(self, lay, dtype, rows, cols, ld):
        self.log.append(("layout", self._new(lay), dtype, rows, cols, ld))
        return 0

    def cublasLtMatrixLayoutSetAttribute(self, lay, attr, buf, size):
        self.log.append(("layout_set", _val(lay), attr, _val(buf), size))
        return 0

    def cublasLtMatmulPreferenceCreate(self, p):
        self.log.append(("pref", self._new(p)))
        return 0

    def cublasLtMatmulPreferenceSetAttribute(self, p, attr, buf, size):
        self.log.append(("pref_set", _val(p), attr, _val(buf), size))
        return 0

    def cublasLtMatmulAlgoGetHeuristic(self, handle, desc, la, lb, lc, ld, pref, count, results, n):
        self.log.append(("heuristic", count))
        k = min(count, len(self.algos))
        for i in range(k):
            results[i].algo.data[0] = i
            results[i].workspaceSize = self.workspaces[i]
            results[i].state = 0
        n._obj.value = k
        return 0

    def cublasLtMatmulAlgoConfigGetAttribute(self, algo, attr, buf, size, written):
        row = self.algos[algo._obj.data[0]]
        if attr >= len(row):  # INNER_SHAPE / CLUSTER_SHAPE unknown to this "library"
            return 7
        assert size == ctypes.sizeof(buf._obj)
        buf._obj.value = row[[E[a] for _, a, _ in lt.CONFIG].index(attr)]
        return 0

    def cublasLtMatmulAlgoInit(self, handle, compute, scale, at, bt, ct, dt, algo_id, algo):
        self.log.append(("algo_init", algo_id, at))
        algo._obj.data[0] = 99
        return 0

    def cublasLtMatmulAlgoConfigSetAttribute(self, algo, attr, buf, size):
        self.log.append(("algo_set", attr, _val(buf)))
        return 0

    def cublasLtMatmulAlgoCheck(self, handle, desc, la, lb, lc, ld, algo, result):
        result._obj.workspaceSize = 777
        self.log.append(("algo_check",))
        return 0

    def cublasLtMatmul(self, handle, desc, alpha, a, la, b, lb, beta, c, lc, d, ld, algo, ws, ws_size, stream):
        self.log.append(("matmul", _val(alpha), a.value, b.value, _val(beta), c.value, d.value, algo._obj.data[0],
                         ws.value, ws_size))
        return 0


def gemm(a, b, c=(), dtype="float16", **attrs):
    c = (b[-1],) if c == () else c
    attrs.setdefault("mode", "matmul")
    return Signature.make("GemmAct", [a, b, c], [dtype, dtype, dtype if c is not None else ""], attrs, layout="rowmajor")


def conv(x, w, bias=True, res=False, dtype="float16", **attrs):
    out = (x[0], w[0]) + tuple(x[2:])
    return Signature.make("CBR", [x, w, (w[0],) if bias else None, out if res else None],
                          [dtype, dtype, dtype if bias else "", dtype if res else ""], attrs)


class EmulatedLt(FakeLt):
    """FakeLt whose cublasLtMatmul computes what cuBLASLt would (column-major layouts, strided batch,
    op(A) / op(B), alpha, bias per row of D, the epilogue's activation) on host memory, from the
    descriptors it was given: checks the row-major mapping end to end without a GPU."""

    def __init__(self):
        super().__init__()
        self.objs: dict[int, dict] = {}

    def cublasLtMatmulDescCreate(self, d, compute, scale):
        super().cublasLtMatmulDescCreate(d, compute, scale)
        self.objs[d._obj.value] = {}
        return 0

    def cublasLtMatmulDescSetAttribute(self, d, attr, buf, size):
        self.objs[_val(d)][attr] = _val(buf)
        return 0

    def cublasLtMatrixLayoutCreate(self, lay, dtype, rows, cols, ld):
        super().cublasLtMatrixLayoutCreate(lay, dtype, rows, cols, ld)
        self.objs[lay._obj.value] = {"dtype": dtype, "rows": rows, "cols": cols, "ld": ld, "batch": 1, "stride": 0}
        return 0

    def cublasLtMatrixLayoutSetAttribute(self, lay, attr, buf, size):
        key = {E["CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT"]: "batch", E["CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET"]: "stride"}
        self.objs[_val(lay)][key[attr]] = _val(buf)
        return 0

    @staticmethod
    def _dt(code):
        return {E["CUDA_R_16F"]: np.float16, E["CUDA_R_32F"]: np.float32}[code]

    def _read(self, ptr, lay, z):
        dt = self._dt(lay["dtype"])
        esz = np.dtype(dt).itemsize
        n = (lay["cols"] - 1) * lay["ld"] + lay["rows"]
        buf = (ctypes.c_char * (n * esz)).from_address(ptr + z * lay["stride"] * esz)
        flat = np.frombuffer(buf, dtype=dt).astype(np.float64)
        return np.stack([flat[j * lay["ld"]: j * lay["ld"] + lay["rows"]] for j in range(lay["cols"])], axis=1)

    def cublasLtMatmul(self, handle, desc, alpha, a, la, b, lb, beta, c, lc, d, ld, algo, ws, ws_size, stream):
        assert c.value == d.value and _val(beta) == 0.0
        self.log.append(("matmul_d", d.value))
        o, A, B, D = self.objs[_val(desc)], self.objs[_val(la)], self.objs[_val(lb)], self.objs[_val(ld)]
        epi = o[E["CUBLASLT_MATMUL_DESC_EPILOGUE"]]
        dt = self._dt(D["dtype"])
        for z in range(D["batch"]):
            x = self._read(a.value, A, z)
            y = self._read(b.value, B, z)
            x = x.T if o[E["CUBLASLT_MATMUL_DESC_TRANSA"]] else x
            y = y.T if o[E["CUBLASLT_MATMUL_DESC_TRANSB"]] else y
            r = _val(alpha) * (x @ y)
            assert r.shape == (D["rows"], D["cols"])
            if epi & 4:
                m = D["rows"]
                bias = np.frombuffer((ctypes.c_char * (m * np.dtype(dt).itemsize)).from_address(o[E["CUBLASLT_MATMUL_DESC_BIAS_POINTER"]]), dt)
                r = r + bias.astype(np.float64)[:, None]
            if epi & 2:
                r = np.maximum(r, 0)
            if epi & 32:
                r = 0.5 * r * (1 + np.tanh(np.sqrt(2 / np.pi) * (r + 0.044715 * r ** 3)))
            # exactly the elements D spans (a D at an offset into a padded buffer ends before its end)
            span = (D["cols"] - 1) * D["ld"] + D["rows"]
            out = (ctypes.c_char * (span * np.dtype(dt).itemsize)).from_address(
                d.value + z * D["stride"] * np.dtype(dt).itemsize)
            view = np.lib.stride_tricks.as_strided(np.frombuffer(out, dtype=dt), (D["cols"], D["rows"]),
                                                   (D["ld"] * np.dtype(dt).itemsize, np.dtype(dt).itemsize))
            view[...] = r.T.astype(dt)
        return 0

