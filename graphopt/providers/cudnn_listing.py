"""The plan names cuDNN lists for a signature, remembered on disk between runs.

Listing a signature's plans means building its cuDNN graph and asking heuristics A and the fallback
list (50-100 ms a signature on the H200). A run whose every timing comes from the tuning cache still
lists every candidate, to check their cache keys: 1.7 s of a warm ResNet-50 and 6.9 s of a warm
GPT-2 went there (``bench/results/cache_speed_h200.json``). The names depend only on the signature,
the graph builder, the GPU and the cuDNN versions, so they are kept in one JSON file per
(cuDNN backend, frontend, GPU) beside the compiled kernels (``GRAPHOPT_KERNEL_CACHE``). A name that
is no longer offered when a plan is built fails that candidate's build with the reason, as any
refused plan does. A graph cuDNN refuses as unsupported is kept as an empty listing (NCHW fused
graphs may be refused on every signature: building each again cost 50-100 ms a warm run); a listing
that failed otherwise is not kept. Writes are atomic (a temporary file renamed over the old one); two processes
writing at once lose at most one listing, which the next run makes again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Callable

_MEMO: dict[str, dict] = {}  # file path -> its listings, as loaded or written by this process


def _path(device: str, versions: tuple[tuple[str, str], ...]) -> str:
    from graphopt.kernels.source import cubin_cache_dir

    tag = hashlib.sha1(repr((device, versions)).encode()).hexdigest()[:16]
    return os.path.join(cubin_cache_dir(), f"cudnn-plans-{tag}.json")


def _load(path: str) -> dict:
    if path not in _MEMO:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            _MEMO[path] = data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            _MEMO[path] = {}
    return _MEMO[path]


def _save(path: str, listings: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".cudnn-plans-", dir=os.path.dirname(path))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(listings, f, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:  # a read-only cache directory: list again next time
        pass


def remembered(key: str, device: str, versions: tuple[tuple[str, str], ...],
               listing: Callable[[], list[str] | None]) -> list[str]:
    """The names ``listing()`` returns for ``key`` on ``device`` with ``versions``: from disk when a
    run listed them before, else listed now and kept, an empty list too (cuDNN's verdict: no plan
    here). ``listing()`` returns None for a failure that is not a verdict: [] is returned and nothing
    is kept."""
    path = _path(device, versions)
    listings = _load(path)
    names = listings.get(key)
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return list(names)
    listed_now = listing()
    if listed_now is None:
        return []
    names = list(listed_now)
    on_disk = {}
    try:
        with open(path, encoding="utf-8") as f:
            on_disk = json.load(f)
    except (OSError, ValueError):
        pass
    merged = {**(on_disk if isinstance(on_disk, dict) else {}), **listings, key: names}
    _MEMO[path] = merged
    _save(path, merged)
    return names
