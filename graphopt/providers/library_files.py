"""Read a vendor library's shared objects into the OS page cache before its first plans need them.

On a machine that has not run cuDNN yet, its libraries (``libcudnn_engines_precompiled`` alone is
several hundred MB) are not in the page cache, and each plan's first execution loads its kernels by
page faults scattered over the file. A fresh H100's first cold ResNet-50 tuning spent twice the
check time (each plan's first execution) of a later cold run on the same machine with the driver's
JIT cache emptied: 75.6 against 36.9 s of worker time (bench/NOTES_e2e.md; whether those reads are
the difference is what bench/device_remaining.sh call 10 measures).

:func:`prefetch` is called when a provider first opens its library in a process (the cuDNN handle,
the first cuBLASLt handle). It starts one daemon thread that reads, once and in sequence, the
library files this process has mapped whose names start with the given prefixes, and their siblings
in the same directories (cuDNN opens its engine libraries lazily). Nothing in the standard library
or our dependencies does this (vmtouch does, as a separate tool). ``GRAPHOPT_PREFETCH_LIBRARIES=0``
turns it off.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Iterable, Sequence

ENV = "GRAPHOPT_PREFETCH_LIBRARIES"
_started: set[str] = set()   # prefixes already prefetched in this process
_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def mapped_libraries(maps_text: str) -> list[Path]:
    """The shared objects in ``/proc/<pid>/maps`` text, each once, in order of appearance."""
    seen: dict[str, None] = {}
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
            seen.setdefault(parts[5].strip(), None)
    return [Path(p) for p in seen]


def library_files(prefixes: Sequence[str], mapped: Iterable[Path]) -> list[Path]:
    """The files to read ahead: the mapped libraries whose names start with one of ``prefixes``,
    then their siblings (same directory, same prefix, a ``.so`` name) not mapped yet; each once."""
    mapped = [p for p in mapped if p.name.startswith(tuple(prefixes))]
    files: dict[Path, None] = dict.fromkeys(mapped)
    for directory in dict.fromkeys(p.parent for p in mapped):
        try:
            siblings = sorted(directory.iterdir())
        except OSError:
            continue
        for f in siblings:
            if f.name.startswith(tuple(prefixes)) and ".so" in f.name and f.is_file():
                files.setdefault(f, None)
    return list(files)


CHUNK = 8 << 20


def read_ahead(path: Path) -> None:
    """Read ``path`` once, in sequence, into the page cache. ``posix_fadvise(WILLNEED)`` alone read
    8 of 35 MB on an overlay filesystem here, so the file is read; a cached file costs a memory copy
    (about 0.1 s per GB), into one reused buffer."""
    buf = bytearray(CHUNK)
    try:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    except OSError:
        pass


def prefetch(*prefixes: str) -> threading.Thread | None:
    """Read ahead the libraries named by ``prefixes`` (e.g. ``"libcudnn"``) in a daemon thread, once
    per process and prefix set; None when turned off, already done, or nothing is mapped."""
    if not enabled() or not prefixes:
        return None
    with _lock:
        todo = [p for p in prefixes if p not in _started]
        if not todo:
            return None
        _started.update(todo)
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    files = library_files(todo, mapped_libraries(maps))
    if not files:
        return None
    thread = threading.Thread(target=lambda: [read_ahead(f) for f in files], daemon=True,
                              name="graphopt-library-prefetch")
    thread.start()
    return thread
