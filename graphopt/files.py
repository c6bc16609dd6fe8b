"""Files the user names: read only regular files, check every output path first, write atomically.

One home for what graphopt does with the user's files (it sits just above ``errors`` in the layers):

- ``read_regular`` reads a file only when it is a regular file (a device, a FIFO or a socket could make
  the read endless or block forever) and refuses one larger than a bound before reading it.
- ``check_outputs`` compares every path a command will write with every path it reads and with each
  other, by device and inode where the file exists and by resolved path otherwise, before any work; it
  refuses a folder, a missing folder and an existing read-only file (unless ``force``).
- ``Staged`` writes several files as one: each goes to a temp file in its destination's folder, and
  only when all are written are they renamed into place. Any failure, a Ctrl-C or a SIGTERM removes
  every temp file; the destinations keep their old bytes. New files get the user's normal permissions
  (``0666 & ~umask``, 0644 under umask 022), as ``open()`` would give them; a replaced file keeps its mode.
"""

from __future__ import annotations

import os
import signal
import stat
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from graphopt.errors import GraphoptError, InputNotFound, OutputRefused, UsageError, WriteFailed

QUOTE_LIMIT = 120  # characters of user text quoted in an error line


def quote(text: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr`` of user text cut to a readable length (an error line never quotes a 10 MB pattern)."""
    s = str(text)
    if len(s) > limit:
        s = s[: limit - 20] + f"... ({len(s)} characters)"
    return repr(s)


# ------------------------------------------------------------------------------------ reading
def regular_file(path: Path, what: str = "input") -> os.stat_result:
    """``stat`` of ``path`` (following symlinks), refused unless it is a regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputNotFound(f"{path}: no such file") from None
    except OSError as e:
        raise InputNotFound(f"{path}: cannot read ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputNotFound(f"{path}: is a folder, not an ONNX file" if what == "model" else f"{path}: is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise InputNotFound(f"{path}: is {kind}, not a regular file; graphopt reads only regular files")
    return st


def read_regular(path: Path, limit: int | None = None, what: str = "input") -> bytes:
    """The bytes of the regular file ``path``; at most ``limit`` bytes (refused if larger)."""
    st = regular_file(path, what)
    if limit is not None and st.st_size > limit:
        raise InputNotFound(f"{path}: {st.st_size} bytes, more than the {limit} a {what} may have")
    try:
        # O_NONBLOCK: a file swapped for a FIFO after the stat cannot block the open
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise InputNotFound(f"{path}: cannot read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise InputNotFound(f"{path}: not a regular file; graphopt reads only regular files")
        try:
            return f.read() if limit is None else f.read(limit + 1)[:limit]
        except OSError as e:
            raise InputNotFound(f"{path}: cannot read ({e.strerror or e})") from None


# ------------------------------------------------------------------------------------ output checks
@dataclass(frozen=True)
class Output:
    """A path a command writes, and how to name it in a message (``-o``, ``--report``, ...)."""

    path: Path
    label: str
    maybe: bool = False  # written only in some cases (the external-data file): checked for collisions only


def _identity(path: Path):
    """(dev, ino) of an existing file (symlinks followed), else its resolved path."""
    try:
        st = os.stat(path)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.realpath(path))


def check_outputs(outputs: Iterable[Output], reads: Iterable[Path | str] = (), *, force: bool = False) -> None:
    """Refuse, before any work, an output that is an input (exit 8), two outputs that are the same file
    (exit 2), an output that is a folder (exit 2) or lies in a folder that does not exist (exit 11), and
    an existing read-only output file unless ``force`` (exit 8)."""
    outputs = list(outputs)
    read_ids = {}
    for r in reads:
        read_ids.setdefault(_identity(Path(r)), Path(r))
    seen: dict = {}
    for out in outputs:
        p = out.path
        if str(p) in ("", "-"):
            raise UsageError(f"{out.label} {str(p)!r}: expected a file path")
        try:
            is_dir = p.is_dir()
        except OSError:
            is_dir = False
        if is_dir:
            raise UsageError(f"{out.label} {p}: is a folder; give a file path")
        ident = _identity(p)
        if ident in read_ids:
            raise OutputRefused(f"{p}: refusing to overwrite the input {read_ids[ident]} ({out.label}); "
                                "choose another output path")
        if ident in seen:
            raise UsageError(f"{out.label} {p} is the same file as {seen[ident].label} {seen[ident].path}; "
                             "give each output its own path")
        seen[ident] = out
        if out.maybe:
            continue
        folder = p.parent if str(p.parent) else Path(".")
        try:
            folder_ok = folder.is_dir()
        except OSError as e:
            raise WriteFailed(f"{p}: cannot write ({e.strerror or e}); nothing was written") from None
        if not folder_ok:
            raise WriteFailed(f"{out.label} {p}: folder {folder} does not exist; create it first (nothing was written)")
        try:
            st = os.stat(p)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{out.label} {p}: exists and is not a regular file; give a file path")
        if not st.st_mode & 0o222 and not force:
            raise OutputRefused(f"{out.label} {p}: the existing file is read-only; pass --force to replace it")


# ------------------------------------------------------------------------------------ writing
_umask_lock = threading.Lock()


def default_mode() -> int:
    """``0666 & ~umask``: the mode ``open()`` gives a new file."""
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


class Terminated(BaseException):
    """SIGTERM arrived while graphopt was working; raised so that cleanup runs as for Ctrl-C."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextmanager
def terminate_cleanly():
    """While active (main thread only), SIGTERM raises ``Terminated`` so ``finally`` blocks run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield  # someone else handles SIGTERM; leave it to them
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Staged:
    """Write files as one: ``add`` writes a temp file beside its destination, ``commit`` renames all.

    Used as a context manager: leaving it without ``commit`` (an error, Ctrl-C, SIGTERM) removes every
    temp file. ``error`` is the exception class for an OSError (``WriteFailed`` unless told)."""

    def __init__(self, error: type[GraphoptError] = WriteFailed):
        self.error = error
        self._staged: list[tuple[str, Path]] = []
        self._mode = default_mode()

    def __enter__(self):
        self._sigterm = terminate_cleanly()
        self._sigterm.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self.discard()
        finally:
            self._sigterm.__exit__(*exc)
        return False

    def _fail(self, dest: Path, e: OSError):
        return self.error(f"{dest}: cannot write ({e.strerror or e}); nothing was written")

    def add(self, dest: Path, chunks: Iterable[bytes | int]) -> None:
        """Write ``chunks`` to a temp file beside ``dest``; an int chunk is that many zero bytes, left
        as a hole (a sparse copy of a sparse file)."""
        dest = Path(dest)
        folder = dest.parent if str(dest.parent) else Path(".")
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=folder)
        except OSError as e:  # a read-only or missing folder: nothing was created
            raise self._fail(dest, e) from None
        self._staged.append((tmp, dest))
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    if isinstance(chunk, int):  # a run of zero bytes: a hole (the file stays sparse)
                        f.seek(chunk, os.SEEK_CUR)
                    else:
                        f.write(chunk)
                f.truncate()  # a hole at the end still counts in the size
                f.flush()
                try:
                    mode = stat.S_IMODE(os.stat(dest).st_mode)
                except OSError:
                    mode = self._mode
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
        except OSError as e:
            raise self._fail(dest, e) from None

    def commit(self) -> None:
        """Rename every staged file into place (each rename is atomic)."""
        staged, self._staged = self._staged, []
        try:
            while staged:
                tmp, dest = staged[0]
                os.replace(tmp, dest)
                staged.pop(0)
        except OSError as e:
            self._staged = staged
            raise self._fail(staged[0][1], e) from None

    def discard(self) -> None:
        for tmp, _ in self._staged:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        self._staged = []


def atomic_write(dest: Path, chunks: Iterable[bytes], error: type[GraphoptError] = WriteFailed) -> None:
    """Write one file atomically (temp file, fsync, rename) with the user's normal permissions."""
    with Staged(error) as s:
        s.add(dest, chunks)
        s.commit()
