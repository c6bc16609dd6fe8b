"""cuBLASLt candidates: GemmAct and 1x1 CBR as one cuBLASLt matmul with a fused epilogue.

The epilogues are BIAS, RELU_BIAS and GELU_BIAS (DEFAULT, RELU, GELU without a bias): the bias is a
vector over the output's last dimension (GemmAct's ``C`` of shape ``(N,)``, ``(1, N)``, ...; CBR's
per-channel bias), added before the activation. cuBLASLt's GELU is the tanh approximation (cuBLAS
documentation, footnote to cublasLtEpilogue_t), so it serves ``GeluTanh`` only, never the exact
erf ``Gelu``. Inputs fp16 / bf16 / fp32, fp32 compute and fp32 alpha. Batched GemmAct (numpy
matmul batch dims) is a strided batch; a ``B`` shared by every batch folds the batch into the rows.

The row-major mapping onto cuBLASLt's column-major call and every variant's conditions live in
``graphopt.providers.cublaslt_problem`` (no library call there); this module lists, builds and
launches.

1x1 CBR with stride 1, no padding and group 1 in NHWC is ``Y[N*H*W, M] = X[N*H*W, C] W[M, C]^T``
+ bias, then the activation. A residual input is left to other candidates (cuBLASLt's order of
``beta * C`` and the epilogue is not documented precisely enough to rely on).

``cublaslt_bt`` is the same call on a GemmAct whose B (K x N, one matrix shared by every batch) has rows
that are not 16-byte multiples (N x itemsize; GPT-2's tied LM head has N = 50257): B is declared
``colmajor`` (stored transposed, rows K apart) and passed as ``op(A) = T``. The runtime converts a
constant B once, when the plan is built; the tuner never lets an activation take it (a transpose on
every run). On the H200 every GemmAct candidate for GPT-2's LM head at bs32 took 2.5-8 ms with B's
rows odd-length (``bench/NOTES_e2e.md``, 2026-12-05).

``cublaslt_pad`` is for the same odd row length in the *output*: measured on the H200 (2026-12-05),
``cublaslt_bt`` did not help GPT-2's LM head (3.04 ms against cuBLAS's 2.49 at bs32; 0.129 against
0.088 ms at bs1): with every operand but Y aligned, the epilogue still writes 412 MB of rows 100,514
bytes apart. This variant computes Y into a workspace whose rows are padded to the next 16-byte
multiple (cuBLASLt's D with ``ld`` = N rounded up), then one ``cudaMemcpy2DAsync`` packs the rows
into the output (one pass over Y, capturable). B as in ``cublaslt_bt`` (or as given when it is
already stored transposed). torch.compile's inductor pads such matmuls the same way (``pad_mm``).
Measured on the H100 (2026-12-05) the heuristic still offered only its pre-Hopper algorithm 24 for
the LM head with every operand aligned: it withholds the TMA kernels for an odd row count itself.
So the variant makes two calls: the largest 16-byte multiple of the rows (50256), then the 1-7 rest
beside it in D (offset columns of B, D and the bias; the heuristic's first algorithm), one workspace.

``cublaslt_rowpad`` makes the same two calls straight into Y, which it declares in the ``rowpad``
layout (``graphopt.lowering.layout``: rows 16-byte aligned, Y a ``[..., :N]`` view of a padded
buffer), so neither a workspace D nor the packing copy: a consumer that reads C order converts
(one copy, as the pack was), a graph output goes to the caller strided, as torch.compile's padded
matmul output does (a CUDA-graph replay's copy-out packs it on the way). Both variants compete.
The tuner times each alone: a C-order consumer's conversion of a rowpad Y (as long as pad's pack) is
not charged to rowpad (GemmAct is not in ``tune/layout_choice``'s ops), so where Y feeds such a
consumer the two are a near-tie either pick of which costs about the same.

``cublaslt_act`` runs an activation cuBLASLt has no epilogue for (the erf ``Gelu`` of BERT's MLP,
``SiLU``, ``Clip`` = ReLU6, ``Sigmoid``, ...): the matmul with the BIAS (or DEFAULT) epilogue, then
graphopt's 16-byte vector activation kernel in place (``epilogue_gemm_vec`` without a bias), where
the output's rows are whole vectors. It competes with cuDNN's fused graphs and ``cublas_ws`` plus
the epilogue (which adds the bias in that pass too).

``cublaslt_im2col`` runs an image stem (a CBR of at most 4 input channels, group 1, no residual:
ResNet's 7x7 / 2 and MobileNet's 3x3 / 2 RGB convs) as one GEMM: ``im2col_rows`` (im2col_rows.cu)
writes X (NCHW) as rows ``cols[N*OH*OW, Kp]`` and W as ``Wp[M, Kp]`` into the workspace, C*KH*KW
zero-padded to Kp, whole 16-byte rows (147 -> 152 for fp16), then cuBLASLt computes Y (NHWC) with
the epilogue (an activation without one, ReLU6, runs after it as in ``cublaslt_act``). A stem's
reduction is too short and its channels too few for cuDNN's and graphopt's implicit GEMMs: ResNet-50's
stem at bs32 fp16 took 192 us through cuDNN on the H100 (39 TFLOP/s), 202 us through implicit GEMM,
628 us through ``cublas_ws`` (im2col per image with K = 147 unaligned). The prediction for this variant
is in bench/NOTES_kernels.md (eleventh session).

Each algorithm ``cublasLtMatmulAlgoGetHeuristic`` returns (up to :data:`REQUEST`) is a candidate
keyed by its configuration (algorithm id, tile, stages, split-K, reduction, swizzle, custom option,
inner and cluster shape), not by its list position; the plain ``cublaslt`` candidate takes the
heuristic's first algorithm when the node is loaded. Each has its own workspace size. Descriptors
are made at build time, so ``launch`` is one ``cublasLtMatmul`` on the current stream: capturable.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.kernels.gemm_act import vector_epilogue_kernel, vector_epilogue_launcher
from graphopt.kernels.source import VEC16, instance, source_hash
from graphopt.lowering import layout
from graphopt.lowering.contract import Candidate, Lowering, Signature
from graphopt.providers import cublaslt_lib as lt
from graphopt.providers.cublaslt_problem import (  # noqa: F401 - re-exported: the provider's API
    ACTIVATIONS, ALIGNMENT, DTYPES, EPILOGUES, ITEMSIZE, LAYOUTS, LAYOUTS_BT, OPS, SAME_CALLS, Problem,
    activation_after_call, b_stored_transposed, b_transposed_reason, im2col_depth, im2col_reason, im2col_smem_bytes,
    out_elements, padded_ld, padded_output_reason, post_activation_reason, problem, row_length, shape_reason,
    variant_reason)

NAME = "cublaslt"
NAME_BT = "cublaslt_bt"  # GemmAct with B declared colmajor (module docstring)
NAME_ACT = "cublaslt_act"  # an activation cuBLASLt lacks, as a kernel after the matmul (module docstring)
NAME_PAD = "cublaslt_pad"  # Y computed with padded rows in the workspace, then packed (module docstring)
NAME_ROWPAD = "cublaslt_rowpad"  # the same calls, Y declared "rowpad" and written in place (module docstring)
NAME_IM2COL = "cublaslt_im2col"  # an image stem as im2col rows in the workspace, then the GEMM (module docstring)
VARIANTS = {NAME: "", NAME_BT: "bt", NAME_ACT: "act", NAME_PAD: "pad", NAME_ROWPAD: "rowpad",
            NAME_IM2COL: "im2col"}  # family name -> variant
GEMM_ONLY = (NAME_BT, NAME_PAD, NAME_ROWPAD)  # variants for GemmAct only
CBR_ONLY = (NAME_IM2COL,)  # variants for CBR only
LAYOUTS_IM2COL = ("NCHW", "NCHW", "NHWC", "NHWC", "NHWC")  # X read in NCHW (a graph input), W OIHW, Y written NHWC
IM2COL_SOURCE = "im2col_rows.cu"  # its packing kernel
LAYOUT_ROWPAD = "rowpad"  # cublaslt_rowpad's Y (graphopt.lowering.layout)
REQUEST = 16  # algorithms asked of the heuristic per signature
MAX_WORKSPACE = 32 << 20


def unavailable() -> str | None:
    return lt.unavailable()


def versions() -> tuple[tuple[str, str], ...]:
    a = lt.api()
    return () if a is None else (("cublaslt", str(a.version())),)


def _device() -> int:
    try:
        import cupy

        return int(cupy.cuda.Device().id)
    except Exception:  # noqa: BLE001 - no CuPy (tests with a fake library)
        return 0


@dataclass
class _Setup:
    """Descriptors of one problem and the algorithms the heuristic offered, in its order."""

    handle: Any
    desc: Any
    layouts: tuple  # A, B, D (D doubles as C)
    algos: list     # [(config, Algo, workspace bytes)]


_SETUPS: dict[tuple[str, int, str], _Setup] = {}  # (signature key, device, variant) -> setup, per process


def _describe(a: lt.Api, pr: Problem, handle) -> _Setup:
    desc = a.matmul_desc(pr.transa, pr.transb, pr.epilogue)
    if pr.bias_input is not None:  # the heuristic reads only the pointer's alignment: exactly ALIGNMENT
        a.set_bias(desc, (1 << 20) | ALIGNMENT)
    la = a.layout(pr.dtype, *pr.a, batch=pr.batch, stride=pr.stride_a)
    lb = a.layout(pr.dtype, *pr.b, batch=pr.batch, stride=pr.stride_b)
    ld = a.layout(pr.dtype, pr.m, pr.n, pr.d_ld, batch=pr.batch, stride=pr.d_ld * pr.n)
    pref = a.preference(MAX_WORKSPACE, ALIGNMENT)
    found, seen = [], set()
    for r in a.heuristic(handle, desc, la, lb, ld, ld, pref, REQUEST):
        cfg = a.config(r.algo)
        if cfg and cfg not in seen:
            seen.add(cfg)
            found.append((cfg, r.algo, int(r.workspaceSize)))
    return _Setup(handle, desc, (la, lb, ld), found)


def _setup_for(sig: Signature, variant: str = "") -> _Setup:
    variant = SAME_CALLS.get(variant, variant)  # one heuristic list for variants making the same calls
    key = (sig.key(), _device(), variant)
    if key not in _SETUPS:
        a = lt.api()
        if a is None:
            raise TuningError(lt.unavailable())
        _SETUPS[key] = _describe(a, problem(sig, variant), a.handle(key[1]))
    return _SETUPS[key]


def _ptr(x) -> int:
    if isinstance(x, (int, np.integer)):  # an address already (the im2col variant's operands in the workspace)
        return int(x)
    data = getattr(x, "data", None)
    return int(data.ptr) if hasattr(data, "ptr") else int(x.ctypes.data)


@dataclass(frozen=True)
class CublasLtGemm(Candidate):
    """params: the algorithm's configuration (``algo=..,tile=..,stages=..,...``), or none for the
    heuristic's first algorithm at load time. ``name`` is one of ``VARIANTS``."""

    @property
    def variant(self) -> str:
        return VARIANTS[self.name]

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        """What build() declares. ``rowpad``: Y after the inputs actually passed (2 without a bias, 3
        with one, whose vector is rowpad already), as for CBR's NHWC Y."""
        if self.variant == "im2col":
            return LAYOUTS_IM2COL
        if sig.op != "GemmAct" or self.variant not in ("bt", "pad", "rowpad"):
            return LAYOUTS.get(sig.op, ())
        ab = LAYOUTS_BT if b_stored_transposed(sig, self.variant) else ()  # (it maps rowpad to pad's calls)
        return (ab or ("", "")) + (LAYOUT_ROWPAD, LAYOUT_ROWPAD) if self.variant == "rowpad" else ab

    def kernels(self, sig: Signature) -> list[tuple[str, str]]:
        """The own kernels the ``act`` variant launches after the matmul and the ``im2col`` variant before
        it (and after it, for an activation without an epilogue), for prebuilding."""
        if self.variant == "im2col" and not im2col_reason(sig):
            dt = geo.dtype_of(sig)
            out = [(IM2COL_SOURCE, instance("im2col_rows", dt, VEC16[dt]))]
            if activation_after_call(sig, self.variant):
                out.append(vector_epilogue_kernel(dt))
            return out
        if self.variant != "act" or post_activation_reason(sig):
            return []
        dt = geo.dtype_of(sig)
        return [vector_epilogue_kernel(dt)]

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        if sig.op not in OPS:
            return f"cuBLASLt candidates here are for {', '.join(OPS)}"
        reason = lt.unavailable()
        if reason:
            return reason
        return shape_reason(sig, self.variant)

    def source_hash(self) -> str:
        libs = "cublaslt:" + ",".join(f"{k}={v}" for k, v in versions())
        # pad: "+split" since the aligned rows and the tail became two calls (older timings are not served)
        own = "+" + source_hash("elementwise.cu")  # the in-place activation kernel
        return libs + {"act": own, "im2col": own + "+" + source_hash(IM2COL_SOURCE), "pad": "+split",
                       "rowpad": "+split"}.get(self.variant, "")

    def versions(self) -> tuple[tuple[str, str], ...]:
        return versions()

    def build(self, sig: Signature, arch: str) -> Lowering:
        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        a = lt.api()
        pr = problem(sig, self.variant)
        s = _setup_for(sig, self.variant)
        in_place = self.variant == "rowpad"  # Y is written where it lies (its rowpad layout): no workspace D
        if not self.params:
            if not s.algos:
                raise TuningError(f"cuBLASLt's heuristic offers no algorithm for {sig.key()}")
            _, algo, ws_bytes = s.algos[0]
        else:
            want = tuple((k, int(v)) for k, v in self.params)
            match = [(al, w) for cfg, al, w in s.algos if cfg == want]
            if match:
                algo, ws_bytes = match[0]
            else:  # recorded elsewhere (another process's heuristic list): rebuild it from its configuration
                algo, ws_bytes = a.algo_from_config(s.handle, s.desc, *s.layouts, s.layouts[2], pr.dtype, dict(want))
        alpha, beta = ctypes.c_float(pr.alpha), ctypes.c_float(0.0)
        la, lb, ld = s.layouts
        # A bias pointer is a descriptor attribute: each lowering (each node) gets its own descriptor,
        # so nodes of one signature never see each other's bias, whatever cuBLASLt keeps of a
        # descriptor in a captured CUDA graph. Without a bias the signature's descriptor is shared.
        desc = a.matmul_desc(pr.transa, pr.transb, pr.epilogue) if pr.bias_input is not None else s.desc
        post = _post_activation(sig) if activation_after_call(sig, self.variant) else None
        # im2col: its rows and the K-padded weights at the workspace's start, cuBLASLt's workspace after
        im2col = _Im2col.of(sig) if self.variant == "im2col" else None
        i2c_bytes = im2col.nbytes if im2col else 0
        # pad: D (rows d_ld apart) at the workspace's start, cuBLASLt's own workspace after it; the
        # rows past the aligned part (pr.tail) by a second call with the heuristic's first algorithm
        esize = ITEMSIZE[geo.dtype_of(sig)]
        d_bytes = -(-(pr.d_ld * pr.n * pr.batch * esize) // 256) * 256 if pr.ld_d and not in_place else 0
        rows, row_bytes = pr.n * pr.batch, (pr.m + pr.tail) * esize
        tail = _tail_call(a, sig, pr) if pr.tail else None
        ws_bytes = max(ws_bytes, tail.ws_bytes if tail else 0)  # the calls run in stream order: one workspace

        def launch(inputs, outputs, workspace):
            ins = list(inputs) + [None] * 3
            base = 0 if workspace is None else _ptr(workspace)
            if (d_bytes or i2c_bytes) and not base:
                raise TuningError(f"{self.key()} needs its workspace ({d_bytes + i2c_bytes + ws_bytes} bytes)")
            if im2col is not None:
                ins[:2] = im2col.launch(ins[0], ins[1], base)  # cols and Wp in the workspace: the GEMM's operands
            if in_place and not layout.is_layout(outputs[0], LAYOUT_ROWPAD):
                raise TuningError(f"{self.key()} writes Y in the {LAYOUT_ROWPAD} layout it declares (rows "
                                  f"{pr.d_ld * esize} bytes apart); got strides {tuple(outputs[0].strides)}")
            ptrs = [_ptr(ins[pr.a_input]), _ptr(ins[pr.b_input]), base if d_bytes else _ptr(outputs[0])]
            if pr.bias_input is not None:
                ptrs.append(_ptr(ins[pr.bias_input]))
                a.set_bias(desc, ptrs[-1])
            if any(p % ALIGNMENT for p in ptrs):
                raise TuningError(f"cuBLASLt operands must be {ALIGNMENT}-byte aligned")
            ws = base + d_bytes + i2c_bytes if base and ws_bytes else 0
            status = a.matmul(s.handle, desc, alpha, ptrs[0], la, ptrs[1], lb, beta, ptrs[2], ld, algo,
                              ws, ws_bytes if ws else 0, _stream())
            if status == lt.CUBLAS_STATUS_SUCCESS and tail is not None:
                status = tail.launch(ptrs, alpha, beta, ws, ws_bytes if ws else 0)
            if status != lt.CUBLAS_STATUS_SUCCESS:
                raise TuningError(f"cublasLtMatmul failed with status {status} ({self.key()}, {sig.key()})")
            if d_bytes:
                _pack_rows(outputs[0], base, pr.d_ld * esize, rows, row_bytes)
            if post is not None:
                post(outputs[0])

        # im2col: the launch opens with an own kernel (the packing), launched normally: it starts after the
        # work before it, and the matmul after it, so no barrier orders anything there (runtime/ordering.py)
        return Lowering(launch=launch, outputs=1, workspace_bytes=d_bytes + i2c_bytes + ws_bytes, capturable=True,
                        barrier=im2col is None,
                        layouts=self.layouts(sig), versions=versions())


@dataclass
class _Im2col:
    """The im2col variant's packing launch: X (NCHW) into GEMM rows ``cols[N*OH*OW, Kp]`` and W into
    ``Wp[M, Kp]``, both zero-padded from C*KH*KW to Kp (16-byte rows), at the workspace's start
    (``im2col_rows`` in im2col_rows.cu, one launch for both)."""

    kernel: Any
    args: tuple         # the geometry after the four pointers
    grid: int
    shape_x: tuple      # what the launch checks X and W against
    shape_w: tuple
    cols_bytes: int     # 256-byte rounded: Wp starts there
    nbytes: int         # cols and Wp
    smem: int           # the block's taps and tile of 32 rows in shared memory (cublaslt_problem.im2col_smem_bytes)

    @classmethod
    def of(cls, sig: Signature) -> "_Im2col":
        g, dt = geo.conv_geom(sig), geo.dtype_of(sig)
        k, vec, size = g.C * g.KH * g.KW, VEC16[dt], ITEMSIZE[dt]
        kp, rows = im2col_depth(k, dt), g.N * g.OH * g.OW
        cols_bytes = -(-(rows * kp * size) // 256) * 256
        w_bytes = -(-(g.M * kp * size) // 256) * 256
        i32 = np.int32
        args = tuple(i32(v) for v in (g.C, g.H, g.W, g.KH, g.KW, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.OH, g.OW,
                                      rows, k, kp, g.M))
        grid = max(1, min(-(-rows // 32), 132 * 32))  # blocks of (32, 8): 32 rows at a time (im2col_rows.cu)
        from graphopt.kernels.source import get_kernel

        kern = get_kernel(IM2COL_SOURCE, instance("im2col_rows", dt, vec))
        return cls(kern, args, grid, (g.N, g.C, g.H, g.W), (g.M, g.C, g.KH, g.KW), cols_bytes, cols_bytes + w_bytes,
                   im2col_smem_bytes(kp, dt))

    def launch(self, x, w, base: int) -> list[int]:
        """Pack X and W at ``base``; the addresses of cols and Wp, which stand for X and W in the GEMM."""
        for name, arr, want in (("X", x, self.shape_x), ("W", w, self.shape_w)):
            flags = getattr(arr, "flags", None)
            # element counts, not shapes (a 1-D conv's X has no H); arr.size: no NumPy call on every launch
            if int(arr.size) != want[0] * want[1] * want[2] * want[3] or (flags is not None and not flags.c_contiguous):
                raise TuningError(f"cublaslt_im2col: {name} must be C-contiguous {want} (NCHW / OIHW); got "
                                  f"{tuple(arr.shape)}, strides {tuple(getattr(arr, 'strides', ()))}")
        cols, wp = base, base + self.cols_bytes
        self.kernel((self.grid,), (32, 8), (x, w, np.uint64(cols), np.uint64(wp)) + self.args, shared_mem=self.smem)
        return [cols, wp]


@dataclass
class _TailCall:
    """The pad variant's second cuBLASLt call: the rows after the aligned part, into D beside it."""

    api: Any
    setup: _Setup
    desc: Any      # its own descriptor where there is a bias (the bias pointer is offset)
    algo: Any
    ws_bytes: int
    offsets: tuple[int, int, int]  # bytes added to A (our B, transposed), D and the bias pointers

    def launch(self, ptrs: list[int], alpha, beta, ws: int, ws_size: int) -> int:
        a, s = self.api, self.setup
        pa, pd = ptrs[0] + self.offsets[0], ptrs[2] + self.offsets[1]
        if len(ptrs) > 3:
            a.set_bias(self.desc, ptrs[3] + self.offsets[2])
        la, lb, ld = s.layouts
        return a.matmul(s.handle, self.desc, alpha, pa, la, ptrs[1], lb, beta, pd, ld, self.algo, ws, ws_size,
                        _stream())


def _tail_call(a: lt.Api, sig: Signature, main: Problem) -> _TailCall:
    t = _setup_for(sig, "pad_tail")
    if not t.algos:
        raise TuningError(f"cuBLASLt's heuristic offers no algorithm for the last {main.tail} rows of {sig.key()}")
    _, algo, ws_bytes = t.algos[0]
    pr = problem(sig, "pad_tail")
    esize = ITEMSIZE[geo.dtype_of(sig)]
    desc = a.matmul_desc(pr.transa, pr.transb, pr.epilogue) if pr.bias_input is not None else t.desc
    return _TailCall(a, t, desc, algo, ws_bytes, (main.m * main.a[2] * esize, main.m * esize, main.m * esize))


def _pack_rows(out, src: int, pitch: int, rows: int, row_bytes: int) -> None:
    """``rows`` rows of ``row_bytes`` bytes, ``pitch`` bytes apart from address ``src``, into the
    C-contiguous ``out``: one ``cudaMemcpy2DAsync`` on the current stream (a NumPy ``out``: host
    memory, the emulated library's tests)."""
    if isinstance(out, np.ndarray):
        raw = np.frombuffer((ctypes.c_char * (pitch * (rows - 1) + row_bytes)).from_address(src), np.uint8)
        rows_in = np.lib.stride_tricks.as_strided(raw, (rows, row_bytes), (pitch, 1))
        out.reshape(-1).view(np.uint8).reshape(rows, row_bytes)[...] = rows_in
        return
    import cupy

    cupy.cuda.runtime.memcpy2DAsync(_ptr(out), row_bytes, src, pitch, row_bytes, rows,
                                    cupy.cuda.runtime.memcpyDeviceToDevice, _stream())


def _post_activation(sig: Signature):
    """``run(y)``: the signature's activation on ``y`` in place, 16 bytes per load (the act variant)."""
    run = vector_epilogue_launcher(geo.dtype_of(sig), out_elements(sig), row_length(sig), geo.act_args(sig))
    return lambda y: run(y, None, 1.0, 0.0)


def _stream() -> int:
    try:
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    except ImportError:
        return 0


def candidates(op: str, sig: Signature | None = None) -> list[Candidate]:
    """The heuristic candidate, plus one per algorithm when ``sig`` is given and cuBLASLt lists them here;
    the same for ``cublaslt_bt`` where B's rows are not aligned (``b_transposed_reason``) and for
    ``cublaslt_act`` where the activation is not cuBLASLt's (``post_activation_reason``)."""
    if op not in OPS:
        return []
    out: list[Candidate] = [CublasLtGemm(NAME)]
    if sig is None or lt.unavailable():
        return out
    for name, variant in VARIANTS.items():
        if shape_reason(sig, variant) is not None:
            continue
        if variant:
            out.append(CublasLtGemm(name))
        try:
            algos = _setup_for(sig, variant).algos
        except Exception:  # noqa: BLE001 - no GPU, or the library refuses: the heuristic candidate says why
            continue
        out += [CublasLtGemm(name, cfg) for cfg, _, _ in algos]
    return out


def from_key(op: str, key: str) -> Candidate | None:
    if op not in OPS:
        return None
    name = key.split(":", 1)[0]
    if name not in VARIANTS or (name in GEMM_ONLY and op != "GemmAct") or (name in CBR_ONLY and op != "CBR"):
        return None
    if key == name:
        return CublasLtGemm(name)
    names = [k for k, _, _ in lt.CONFIG]
    try:
        params = tuple((k, int(v)) for k, v in (kv.split("=", 1) for kv in key[len(name) + 1:].split(",")))
    except ValueError:
        return None
    if not params or params[0][0] != "algo" or any(k not in names for k, _ in params):
        return None
    return CublasLtGemm(name, params)
