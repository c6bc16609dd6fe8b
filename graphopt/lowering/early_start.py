"""Whether a lowering's launch may start before the launch before it has finished, measured.

A lowering that declares ``barrier`` (cuDNN's, cuBLASLt's) gets an empty kernel before every launch
(``graphopt.lowering.barrier``): some library kernels are launched with programmatic dependent launch
and may start before the previous kernel on the stream has finished. Most are not: on an H100
(``bench/results/early_start_h100_8ee61e3.json``) only cuDNN's runtime-compiled matmul kernel was;
cuDNN's SDPA and conv plans start with a memset or an ordinary kernel, cuBLASLt's never early. Before
a launch whose first work is launched normally the barrier orders nothing: that work itself starts
only once everything before it is complete, as the barrier would.

Which it is can be read, not guessed: capture an ordinary marker kernel, then the launch, on a side
stream (a capture records, it runs nothing) and read the graph's edges; an edge of type
``CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC`` out of the marker means the launch's first kernel may start
early. The reading is trusted only after a positive control: a second empty kernel (``CONTROL``)
launched after the marker with the programmatic-serialization attribute (``cuLaunchKernelEx``) must
show such an edge, so a reader
that cannot see one (an older driver, a changed struct) keeps every barrier.

Written by hand (ctypes on libcuda) because neither CuPy nor cuda-python as installed here exposes a
graph's edges or ``cuLaunchKernelEx`` (CuPy launches through ``cuLaunchKernel``, without attributes).
``bench/probe_early_start.py`` prints the same reading for many lowerings at once.

Off unless ``GRAPHOPT_MEASURE_BARRIERS=1``: measured on one machine so far, it becomes the default once
the whole-graph replay tests have passed with it on the device (``bench/NOTES_kernels.md``).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable

ENV = "GRAPHOPT_MEASURE_BARRIERS"

# The driver API's numbers (cuda.h, CUDA 12.3+)
NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
              7: "event_record", 10: "mem_alloc", 11: "mem_free", 13: "conditional"}
EDGE_TYPES = {0: "default", 1: "programmatic"}
PORTS = {0: "default", 1: "programmatic", 2: "launch_order"}
ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID (cuda.h)
MARKER = "graphopt_order_marker"
CONTROL = "graphopt_order_control"  # the positive control's early-starting launch: a kernel of its own name
_SOURCE = 'extern "C" __global__ void graphopt_order_marker() {}\nextern "C" __global__ void graphopt_order_control() {}'


class EdgeData(ctypes.Structure):  # CUgraphEdgeData
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding to 8, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_ubyte * 4), ("value", ctypes.c_ubyte * 64)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def enabled() -> bool:
    return os.environ.get(ENV, "").strip() not in ("", "0")


def driver():
    """libcuda with the calls used here declared. ``cuGraphGetEdges_v2`` (with edge data) is what CUDA
    12.3+ exports (CUDA 13's ``cuGraphGetEdges`` is a macro for it); an older driver lacks it, and the
    AttributeError makes the reader a problem (every barrier stays)."""
    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuGraphGetNodes", "cuGraphNodeGetType", "cuGraphKernelNodeGetParams_v2", "cuFuncGetName",
                 "cuKernelGetName", "cuLaunchKernelEx", "cuGraphGetEdges_v2"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} returned CUresult {status}")


def graph_structure(lib, graph: int) -> dict:
    """Nodes (index, type, kernel name) and edges (from, to, type, from port) of a CUgraph handle."""
    g = ctypes.c_void_p(graph)
    n = ctypes.c_size_t(0)
    _check(lib.cuGraphGetNodes(g, None, ctypes.byref(n)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * n.value)()
    _check(lib.cuGraphGetNodes(g, nodes, ctypes.byref(n)), "cuGraphGetNodes")
    index = {nodes[i]: i for i in range(n.value)}
    out_nodes = []
    for i in range(n.value):
        t = ctypes.c_int(-1)
        _check(lib.cuGraphNodeGetType(ctypes.c_void_p(nodes[i]), ctypes.byref(t)), "cuGraphNodeGetType")
        entry = {"index": i, "type": NODE_TYPES.get(t.value, str(t.value))}
        if t.value == 0:
            entry["kernel"] = _kernel_name(lib, nodes[i])
        out_nodes.append(entry)
    m = ctypes.c_size_t(0)
    _check(lib.cuGraphGetEdges_v2(g, None, None, None, ctypes.byref(m)), "cuGraphGetEdges_v2")
    src, dst, data = (ctypes.c_void_p * m.value)(), (ctypes.c_void_p * m.value)(), (EdgeData * m.value)()
    _check(lib.cuGraphGetEdges_v2(g, src, dst, data, ctypes.byref(m)), "cuGraphGetEdges_v2")
    edges = [{"from": index[src[k]], "to": index[dst[k]], "type": EDGE_TYPES.get(data[k].type, str(data[k].type)),
              "from_port": PORTS.get(data[k].from_port, str(data[k].from_port))} for k in range(m.value)]
    return {"nodes": out_nodes, "edges": edges}


def _kernel_name(lib, node) -> str:
    # CUDA_KERNEL_NODE_PARAMS_v2: CUfunction func at offset 0, CUkernel kern at offset 56 (after the grid,
    # block, shared-memory, kernelParams and extra fields); a buffer larger than the struct is harmless.
    buf = (ctypes.c_ubyte * 256)()
    if lib.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), buf) != 0:
        return "?"
    func = ctypes.c_void_p.from_buffer(buf, 0).value
    kern = ctypes.c_void_p.from_buffer(buf, 56).value
    name = ctypes.c_char_p()
    if func and lib.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(func)) == 0 and name.value:
        return name.value.decode(errors="replace")
    if kern and lib.cuKernelGetName(ctypes.byref(name), ctypes.c_void_p(kern)) == 0 and name.value:
        return name.value.decode(errors="replace")
    return "?"


def early_kernels(structure: dict, marker: str = MARKER) -> list[str]:
    """The names of the kernels other than ``marker`` that a programmatic edge enters: those may start
    before the launch before them has finished (the probe's per-lowering reading)."""
    names = {n["index"]: n.get("kernel", n["type"]) for n in structure["nodes"]}
    lowering = {i for i, name in names.items() if name != marker}
    return sorted({names[e["to"]] for e in structure["edges"] if e["type"] == "programmatic" and e["to"] in lowering})


def starts_after_marker_early(structure: dict, marker: str = MARKER) -> bool:
    """Whether a programmatic edge leaves a ``marker`` node: the launch captured after the marker may
    start before the marker has finished. (Edges inside the launch, between its own kernels, are the
    library's own ordering and were there with the barrier as well.)"""
    markers = {n["index"] for n in structure["nodes"] if n.get("kernel") == marker}
    return any(e["type"] == "programmatic" and e["from"] in markers and e["to"] not in markers
               for e in structure["edges"])


_STATE: dict[str, Any] = {}


def marker_kernel(name: str = MARKER):
    """An empty kernel (``MARKER`` or ``CONTROL``), launched normally: one CuPy ``RawKernel`` per
    process, loaded on first use (outside any capture). The probe and the placed timing use it too."""
    import cupy

    if name not in _STATE:
        _STATE[name] = cupy.RawKernel(_SOURCE, name)
        _STATE[name]((1,), (1,), ())
    return _STATE[name]


def _capture(enqueue: Callable[[], None]) -> dict:
    """``enqueue()`` captured after the marker on a fresh side stream; the graph's structure."""
    import cupy

    lib = _STATE.get("lib") or _STATE.setdefault("lib", driver())
    marker = marker_kernel()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            marker((1,), (1,), ())
            enqueue()
        finally:
            graph = stream.end_capture()
    return graph_structure(lib, graph.graph)


def reader_problem() -> str | None:
    """None when this process can read an early start (the positive control showed one), else why not
    (then every barrier stays). Checked once per process."""
    if "reader" not in _STATE:
        try:
            lib = _STATE.get("lib") or _STATE.setdefault("lib", driver())
            control = marker_kernel(CONTROL)
            attr = _LaunchAttribute(id=ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
            attr.value[0] = 1  # programmaticStreamSerializationAllowed

            def pdl_marker():
                import cupy

                cfg = _LaunchConfig(1, 1, 1, 1, 1, 1, 0, cupy.cuda.get_current_stream().ptr,
                                    ctypes.pointer(attr), 1)
                _check(lib.cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(control.kernel.ptr), None, None),
                       "cuLaunchKernelEx")

            seen = starts_after_marker_early(_capture(pdl_marker))
            _STATE["reader"] = None if seen else "the positive control (a launch allowed to start early) showed no programmatic edge"
        except Exception as exc:  # noqa: BLE001 - any failure keeps every barrier
            _STATE["reader"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return _STATE["reader"]


def starts_early(launch: Callable[[Any, Any, Any], Any], inputs, outputs, workspace) -> bool | None:
    """Whether ``launch(inputs, outputs, workspace)`` (without its barrier) may start before the launch
    before it has finished: True, False, or None when it cannot be told now (the current stream is
    being captured: ask again on a later, eager call). Any failure, or a reader that failed its
    positive control, answers True (keep the barrier). Call it after one eager run of the launch, so
    its libraries have loaded what they load on first use outside the capture."""
    try:
        import cupy

        if cupy.cuda.get_current_stream().is_capturing():
            return None
        if reader_problem() is not None:
            return True
        return starts_after_marker_early(_capture(lambda: launch(inputs, outputs, workspace)))
    except Exception:  # noqa: BLE001 - unknown: keep the barrier
        return True
