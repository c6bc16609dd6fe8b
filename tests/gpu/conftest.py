"""GPU tests: everything here carries the ``gpu`` marker; modules skip themselves without a device."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "/tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session", autouse=True)
def _prebuild_all_kernels():
    """Compile every kernel instance once, in parallel worker processes (NVRTC needs no GPU).
    GRAPHOPT_GPU_NO_PREBUILD=1 skips it (a run of provider tests that compiles no own kernel)."""
    import os

    if os.environ.get("GRAPHOPT_GPU_NO_PREBUILD"):
        return
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return
    except Exception:
        return
    import time

    from graphopt.kernels.registry import all_kernel_instances
    from graphopt.kernels.source import prebuild

    t0 = time.perf_counter()
    errors = prebuild(all_kernel_instances())
    print(f"\nprebuilt {len(all_kernel_instances())} kernel instances in {time.perf_counter() - t0:.1f} s; failures: {errors}")
