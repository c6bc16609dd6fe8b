"""Lowering selection for graphopt's custom ops: ``--gpu`` names, the heuristic, the profiler, the tuning cache.

Public API (each lives in its own module; this package re-exports the main entry points):

- ``gpus``: ``normalize_gpu_name``, ``known_gpu_names``, ``detect_devices``, ``resolve_target``, ``DeviceInfo``
- ``heuristic``: ``heuristic_lowering(op_type, sig, cc)``
- ``select``: ``select_lowerings(graph, gpu, cache=, profile=, shapes=)`` -> ``SelectionReport``
- ``cache``: ``TuningCache`` (lookup and store); ``cache_file`` (the sqlite file: ``default_cache_dir``, schema,
  distrust), ``cache_record`` (``TimingRecord``), ``cache_export`` (export/import JSON)
- ``profiler``: ``profile_node`` (one signature), ``Profiler`` (many, through the cache, over the GPUs);
  ``candidate_run`` (one candidate's build, check and time; ``FakeTimer``), ``runners`` (in a worker
  process or inline), ``results``, ``tuning_time`` (``TuningTime``, ``Budget``), ``progress``
- ``tuner``: ``tune_graph(graph, gpu, shapes=, cache=True)``: selection wired to the detected devices,
  the default tuning cache and the kernels' backend (what the pipeline should call)
- ``cache_cli``: the click group ``cache`` (mounted by ``graphopt/cli.py``)
"""

from graphopt.tune.gpus import DeviceInfo, detect_devices, known_gpu_names, normalize_gpu_name, resolve_target
from graphopt.kernels.heuristic import heuristic_lowering
from graphopt.tune.select import SelectionReport, select_lowerings

__all__ = [
    "DeviceInfo", "SelectionReport", "detect_devices", "heuristic_lowering", "known_gpu_names",
    "normalize_gpu_name", "resolve_target", "select_lowerings",
]
