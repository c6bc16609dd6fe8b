"""Every CUDA source and every kernel configuration compiles under NVRTC, for sm_80 and sm_90.

Runs on the CPU (no GPU, no driver): it needs the NVRTC shared library, from the pip packages
``cupy-cuda13x`` and ``nvidia-cuda-nvrtc``; without them it is skipped with the reason.

Every template instance any candidate can build is compiled to a cubin for each arch, so the C++
front end, the template static_asserts and ptxas (which checks the inline PTX: mma.sync, ldmatrix,
cvt) all run. NVRTC's fast-compile mode (``-Ofc=max``) keeps this to seconds; one instance of the
tensor-core kernel is also compiled with full optimisation, as the GPU path does.
"""

from __future__ import annotations

import pytest

from graphopt.kernels.registry import all_kernel_instances
from graphopt.kernels.source import SOURCES, NvrtcUnavailable, nvrtc_compile

ARCHS = ("sm_80", "sm_90")


def _nvrtc_reason() -> str | None:
    try:
        nvrtc_compile("elementwise.cu", ["spin"], "compute_80")
    except NvrtcUnavailable as exc:
        return str(exc)
    return None


REASON = _nvrtc_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"NVRTC not importable: {REASON}")


def _groups() -> dict[tuple[str, str], list[str]]:
    """Instances grouped by (source, template<dtype,...): one NVRTC program per group."""
    groups: dict[tuple[str, str], list[str]] = {}
    for src, expr in all_kernel_instances():
        groups.setdefault((src, expr.split(",")[0]), []).append(expr)
    return groups


def test_every_source_is_covered():
    assert {src for src, _ in all_kernel_instances()} == set(SOURCES)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("group", sorted(_groups()), ids=lambda g: f"{g[0]}:{g[1]}")
def test_instances_compile(arch, group):
    exprs = _groups()[group]
    cubin = nvrtc_compile(group[0], exprs, arch, fast=True)
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_core_kernel_compiles_optimised(arch):
    cubin = nvrtc_compile("mma_gemm.cu", ["mma_gemm<half_t,2,64,32,32,2,1,0>", "mma_gemm<float,3,64,32,32,2,1,1>",
                                          "mma_gemm<half_t,3,128,128,32,2,2,1,4>"], arch)
    assert cubin[:4] == b"\x7fELF"


def test_bad_config_is_rejected_at_compile_time():
    # BN=32 cannot be split over 4 warps of 16 columns: the kernel's static_assert must fire.
    with pytest.raises(Exception, match="warp tile"):
        nvrtc_compile("mma_gemm.cu", ["mma_gemm<half_t,2,64,32,32,2,4,0>"], "sm_90", fast=True)


def test_gather_mode_has_no_pipeline():
    with pytest.raises(Exception, match="no cp.async pipeline"):
        nvrtc_compile("mma_gemm.cu", ["mma_gemm<half_t,2,64,64,32,2,2,0,3>"], "sm_90", fast=True)
