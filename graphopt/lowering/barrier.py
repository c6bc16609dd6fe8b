"""An ordering barrier on the current CUDA stream: one empty kernel.

Why: on the H200 a tuned ResNet-50 (cuDNN and cuBLASLt lowerings) was right when run eagerly but
wrong, and different on every replay, from a whole-plan CUDA graph (up to 0.43 max relative error;
``bench/results/diagnose_capture_resnet50_h200.json``). Some cuDNN kernels are launched with
programmatic dependent launch: they may start before the previous kernel on the stream has
finished and wait only for that one kernel's data. Ordering is then not transitive: a kernel can
read a tensor written two kernels earlier while that kernel is still running. Eager runs hid it
behind their host gaps; a graph's back-to-back launches exposed it. A normally launched kernel
starts only when everything before it on the stream is complete, and the next kernel cannot start
before it has, so one empty kernel before such a lowering restores stream order. Measured in the
same run: the graph's results became exact (equal to the eager run's) and its replay time did not
change measurably (1.292 ms with 54 barriers against 1.296 ms without).

Written by hand because neither CuPy nor the libraries offer a stream barrier that a CUDA graph
captures as a node: an event record is no node, and a memset node cost 56-93 us over the same 54 steps.

On sm_90 and later the barrier releases its dependents as soon as it starts
(``griddepcontrol.launch_dependents``): a library kernel launched with programmatic dependent launch
after it may then begin its prologue while the barrier is still being retired, instead of after. That
keeps the ordering whole: the barrier itself, launched normally, starts only when everything before it
on the stream has completed, so whatever may start once it has started finds all earlier work done
(and a dependent's own wait still covers the barrier, which writes nothing). Without the release, the
next library kernel waits for the empty kernel to finish. It did not remove the barrier's cost: on the
H200, back-to-back cuDNN SDPA calls with it still take 0.9-1.5 us more at 128-512 keys than without the
barrier (bench/NOTES_kernels.md, 2026-12-06, ninth session); that is the attention table's whole gap to
torch's SDPA, and skipping the barrier soundly needs to know which launches may start early (the
probe ``bench/probe_early_start.py``). The release stays: it is sound, and the whole-graph replay test
passed with it on the H200.
"""

from __future__ import annotations

_SOURCE = r"""extern "C" __global__ void graphopt_stream_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}"""
_KERNEL: list = []


def barrier() -> None:
    """Enqueue the barrier on CuPy's current stream (compiled on first use: call it once outside
    any capture, as every lowering's first, eager run does)."""
    if not _KERNEL:
        import cupy

        _KERNEL.append(cupy.RawKernel(_SOURCE, "graphopt_stream_barrier"))
    _KERNEL[0]((1,), (1,), ())
