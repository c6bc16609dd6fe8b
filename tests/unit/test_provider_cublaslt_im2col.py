"""cuBLASLt's ``im2col`` variant (image stems) without a GPU: ``im2col_rows`` (im2col_rows.cu) emulated
thread by thread on the real launch arguments (the block's taps, each thread's vectors through them into a
poisoned tile, the tile's contiguous stores, the zero padding of K, the weight rows after the image rows)
writing into a poisoned host workspace, then
the GEMM on EmulatedLt from the descriptors, compared with the float64 CBR reference; the layouts
it declares, its workspace, keys, and the near misses. The GPU runs the kernel itself
(tests/gpu/test_provider_cublaslt.py)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from _fake_cublaslt import conv
from graphopt.kernels import gemm_act, source
from graphopt.providers import cublaslt as prov
from test_provider_cublaslt_emulated import _aligned, _fake_activation_kernel, _host_and_reference

STEMS = [
    conv((2, 3, 11, 13), (8, 3, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3], activation="Relu", dtype="float32"),
    conv((2, 3, 11, 13), (8, 3, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3], activation="Relu"),  # ResNet's, fp16
    conv((1, 3, 9, 9), (16, 3, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1], activation="Clip", clip_min=0.0,
         clip_max=6.0),                                                          # MobileNet's: ReLU6 after
    conv((2, 4, 10, 9), (8, 4, 3, 2), bias=False, dilations=[2, 1], pads=[1, 0, 2, 1], dtype="float32"),
    conv((2, 3, 17), (4, 3, 5), strides=[3], pads=[2, 1], activation="GeluTanh", dtype="float32"),  # 1-D
]


def _host_view(address: int, count: int, dtype) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(address), dtype)


def _im2col_rows_emulated(launches):
    """``im2col_rows<T, VEC>`` as its threads run it: the block's taps first (each k's offset from the
    pixel's window origin and its window position; 0s past K, which the gather tests by k), then blocks of
    (32, 8) over tiles of 32 rows (the grid-stride loop), threadIdx.x the row, threadIdx.y striding over
    the row's vectors, each value read through its tap where the tap lands inside X, each vector into the
    block's tile in shared memory (poisoned first, rows at an odd stride of vectors; taps and tile sized
    by the launch's shared_mem); then the tile's vectors stored in order over the block's flat thread
    index (its (row, vector) advanced without a division) into the one span of cols they make; then the
    weights over the grid's flat thread index."""

    def kernel(grid, block, args, shared_mem=0):
        x, w, cols, wp, *geom = args
        C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, rows, K, Kp, M = (int(v) for v in geom)
        launches.append((grid, block, (C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, rows, K, Kp, M)))
        assert block == (32, 8)
        dt, vec = x.dtype, 16 // x.itemsize
        assert Kp % vec == 0 and all(isinstance(a, np.uint64) for a in (cols, wp))
        assert int(cols) % 16 == 0 and int(wp) % 16 == 0  # the vector stores
        xf, wf = x.reshape(-1), w.reshape(-1)
        out_c, out_w = _host_view(int(cols), rows * Kp, dt), _host_view(int(wp), M * Kp, dt)
        chunks, tiles = Kp // vec, (rows + 31) // 32
        stride = chunks | 1
        assert stride % 2 == 1 and shared_mem == Kp * 16 + 32 * stride * 16  # taps, then the tile
        taps = []  # (off, r, s) of every k < Kp; 0s past K
        for k in range(Kp):
            s, r, c = k % KW, (k // KW) % KH, k // (KW * KH)
            taps.append(((c * H + r * dh) * W + s * dw, r * dh, s * dw) if k < K else (0, 0, 0))
            assert abs(taps[-1][0]) < 2**31  # the kernel's int offset
        flat_threads = block[0] * block[1]
        for b in range(grid[0]):
            for tile in range(b, tiles, grid[0]):
                smem = np.full((32 * stride, vec), np.nan, dt)
                for ty in range(block[1]):
                    for tx in range(block[0]):
                        row = tile * 32 + tx
                        if row >= rows:
                            continue
                        ow, t = row % OW, row // OW
                        ih0, iw0, n = (t % OH) * sh - ph, ow * sw - pw, t // OH
                        origin = n * C * H * W + ih0 * W + iw0
                        for ch in range(ty, chunks, block[1]):
                            v = np.zeros(vec, dt)
                            for j in range(vec):
                                off, tr, ts = taps[ch * vec + j]
                                if ch * vec + j < K and 0 <= ih0 + tr < H and 0 <= iw0 + ts < W:
                                    v[j] = xf[origin + off]
                            smem[tx * stride + ch] = v
                # __syncthreads, then the tile's vectors, contiguous in cols from its first row
                row0 = tile * 32
                n_vec = min(32, rows - row0) * chunks
                dq, dr = flat_threads // chunks, flat_threads % chunks
                for flat in range(flat_threads):
                    q, rem = flat // chunks, flat % chunks
                    for i in range(flat, n_vec, flat_threads):
                        assert q * chunks + rem == i
                        start = row0 * Kp + i * vec
                        out_c[start:start + vec] = smem[q * stride + rem]
                        q, rem = q + dq, rem + dr
                        if rem >= chunks:
                            q, rem = q + 1, rem - chunks
        threads = grid[0] * block[0] * block[1]
        for start in range(threads):
            for j0 in range(start, M * chunks, threads):
                m, k0 = j0 // chunks, (j0 % chunks) * vec
                out_w[j0 * vec:(j0 + 1) * vec] = [wf[m * K + k0 + j] if k0 + j < K else 0 for j in range(vec)]

    return kernel


@pytest.mark.parametrize("sig", STEMS, ids=lambda s: s.key()[:70])
def test_im2col_rows_then_the_gemm_compute_the_cbr_reference(emulated, monkeypatch, sig):
    launches, acts = [], []
    monkeypatch.setattr(source, "get_kernel", lambda src, expr: _im2col_rows_emulated(launches))
    monkeypatch.setattr(gemm_act, "get_kernel", lambda src, expr: _fake_activation_kernel(acts))
    assert prov.im2col_reason(sig) is None
    cands = [c for c in prov.candidates("CBR", sig) if c.name == prov.NAME_IM2COL]
    assert cands and cands[0].key() == "cublaslt_im2col"
    assert all(prov.from_key("CBR", c.key()) == c for c in cands) and prov.from_key("GemmAct", cands[-1].key()) is None
    dt = np.dtype(sig.dtypes[0])
    kp = prov.im2col_depth(int(np.prod(sig.input_shapes[1][1:])), sig.dtypes[0])
    assert kp % (16 // dt.itemsize) == 0 and kp >= int(np.prod(sig.input_shapes[1][1:]))
    post = sig.attr("activation", "none") not in prov.ACTIVATIONS
    want = [("im2col_rows.cu", f"im2col_rows<{'half_t' if dt == np.float16 else 'float'},{16 // dt.itemsize}>")]
    if post:
        want.append(("elementwise.cu", f"epilogue_gemm_vec<{'half_t' if dt == np.float16 else 'float'},{16 // dt.itemsize},1>"))
    assert cands[0].kernels(sig) == want
    assert cands[0].source_hash() != prov.CublasLtGemm("cublaslt").source_hash()
    host, ref = _host_and_reference(sig, 7)
    ys = []
    for cand in (cands[0], cands[-1]):
        low = cand.build(sig, "sm_90")
        assert not low.barrier  # the launch opens with the packing kernel, an ordinary launch
        assert low.layouts[:2] == ("NCHW", "NCHW") and low.output_layout(len([h for h in host if h is not None]), 0) == "NHWC"
        rows = ref.shape[0] * int(np.prod(ref.shape[2:]))
        assert low.workspace_bytes >= (rows + ref.shape[1]) * kp * dt.itemsize
        ins = [None if h is None else _aligned(h) for h in host]
        ws = _aligned(np.full(low.workspace_bytes, 0xFF, np.uint8))  # poisoned: NaN where a pad zero is missed
        y = _aligned(np.full((rows, ref.shape[1]), np.nan, dt))  # NHWC rows
        ys.append(y.ctypes.data)
        low.launch([i for i in ins if i is not None] if len(ins) < 3 else ins[:3], [y], ws)
        got = np.moveaxis(y.reshape((ref.shape[0],) + ref.shape[2:] + (ref.shape[1],)), -1, 1).astype(np.float64)
        tol = 1e-5 if dt == np.float32 else 1e-2
        assert np.linalg.norm(got - ref) <= tol * np.linalg.norm(ref), cand.key()
        with pytest.raises(Exception, match="workspace"):
            low.launch(ins[:3], [y], None)
        with pytest.raises(Exception, match="C-contiguous"):
            low.launch([np.asfortranarray(ins[0])] + ins[1:3], [y], ws)
    assert len(launches) == 2 and launches[0][1] == (32, 8)
    assert len(acts) == (2 if post else 0)
    mm = [e for e in emulated.log if e[0] == "matmul_d"]
    assert [e[1] for e in mm] == ys  # D is Y itself


@pytest.mark.parametrize("sig, why", [
    (conv((2, 5, 9, 9), (8, 5, 3, 3)), "input channels"),
    (conv((2, 3, 9, 9), (3, 1, 3, 3), group=3), "grouped"),
    (conv((2, 3, 9, 9), (8, 3, 3, 3), res=True, pads=[1, 1, 1, 1]), "residual"),
    (conv((2, 3, 9, 9), (8, 3, 1, 1)), "a GEMM already"),
    (conv((2, 3, 9, 9), (12, 3, 3, 3), activation="HardSwish"), "16-byte vectors"),
    (conv((2, 3, 9, 9), (8, 3, 3, 3), dtype="bfloat16"), "dtype bfloat16"),
    # 4 * 11 * 11 = 484 fp32 values a row: 484 taps and 32 rows at 121 vectors, 69,696 bytes (fp16's 488 fit)
    (conv((1, 4, 23, 23), (8, 4, 11, 11), dtype="float32"), "shared memory"),
    # a review's case: a dilation of 70000 rows of 32768 puts tap offsets past 2**31
    (conv((1, 1, 32768, 32768), (8, 1, 2, 1), dilations=[70000, 1], pads=[40000, 0, 0, 0], strides=[64, 64]),
     "2**31 elements"),
])
def test_im2col_near_misses_say_why(emulated, sig, why):
    assert why in (prov.im2col_reason(sig) or "")
    assert why in (prov.CublasLtGemm(prov.NAME_IM2COL).applies(sig) or "")
    assert not [c for c in prov.candidates("CBR", sig) if c.name == prov.NAME_IM2COL]


def test_a_one_by_one_conv_with_end_padding_is_not_a_plain_gemm_and_takes_im2col(emulated):
    sig = conv((2, 3, 9, 9), (8, 3, 1, 1), pads=[0, 0, 1, 1], dtype="float32")
    assert prov.shape_reason(sig) is not None and prov.im2col_reason(sig) is None


def test_im2col_key_is_for_cbr_only():
    assert prov.from_key("CBR", "cublaslt_im2col") == prov.CublasLtGemm(prov.NAME_IM2COL)
    assert prov.from_key("GemmAct", "cublaslt_im2col") is None
    assert "is for CBR" in prov.im2col_reason(
        __import__("_fake_cublaslt").gemm((8, 64), (64, 32)))


def test_im2col_rows_grid_stride_covers_every_tile_with_one_block(emulated, monkeypatch):
    """A grid smaller than the tiles (the launch caps it at 132 * 32 blocks): one block loops over all."""
    import dataclasses

    launches = []
    monkeypatch.setattr(source, "get_kernel", lambda src, expr: _im2col_rows_emulated(launches))
    of = prov._Im2col.of
    monkeypatch.setattr(prov._Im2col, "of", classmethod(lambda cls, sig: dataclasses.replace(of(sig), grid=1)))
    sig = STEMS[0]
    host, ref = _host_and_reference(sig, 9)
    low = prov.CublasLtGemm(prov.NAME_IM2COL).build(sig, "sm_90")
    rows = ref.shape[0] * int(np.prod(ref.shape[2:]))
    assert rows > 64  # several tiles of 32 rows
    ws = _aligned(np.full(low.workspace_bytes, 0xFF, np.uint8))
    y = _aligned(np.full((rows, ref.shape[1]), np.nan, np.float32))
    low.launch([_aligned(h) for h in host[:3]], [y], ws)
    assert launches[0][0] == (1,)
    got = np.moveaxis(y.reshape((ref.shape[0],) + ref.shape[2:] + (ref.shape[1],)), -1, 1).astype(np.float64)
    assert np.linalg.norm(got - ref) <= 1e-5 * np.linalg.norm(ref)
