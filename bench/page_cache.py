"""Evict vendor libraries from the OS page cache, or report how much of them is resident (Linux).

Used by bench/device_remaining.sh call 10 to put a used machine back into a fresh machine's state for
cuDNN / cuBLAS / NVRTC before a cold tuning (does a fresh machine's slower first cold run come from
reading those libraries? On a fresh H100 at 29889f8, no: bench/NOTES_e2e.md):

    python bench/page_cache.py evict   [--prefixes libcudnn,libcublas,libnvrtc] [--json OUT]
    python bench/page_cache.py resident [--prefixes ...] [--json OUT]

``evict`` is ``posix_fadvise(DONTNEED)`` on each file (clean pages of files no process maps are
dropped; no root needed); ``resident`` counts pages with ``mincore`` on a read-only mapping.
Files are found under every ``site-packages`` / ``dist-packages`` on ``sys.path``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import sys
from pathlib import Path

PREFIXES = ("libcudnn", "libcublas", "libnvrtc")


def library_paths(prefixes) -> list[Path]:
    roots = dict.fromkeys(Path(p) for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p))
    found: dict[Path, None] = {}
    for root in roots:
        for f in sorted(root.rglob("lib*.so*")):
            if f.name.startswith(tuple(prefixes)) and f.is_file() and not f.is_symlink():
                found.setdefault(f.resolve(), None)
    return list(found)


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache: ``mincore`` over a read-only mapping made through libc
    (Python's mmap module does not give the mapping's address)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return sum(v & 1 for v in vec) * page
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=("evict", "resident"))
    ap.add_argument("--prefixes", default=",".join(PREFIXES))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    files = library_paths([p for p in a.prefixes.split(",") if p])
    rows = []
    for f in files:
        if a.action == "evict":
            evict(f)
        try:
            resident = resident_bytes(f)
        except (OSError, AttributeError, ValueError) as exc:
            resident = None
            print(f"page_cache: {f}: {exc}", file=sys.stderr)
        rows.append({"file": str(f), "mb": round(f.stat().st_size / 1e6, 1),
                     "resident_mb": None if resident is None else round(resident / 1e6, 1)})
    total = round(sum(r["mb"] for r in rows), 1)
    resident = round(sum(r["resident_mb"] or 0 for r in rows), 1)
    print(f"page_cache {a.action}: {len(rows)} files, {total} MB, {resident} MB resident after")
    if a.json:
        a.json.write_text(json.dumps({"action": a.action, "files": rows, "mb": total, "resident_mb": resident}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
