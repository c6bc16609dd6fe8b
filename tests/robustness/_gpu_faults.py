"""Real CUDA kernels that fault the GPU, as lowering candidates (tests/gpu/test_fault_isolation_gpu.py).

- ``store``: writes through address 8, which no allocation owns -> ``cudaErrorIllegalAddress``;
- ``trap``: executes the PTX ``trap`` instruction -> ``cudaErrorLaunchFailure``;
- ``spin``: busy-waits about 40 s of SM clocks -> the profiler's timeout kills its worker (the spin
  is bounded, so the GPU is free again even if a kill did not stop the kernel).

Either fault leaves the CUDA context of its process unusable (the error is sticky); only the
profiler's worker may suffer it. The source is compiled by NVRTC on the CPU in CI
(tests/robustness/test_fault_isolation.py); the kernels run only on the device.
Module-level so that the profiler's worker can unpickle the candidates.
"""

from __future__ import annotations

import hashlib

from graphopt.lowering.contract import Candidate

FAULT_SOURCE = r"""
extern "C" __global__ void graphopt_fault_store(float* out, unsigned long long addr) {
    *(volatile float*)addr = 1.0f;          // an address no allocation owns: illegal address
    out[threadIdx.x] = 0.0f;
}

extern "C" __global__ void graphopt_fault_trap(float* out) {
    asm volatile("trap;");                  // kernel abort: unspecified launch failure
    out[threadIdx.x] = 0.0f;
}

extern "C" __global__ void graphopt_fault_spin(float* out, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }  // bounded: the GPU is free again afterwards
    out[threadIdx.x] = 0.0f;
}
"""
KERNELS = ("store", "trap", "spin")
BAD_ADDRESS = 8
SPIN_CYCLES = 80_000_000_000  # about 40 s at 2 GHz


class FaultingKernel(Candidate):
    """A candidate whose kernel faults (``how`` = store | trap | spin); it applies to everything."""

    def applies(self, sig, compute_capability=(9, 0)):
        return None

    def source_hash(self):
        return "gpu-fault-" + hashlib.sha256(FAULT_SOURCE.encode()).hexdigest()[:12]

    def build(self, sig, arch):
        import cupy
        import numpy as np

        how = self.param("how")
        if how not in KERNELS:
            raise ValueError(f"unknown fault {how!r}")
        kernel = cupy.RawModule(code=FAULT_SOURCE, options=("-std=c++17",)).get_function(f"graphopt_fault_{how}")
        extra = {"store": (np.uint64(BAD_ADDRESS),), "trap": (), "spin": (np.int64(SPIN_CYCLES),)}[how]

        def launch(inputs, outputs):
            kernel((1,), (1,), (outputs[0], *extra))

        return launch


def faulting(how: str, tag: str = "") -> FaultingKernel:
    """``tag`` makes a distinct candidate (the profiler runs each candidate key once)."""
    return FaultingKernel(f"fault_{how}{tag}", (("how", how),))


def faults_then_real(sig):
    """The end-to-end test's candidates: two faulting kernels first, then every real candidate."""
    from graphopt.kernels import candidates_for

    return [faulting("store"), faulting("trap"), *candidates_for(sig)]
