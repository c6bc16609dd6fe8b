"""Every LayerNorm / SkipLayerNorm / RMSNorm config against graphopt's float64 reference on the GPU.

Marker ``gpu``; the module skips without a device. Rows are odd in number, row lengths cover the
16-byte and the scalar paths (37 is odd), GPT-2 / BERT sizes (768, 1024) and long rows (4096, 8192);
fp16 and fp32; the sum output S is checked too, and a second launch on fresh poison must agree.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

from graphopt.lowering.contract import Signature  # noqa: E402
from graphopt.kernels.norm import norm_candidates  # noqa: E402
from graphopt.kernels.source import device_arch, prebuild  # noqa: E402
from graphopt.ops import get_schema  # noqa: E402

TOL = {"float16": 1e-2, "float32": 1e-5}  # max |err| / max |ref|
DTYPES = ("float16", "float32")
DIMS = (37, 768, 1024, 4096, 8192)
ROWS = (13, 3)
# (op, bias, skip, skip_bias, sum_output); skip 2: broadcast over the leading dim ([1, 3, D], as
# position embeddings are added to [B, S, D])
VARIANTS = [("LayerNorm", 1, 0, 0, 0), ("LayerNorm", 0, 0, 0, 0), ("LayerNorm", 1, 1, 0, 0), ("LayerNorm", 1, 1, 1, 1),
            ("LayerNorm", 0, 1, 0, 1), ("LayerNorm", 1, 2, 1, 1), ("RMSNorm", 0, 0, 0, 0), ("RMSNorm", 0, 1, 0, 1),
            ("RMSNorm", 0, 2, 0, 0)]


def _data(op, bias, skip, sb, d, dtype):
    rng = np.random.default_rng(zlib.crc32(f"{op}{bias}{skip}{sb}{d}{dtype}".encode()))
    shape = ROWS + (d,)
    x = (2 * rng.standard_normal(shape) + 0.5).astype(dtype)
    ins = [x, rng.standard_normal(d).astype(dtype)]
    if op == "LayerNorm":
        ins += [rng.standard_normal(d).astype(dtype) if bias else None,
                rng.standard_normal(shape if skip == 1 else (1,) + shape[1:]).astype(dtype) if skip else None,
                rng.standard_normal(d).astype(dtype) if sb else None]
    elif skip:  # SkipRMSNorm: [X, scale, skip]
        ins.append(rng.standard_normal(shape if skip == 1 else (1,) + shape[1:]).astype(dtype))
    return ins


def _cases():
    for op, bias, skip, sb, so in VARIANTS:
        for d in DIMS:
            for dtype in DTYPES:
                ins = _data(op, bias, skip, sb, d, dtype)
                sig = Signature.make(op, [None if a is None else a.shape for a in ins], [dtype] * len(ins),
                                     {"epsilon": 1e-5, "sum_output": so})
                for cand in norm_candidates():
                    if cand.applies(sig, (9, 0)) is None:
                        yield pytest.param(op, bias, skip, sb, so, d, dtype, cand,
                                           id=f"{op}-b{bias}s{skip}sb{sb}sum{so}-{d}-{dtype}-{cand.key()}")


@pytest.mark.gpu
@pytest.mark.parametrize("op,bias,skip,sb,so,d,dtype,cand", list(_cases()))
def test_norm_candidate(op, bias, skip, sb, so, d, dtype, cand):
    ins = _data(op, bias, skip, sb, d, dtype)
    attrs = {"epsilon": 1e-5, "sum_output": so}
    sig = Signature.make(op, [None if a is None else a.shape for a in ins], [dtype] * len(ins), attrs)
    refs = get_schema(op).reference([None if a is None else a.astype(np.float64) for a in ins], attrs)
    prebuild(cand.kernels(sig))
    launch = cand.build(sig, device_arch())
    dev = [None if a is None else cupy.asarray(a) for a in ins]
    results = []
    for _ in range(2):
        outs = [cupy.full(ins[0].shape, cupy.nan, dtype=dtype) for _ in refs]
        launch(dev, outs)
        cupy.cuda.get_current_stream().synchronize()
        results.append([cupy.asnumpy(o).astype(np.float64) for o in outs])
    for got, again, ref, name in zip(results[0], results[1], refs, ("Y", "S")):
        assert np.isfinite(got).all(), f"{cand.key()}: {name} has unwritten or non-finite elements"
        assert np.array_equal(got, again), f"{cand.key()}: a second launch gives a different {name}"
        err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
        assert err <= TOL[dtype], f"{cand.key()} {dtype} {name}: max error {err:.2e} > {TOL[dtype]}"
