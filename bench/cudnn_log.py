"""Read cuDNN's API log (``CUDNN_LOGLEVEL_DBG=3``): which engine configurations a process executed, and how often.

``bench/stem_engines.py`` (H100, 2026-12-07, code bf317c9) found torch's convolution for ResNet-50's stem running
``sm90_xmma_fprop_image_first_layer_..._k64c4r7s7`` after cuDNN's own ``nhwcAddPaddingKernel``, a kernel no
heuristic plan and no engine id (default knobs) of graphopt's convolution graph reaches. Torch builds its plans
through cuDNN's backend API too, so the configuration it runs is in cuDNN's API log: the last
``cudnnBackendExecute`` block prints its execution plan, engine id and knob choices; a legacy call
(``cudnnConvolutionForward``) prints its algorithm instead. No library parses this log (cuDNN documents it for
people), hence these few regular expressions; whatever they miss stays in the excerpt written beside them.

Block format (cuDNN 9.19 as torch 2.11 loads it, H100, 2026-12-07; ``tests/unit/data/cudnn_api_torch_stem_h100.log``;
a call's return prints a second block of the same function with only its status)::

    I! CuDNN (v91900 56) function cudnnBackendExecute() called:
    i!     executionPlan: type=CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
    i!         engineCfg: type=CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
    i!             engine: type=CUDNN_BACKEND_ENGINE_DESCRIPTOR:
    i!                 engine_id: type=int; val=47;
    i!             knobChoices: ...
    i!                 CUDNN_KNOB_TYPE_TILE_SIZE: type=int; val=2;
"""

from __future__ import annotations

import re

_HEAD = re.compile(r"^[IWE]! CuDNN \(v[^)]*\) function (\w+)\(\) called:")
_ENGINE = re.compile(r"engine_?id: type=\w+; val=(-?\d+)", re.IGNORECASE)
_KNOB = re.compile(r"CUDNN_KNOB_TYPE_(\w+): type=\w+; val=(-?\d+)")
_ALGO = re.compile(r"\balgo: type=\w+; val=(\w+)")
EXECUTES = ("cudnnBackendExecute", "cudnnConvolutionForward", "cudnnConvolutionBiasActivationForward")
_VOLATILE = re.compile(r"addr=|Time:|Process=|streamId=|\buid:|Uid=|deviceProp|deviceName|cudaDeviceId|deviceVer|"
                       r"multiProcessorCount|driverVer|maxSharedMemory|totalGlobalMem")


def blocks(text: str) -> list[tuple[str, list[str]]]:
    """The log as (function name, its lines), in order; lines before the first header are dropped."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = _HEAD.match(line)
        if m:
            out.append((m.group(1), [line]))
        elif out:
            out[-1][1].append(line)
    return out


def _execution(func: str, lines: list[str]) -> dict | None:
    """One block as an execution record, or None for another call or an execute's return record."""
    body = "\n".join(lines)
    if func not in EXECUTES or not (_ENGINE.search(body) or _ALGO.search(body)):
        return None  # another call, or an execute's return record (its status alone)
    out: dict = {"function": func, "lines": lines[:200]}
    engines = _ENGINE.findall(body)
    if engines:
        out["engine_id"] = int(engines[-1])
    knobs = {name: int(v) for name, v in _KNOB.findall(body)}
    if knobs:
        out["knobs"] = knobs
    algo = _ALGO.search(body)
    if algo:
        out["algo"] = algo.group(1)
    return out


def _config(e: dict) -> tuple:
    return (e["function"], e.get("engine_id"), tuple(sorted((e.get("knobs") or {}).items())), e.get("algo"))


def last_execution(text: str) -> dict:
    """The last executing call of the log: ``function``, ``engine_id`` (backend API) with ``knobs`` ({name
    without ``CUDNN_KNOB_TYPE_``: value}), or ``algo`` (legacy API), and its ``lines`` (at most 200); ``{}``
    when the log holds no executing call. The engine id is the block's last one (a plan prints its graph's
    operations before its engine config)."""
    for func, lines in reversed(blocks(text)):
        e = _execution(func, lines)
        if e is not None:
            return e
    return {}


def chosen_execution(text: str, settled: int = 8) -> dict:
    """The configuration a benchmark-mode process kept: the one executed most among its last ``settled``
    executions (ties to the latest), as ``last_execution``'s record (the lines of its last occurrence), with
    ``executions``: every configuration the log executed and how often (most first, at most 12). Why not
    the last call alone: the log of ResNet-50's stem ended on engine 47 in one run and on engine 63 in
    another (H100, 2026-12-07) while both ran the same two kernels. Why not the most executed overall:
    cuDNN's benchmark runs each plan it times up to 100 times. The caller makes ``settled`` calls after
    the benchmark (``stem_engines.torch_log_child``: nine)."""
    counts: dict[tuple, int] = {}
    latest: dict[tuple, tuple[int, dict]] = {}
    order: list[tuple] = []
    for i, (func, lines) in enumerate(blocks(text)):
        e = _execution(func, lines)
        if e is None:
            continue
        key = _config(e)
        counts[key] = counts.get(key, 0) + 1
        latest[key] = (i, e)
        order.append(key)
    if not counts:
        return {}
    recent: dict[tuple, int] = {}
    for key in order[-settled:]:
        recent[key] = recent.get(key, 0) + 1
    best = max(recent, key=lambda k: (recent[k], latest[k][0]))
    out = dict(latest[best][1])
    order = sorted(counts, key=lambda k: (-counts[k], -latest[k][0]))[:12]
    out["executions"] = [{"engine_id": k[1], "knobs": dict(k[2]), **({"algo": k[3]} if k[3] else {}), "count": counts[k]}
                         for k in order]
    return out


def functions(text: str) -> dict[str, int]:
    """How often each API function appears in the log (what a reader checks first when no execute is found)."""
    counts: dict[str, int] = {}
    for func, _ in blocks(text):
        counts[func] = counts.get(func, 0) + 1
    return counts


def descriptor(lines: list[str]) -> list[str]:
    """An executing block's lines without what differs between two processes running the same configuration
    (addresses, uids, times, the device's description): what ``difflib`` compares between torch's execution
    and graphopt's."""
    return [line[2:].rstrip() if line.startswith("i!") else line.rstrip()
            for line in lines if line.strip() and not _VOLATILE.search(line)]
