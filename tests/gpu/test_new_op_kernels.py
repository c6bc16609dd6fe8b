"""The RoPE, GroupNorm and GatedMLP lowerings (and the kernels' QuickGelu / HardSigmoid) on the GPU.

Marker ``gpu``; the module skips without a device. Every candidate that applies runs against the op's
float64 NumPy reference (``OpSchema.reference``) on fresh random inputs (the seed is in the failure
message), odd sizes included, into NaN-poisoned outputs, fp16 and fp32; a second launch on fresh poison
must agree bit for bit. Each family is also captured into a CUDA graph and replayed, and the
heuristic's choice passes the profiler's own checker (``graphopt.kernels.check.checker``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

cupy = pytest.importorskip("cupy")

from _harness import require_device  # noqa: E402

require_device()

from graphopt.kernels import check  # noqa: E402
from graphopt.kernels.heuristic import heuristic_lowering  # noqa: E402
from graphopt.kernels.registry import applicable, candidate_from_key, signature_of  # noqa: E402
from graphopt.kernels.source import device_arch, prebuild  # noqa: E402
from graphopt.lowering.contract import as_lowering  # noqa: E402
from graphopt.ops import get_schema  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
from _runtime_helpers import ort_run, random_feeds, rel_err  # noqa: E402

from graphopt.runtime import Session, to_numpy  # noqa: E402

DTYPES = ("float16", "float32")
TOL = {"float16": 2e-2, "float32": 1e-4}  # max |err| / max |ref|

# (X, cos, sin): LLaMA's [B, H, S, D] with [1, 1, S, D] tables, a [S, D] cache, per-batch tables, odd S and D/2
ROPE = [((2, 3, 5, 8), (1, 1, 5, 8), (1, 1, 5, 8)), ((1, 4, 7, 6), (7, 6), (7, 6)),
        ((3, 5, 10), (3, 1, 10), (1, 5, 10)), ((2, 2, 9, 128), (2, 1, 9, 128), (2, 1, 9, 128)), ((6,), (6,), (6,)),
        ((2, 3, 5, 16), (1, 1, 5, 16), (2, 1, 5, 16))]
# x_bshd=1: X is the head split [B, S, H, D], Y [B, H, S, D]; the tables broadcast to Y
ROPE_BSHD = [((2, 5, 3, 8), (1, 1, 5, 8), (1, 1, 5, 8)), ((2, 9, 2, 128), (2, 1, 9, 128), (2, 1, 9, 128)),
             ((1, 7, 4, 6), (7, 6), (7, 6))]
# (X, num_groups)
GROUPNORM = [((2, 6, 5, 7), 3), ((3, 32, 16, 16), 8), ((1, 12, 33), 4), ((2, 8), 2), ((2, 64, 8, 8), 32),
             ((1, 16, 40, 40), 1)]
GN_ACTS = [{}, {"activation": "SiLU"}, {"activation": "QuickGelu"}, {"activation": "HardSigmoid", "act_alpha": 0.3}]
# (X, N, bias flags)
GLU = [((2, 7, 33), 24, (0, 0)), ((5, 40), 13, (1, 1)), ((1, 3, 64), 32, (1, 0)), ((1, 1, 16), 8, (0, 1))]
GLU_ACTS = [{"activation": "SiLU"}, {"activation": "Gelu"}, {"activation": "GeluTanh"}, {"activation": "QuickGelu"}]


def _rng():
    seed = int(np.random.SeedSequence().entropy % (2**32))
    return np.random.default_rng(seed), seed


def _rope_inputs(shapes, dtype, rng):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _gn_inputs(x, dtype, rng):
    c = x[1]
    return [(2 * rng.standard_normal(x) + 0.5).astype(dtype), rng.standard_normal((c, 1, 1)[: max(1, len(x) - 1)]).astype(dtype),
            rng.standard_normal((c, 1, 1)[: max(1, len(x) - 1)]).astype(dtype)]


def _glu_inputs(x, n, flags, dtype, rng):
    k = x[-1]
    w = lambda: (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)  # noqa: E731
    ins = [rng.standard_normal(x).astype(dtype), w(), w(),
           rng.standard_normal(n).astype(dtype) if flags[0] else None, rng.standard_normal(n).astype(dtype) if flags[1] else None]
    while ins[-1] is None:
        ins.pop()
    return ins


def _cases():
    for dtype in DTYPES:
        for shapes in ROPE:
            for form in (0, 1):
                yield "RoPE", ("rope", shapes), {"interleaved": form}, dtype
        for shapes in ROPE_BSHD:
            for form in (0, 1):
                yield "RoPE", ("rope", shapes), {"interleaved": form, "x_bshd": 1}, dtype
        for x, g in GROUPNORM:
            for act in GN_ACTS:
                yield "GroupNorm", ("gn", x), {"num_groups": g, "epsilon": 1e-5, **act}, dtype
        for x, n, flags in GLU:
            for act in GLU_ACTS:
                yield "GatedMLP", ("glu", x, n, flags), act, dtype


def _inputs(op, spec, dtype, rng):
    if op == "RoPE":
        return _rope_inputs(spec[1], dtype, rng)
    if op == "GroupNorm":
        return _gn_inputs(spec[1], dtype, rng)
    return _glu_inputs(spec[1], spec[2], spec[3], dtype, rng)


def _sig(op, ins, attrs, dtype):
    return signature_of(op, [None if a is None else a.shape for a in ins], [dtype] * len(ins), attrs)


def _params():
    for op, spec, attrs, dtype in _cases():
        ins = _inputs(op, spec, dtype, np.random.default_rng(0))
        ok, _ = applicable(_sig(op, ins, attrs, dtype), (9, 0))
        assert ok, f"no {op} candidate applies to {spec} {dtype}"
        for cand in ok:
            yield pytest.param(op, spec, attrs, dtype, cand.key(),
                               id=f"{op}-{spec[1:]}-{attrs}-{dtype}-{cand.key()}".replace(" ", ""))


def _run(lowering, dev, shape, dtype):
    out = cupy.full(shape, cupy.nan, dtype=dtype)
    lowering(dev, [out])
    cupy.cuda.get_current_stream().synchronize()
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("op,spec,attrs,dtype,key", list(_params()))
def test_candidate_matches_reference(op, spec, attrs, dtype, key):
    rng, seed = _rng()
    ins = _inputs(op, spec, dtype, rng)
    sig = _sig(op, ins, attrs, dtype)
    cand = candidate_from_key(op, key)
    ref = get_schema(op).reference([None if a is None else a.astype(np.float64) for a in ins], attrs)[0].astype(np.float64)
    prebuild(cand.kernels(sig))
    lowering = as_lowering(cand.build(sig, device_arch()))
    dev = [None if a is None else cupy.asarray(a) for a in ins]
    got = cupy.asnumpy(_run(lowering, dev, ref.shape, dtype)).astype(np.float64)
    again = cupy.asnumpy(_run(lowering, dev, ref.shape, dtype)).astype(np.float64)
    assert np.isfinite(got).all(), f"{key} (seed {seed}): {np.count_nonzero(~np.isfinite(got))} of {got.size} outputs unwritten"
    assert np.array_equal(got, again), f"{key} (seed {seed}): a second launch differs"
    err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert err <= TOL[dtype], f"{key} {dtype} (seed {seed}): max error {err:.2e} > {TOL[dtype]}"
    for i, a in enumerate(ins):  # inputs are never modified
        if a is not None:
            assert np.array_equal(cupy.asnumpy(dev[i]), a), f"{key}: input {i} was modified"


@pytest.mark.gpu
@pytest.mark.parametrize("op,spec,attrs,key", [
    ("RoPE", ("rope", ROPE[3]), {"interleaved": 0}, "rope:vec=8"), ("RoPE", ("rope", ROPE[3]), {"interleaved": 1}, "rope:vec=8"),
    ("RoPE", ("rope", ROPE_BSHD[1]), {"interleaved": 0, "x_bshd": 1}, "rope:vec=8"),
    ("GatedMLP", ("glu", (2, 7, 32), 24, (1, 1)), {"activation": "SiLU"}, "cublas_glu")])
def test_unaligned_tensors_take_the_scalar_kernel(op, spec, attrs, key):
    """Contiguous views that start 2 bytes into a buffer (a Split output, say): no 16-byte loads."""
    rng, seed = _rng()
    ins = _inputs(op, spec, "float16", rng)
    sig = _sig(op, ins, attrs, "float16")
    cand = candidate_from_key(op, key)
    ref = get_schema(op).reference([None if a is None else a.astype(np.float64) for a in ins], attrs)[0].astype(np.float64)
    prebuild(cand.kernels(sig))
    lowering = as_lowering(cand.build(sig, device_arch()))

    def shifted(shape):
        n = int(np.prod(shape))
        return cupy.empty(n + 1, dtype="float16")[1:].reshape(shape)

    dev = []
    for a in ins:
        d = shifted(a.shape)
        d[...] = cupy.asarray(a)
        dev.append(d)
    out = shifted(ref.shape)
    out.fill(cupy.nan)
    lowering(dev, [out])
    got = cupy.asnumpy(out).astype(np.float64)
    assert np.isfinite(got).all(), f"{key} (seed {seed}): unwritten outputs"
    err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert err <= TOL["float16"], f"{key} unaligned (seed {seed}): max error {err:.2e}"


CAPTURE = [("RoPE", ("rope", ROPE[0]), {"interleaved": 0}), ("RoPE", ("rope", ROPE[3]), {"interleaved": 1}),
           ("RoPE", ("rope", ROPE_BSHD[1]), {"interleaved": 0, "x_bshd": 1}),
           ("GroupNorm", ("gn", (2, 64, 8, 8)), {"num_groups": 32, "activation": "SiLU"}),
           ("GatedMLP", ("glu", (2, 7, 33), 24, (1, 1)), {"activation": "SiLU"})]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,spec,attrs", CAPTURE, ids=[c[0] + str(i) for i, c in enumerate(CAPTURE)])
def test_heuristic_choice_captures_and_replays(op, spec, attrs, dtype):
    rng, seed = _rng()
    ins = _inputs(op, spec, dtype, rng)
    sig = _sig(op, ins, attrs, dtype)
    name, params, _ = heuristic_lowering(op, sig, (9, 0))
    cand = candidate_from_key(op, f"{name}:{params}" if params else name)
    prebuild(cand.kernels(sig))
    lowering = as_lowering(cand.build(sig, device_arch()))
    assert lowering.capturable
    ref = get_schema(op).reference([None if a is None else a.astype(np.float64) for a in ins], attrs)[0].astype(np.float64)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        dev = [None if a is None else cupy.asarray(a) for a in ins]
        out = cupy.empty(ref.shape, dtype=dtype)
        lowering(dev, [out])  # workspace, handle and kernels exist before the capture
        stream.synchronize()
        stream.begin_capture()
        try:
            lowering.launch(dev, [out], lowering._workspace)
        finally:
            graph = stream.end_capture()
        out.fill(cupy.nan)
        graph.launch(stream)
        stream.synchronize()
        got = cupy.asnumpy(out).astype(np.float64)
    assert np.isfinite(got).all(), f"{cand.key()} (seed {seed}): replay left outputs unwritten"
    err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert err <= TOL[dtype], f"{cand.key()} replay {dtype} (seed {seed}): max error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,spec,attrs", CAPTURE, ids=[c[0] + str(i) for i, c in enumerate(CAPTURE)])
def test_heuristic_choice_passes_the_profilers_checker(op, spec, attrs, dtype):
    ins = _inputs(op, spec, dtype, np.random.default_rng(0))
    sig = _sig(op, ins, attrs, dtype)
    name, params, _ = heuristic_lowering(op, sig, (9, 0))
    assert name != "default"
    cand = candidate_from_key(op, f"{name}:{params}" if params else name)
    prebuild(cand.kernels(sig))
    assert check.checker(sig, as_lowering(cand.build(sig, device_arch()))) is None


NEW_OPS = ("RoPE", "GatedMLP", "GroupNorm")
EXPORTS = ["coverage/llama_torchscript.onnx", "coverage/llama_dynamo.onnx", "coverage/t5enc_dynamo.onnx",
           "coverage/groupnorm_dynamo.onnx", "coverage/groupnorm_torchscript.onnx",
           "coverage/llamadyn_torchscript.onnx"]  # grouped K/V proven through infer_reshape_dims (dynamic dims)


@pytest.mark.gpu
@pytest.mark.parametrize("name", EXPORTS)
def test_optimized_exports_run_the_new_lowerings_on_cuda(name):
    import graphopt

    path = str(ROOT / "models" / name)
    opt = graphopt.optimize(path, gpu="none")[0]
    lowered = {(n.op_type, next((a.s.decode() for a in n.attribute if a.name == "lowering"), "")) for n in opt.graph.node
               if n.domain == "graphopt" and n.op_type in NEW_OPS}
    assert lowered and all(low not in ("", "default") for _, low in lowered), lowered
    feeds = random_feeds(onnx.load(path), np.random.default_rng(11))
    want = ort_run(path, feeds)
    for graphs in (False, True):
        sess = Session(opt, device="cuda", cuda_graphs=graphs)
        for k in range(2):
            got = sess.run(feeds)
            for out, ref in want.items():
                err = rel_err(to_numpy(got[out]), ref)
                assert err <= 1e-2, f"{name} graphs={graphs} run {k} output {out}: relative error {err:.3g}"
        fallbacks = [n for n in sess.plan_summary()["notes"] if n.split(" ")[0] in NEW_OPS + ("RMSNorm",)]  # SkipRMSNorm too
        assert not fallbacks, fallbacks
        print(f"\n{name} graphs={graphs}: {sorted(lowered)}; {sess.graph_status}")
