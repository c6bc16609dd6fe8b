"""The tensor-core candidates (CBR's ``implicit_gemm``, ``implicit_gemm_nhwc``, ``pointwise_gemm``,
GemmAct's ``mma_gemm``) and the attention kernels pass the kernels exactly the arguments they passed
before their build/launch code was shared (``graphopt.kernels.mma_args``): same order, same values,
same NumPy scalar types. Runs on the CPU: ``cupy`` is a NumPy stand-in and each kernel a recorder.

The expected tuples are in ``data/launch_args.json``, recorded from the code before the change
(``python tests/unit/test_kernels_launch_args.py --record`` writes them again: only do that for a
deliberate change of a kernel's arguments)."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from graphopt.kernels import attention, attention_cublas, attention_plan, cbr_mma, gemm_act, geometry, mma_tiles
from graphopt.kernels.registry import signature_of

DATA = Path(__file__).parent / "data" / "launch_args.json"


class _Dev(np.ndarray):
    """A NumPy array with CuPy's ``.data.ptr``."""

    @property
    def data(self):  # noqa: D401 - CuPy's attribute
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


def _dev(a) -> _Dev:
    out = np.zeros(np.shape(a), dtype=np.asarray(a).dtype).view(_Dev)
    out[...] = a
    return out


def _fake_cupy():
    m = types.ModuleType("cupy")
    m.float32, m.int32 = np.float32, np.int32
    m.asarray = _dev
    m.empty = lambda shape, dtype=np.float32: _dev(np.zeros(shape, dtype=dtype))
    m.zeros = m.empty
    m.ascontiguousarray = lambda a: _dev(np.ascontiguousarray(a))
    m.broadcast_to = np.broadcast_to
    return m


class _Kernel:
    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def __call__(self, grid, block, args, shared_mem=0):
        self.log.append((self.name, grid, block, args, shared_mem))


def _describe(value, names: dict[int, str]):
    if isinstance(value, np.ndarray) and value.ndim > 0:
        if id(value) in names:
            return names[id(value)]
        return ["array", list(value.shape), str(value.dtype), hashlib.sha1(np.ascontiguousarray(value).tobytes()).hexdigest()[:12]]
    if isinstance(value, np.generic):
        return [type(value).__name__, value.item()]
    return [type(value).__name__, value]


def _record(cand, sig, inputs: dict[str, np.ndarray], monkeypatch) -> list:
    log: list = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    # every module that compiles a kernel these candidates launch
    for mod in (mma_tiles, cbr_mma, gemm_act, attention_plan, attention_cublas):
        monkeypatch.setattr(mod, "get_kernel", lambda src, expr, arch=None: _Kernel(log, expr))
    launch = cand.build(sig, "sm_90")
    launch = getattr(launch, "launch", launch)
    names = {id(a): k for k, a in inputs.items() if a is not None}
    ins = [inputs[k] for k in inputs if k != "Y"]
    launch(ins, [inputs["Y"]])
    return [[kname, list(grid), list(block), [_describe(a, names) for a in args], smem]
            for kname, grid, block, args, smem in log]


def _conv_case(shape_x, shape_w, attrs, dtype, residual=None, bias=True):
    rng = np.random.default_rng(0)
    shapes = [shape_x, shape_w, (shape_w[0],) if bias else None, residual]
    sig = signature_of("CBR", shapes, [dtype, dtype, dtype if bias else "", dtype if residual else ""], attrs)
    g = geometry.conv_geom(sig)
    inputs = {"X": _dev(rng.standard_normal(shape_x).astype(dtype)), "W": _dev(rng.standard_normal(shape_w).astype(dtype)),
              "B": _dev(rng.standard_normal(shape_w[0]).astype(dtype)) if bias else None,
              "R": _dev(rng.standard_normal(residual).astype(dtype)) if residual else None,
              "Y": _dev(np.zeros(g.out_shape, dtype))}
    return sig, inputs


CONV = {
    "3x3": (((2, 64, 14, 14), (64, 64, 3, 3), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1],
                                                "activation": "Relu"}, "float16", (2, 64, 14, 14))),
    "3x3s2_dil_grouped": (((1, 32, 17, 19), (64, 16, 3, 3), {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2], "strides": [2, 2],
                                                           "dilations": [2, 2], "group": 2, "activation": "LeakyRelu",
                                                           "alpha": 0.2}, "float32", (64, 1, 1))),
    "1x1": (((2, 64, 8, 8), (128, 64, 1, 1), {"kernel_shape": [1, 1], "activation": "Clip", "min": 0.0, "max": 6.0},
             "float16", None)),
}

MMA_CONFIGS = {
    "implicit_gemm": [(("bm", 64), ("bn", 64), ("bk", 32), ("wm", 2), ("wn", 2), ("splitk", 1)),
                      (("bm", 64), ("bn", 32), ("bk", 32), ("wm", 2), ("wn", 1), ("splitk", 2))],
    "implicit_gemm_nhwc": [(("bm", 64), ("bn", 64), ("bk", 32), ("wm", 2), ("wn", 2), ("splitk", 1)),
                           (("bm", 64), ("bn", 64), ("bk", 32), ("wm", 2), ("wn", 2), ("splitk", 1), ("st", 3))],
    "pointwise_gemm": [(("bm", 64), ("bn", 64), ("bk", 32), ("wm", 2), ("wn", 2), ("splitk", 1)),
                       (("bm", 64), ("bn", 32), ("bk", 32), ("wm", 2), ("wn", 1), ("splitk", 2))],
}
_CLASSES = {"implicit_gemm": "ImplicitGemmConv", "implicit_gemm_nhwc": "ImplicitGemmNhwcConv",
            "pointwise_gemm": "PointwiseGemmConv"}


def _gemm_case(a, b, c, dtype, attrs):
    rng = np.random.default_rng(1)
    sig = signature_of("GemmAct", [a, b, c], [dtype, dtype, dtype if c else ""], attrs)
    p = gemm_act.gemm_plan(sig)
    inputs = {"A": _dev(rng.standard_normal(a).astype(dtype)), "B": _dev(rng.standard_normal(b).astype(dtype)),
              "C": _dev(rng.standard_normal(c).astype(dtype)) if c else None, "Y": _dev(np.zeros(p.out_shape, dtype))}
    return sig, inputs


GEMM = {
    "2d_bias_gelu": ((64, 96), (96, 128), (128,), "float16", {"activation": "Gelu"}),
    "batched": ((2, 3, 32, 64), (2, 3, 64, 48), None, "float32", {}),
}


def _attn_case(dtype, mask, kt):
    rng = np.random.default_rng(2)
    B, H, S, D = 1, 2, 64, 32 if dtype == "float32" else 64
    q, k = (B, H, S, D), ((B, H, D, S) if kt else (B, H, S, D))
    attrs = {"k_transposed": int(kt), "mask_kind": mask, "causal": int(mask == "none")}
    mshape = (B, 1, 1, S) if mask != "none" else None
    mdt = dtype if mask == "additive" else ("bool" if mask == "bool" else "")
    sig = signature_of("Attention", [q, k, q, mshape], [dtype, dtype, dtype, mdt], attrs)
    inputs = {"Q": _dev(rng.standard_normal(q).astype(dtype)), "K": _dev(rng.standard_normal(k).astype(dtype)),
              "V": _dev(rng.standard_normal(q).astype(dtype)),
              "M": _dev((rng.standard_normal(mshape) > 0).astype(mdt)) if mshape else None,
              "Y": _dev(np.zeros(q, dtype))}
    return sig, inputs


ATTN = {"fp16_additive_kt": ("float16", "additive", True), "fp32_bool": ("float32", "bool", False),
        "fp16_causal": ("float16", "none", False)}


def _cases():
    """(case id, candidate, (sig, inputs)) for every recorded case."""
    out = []
    for conv, (x, w, attrs, dt, res) in CONV.items():
        for name, configs in MMA_CONFIGS.items():
            for params in configs:
                cand = getattr(cbr_mma, _CLASSES[name])(name, params)
                sig, inputs = _conv_case(x, w, attrs, dt, res)
                if cand.applies(sig) is None:
                    out.append((f"{conv}/{cand.key()}", cand, (sig, inputs)))
    for case, (a, b, c, dt, attrs) in GEMM.items():
        for params in MMA_CONFIGS["pointwise_gemm"]:
            cand = gemm_act.MmaGemm("mma_gemm", params)
            sig, inputs = _gemm_case(a, b, c, dt, attrs)
            if cand.applies(sig) is None:
                out.append((f"{case}/{cand.key()}", cand, (sig, inputs)))
    for case, (dt, mask, kt) in ATTN.items():
        cands = [attention.FlashAttention("flash", (("dmax", 64), ("bm", 32), ("warps", 4))),
                 attention.FlashAttention("flash", (("dmax", 32), ("bm", 16), ("warps", 4))),
                 attention.FlashMmaAttention("flash_mma", (("hd", 64), ("bn", 64), ("stages", 2)))]
        for cand in cands:
            sig, inputs = _attn_case(dt, mask, kt)
            if cand.applies(sig) is None:
                out.append((f"{case}/{cand.key()}", cand, (sig, inputs)))
    return out


def _recorded() -> dict:
    return json.loads(DATA.read_text()) if DATA.exists() else {}


@pytest.mark.parametrize("case", [c[0] for c in _cases()])
def test_kernel_arguments_are_those_recorded_before_the_shared_build_path(case, monkeypatch):
    expected = _recorded()
    assert case in expected, f"{case}: not recorded (run this file with --record on the reference code)"
    _, cand, (sig, inputs) = next(c for c in _cases() if c[0] == case)
    assert json.loads(json.dumps(_record(cand, sig, inputs, monkeypatch))) == expected[case]


def test_every_tensor_core_family_and_mode_is_covered():
    cases = [c[0] for c in _cases()]
    for name in list(MMA_CONFIGS) + ["mma_gemm", "flash:", "flash_mma:"]:
        assert any(f"/{name}" in c for c in cases), name
    assert any("st=3" in c for c in cases) and any("splitk=2" in c for c in cases)


if __name__ == "__main__" and "--record" in sys.argv:
    recorded = {}
    with pytest.MonkeyPatch.context() as mp:
        for case, cand, (sig, inputs) in _cases():
            recorded[case] = _record(cand, sig, inputs, mp)
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(recorded)} cases in {DATA}")
