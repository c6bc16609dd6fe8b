"""The tuning cache's SQLite file: where it lives, its schema, and opening it only when it can be trusted.

The file is ``tuning.sqlite3`` in the cache directory: ``$GRAPHOPT_CACHE_DIR`` if set, else
``$XDG_CACHE_HOME/graphopt``, else ``~/.cache/graphopt``. It is opened in WAL mode with a busy
timeout. Never trusted, always with a warning and moved aside to ``tuning.sqlite3.bad-<time>-<pid>``
then rebuilt empty: a corrupt or truncated file, a file of an older schema or of another program, a
world-writable file, or a file owned by another user (:func:`open_database`).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from graphopt.errors import TuningError
from graphopt.tune.cache_record import KEY_COLUMNS

SCHEMA_VERSION = 1
CACHE_FILE = "tuning.sqlite3"
BUSY_TIMEOUT_S = 60.0

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS timings (
    gpu TEXT NOT NULL,
    compute_capability TEXT NOT NULL,
    driver TEXT NOT NULL,
    cuda TEXT NOT NULL,
    cupy TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    candidate TEXT NOT NULL,
    signature TEXT NOT NULL,
    op TEXT NOT NULL,
    lowering TEXT NOT NULL,
    params TEXT NOT NULL,
    ms REAL,               -- NULL: the candidate failed (scores infinity); see status and reason
    status TEXT NOT NULL,  -- the profiler's status: ok, build_failed, wrong_answer, crashed, timeout, ...
    reason TEXT NOT NULL,
    samples TEXT NOT NULL, -- JSON list of the individual timings in ms
    origin TEXT NOT NULL,  -- 'local' or 'imported'
    created REAL NOT NULL,
    PRIMARY KEY ({", ".join(KEY_COLUMNS)})
);
CREATE INDEX IF NOT EXISTS timings_by_sig ON timings (gpu, signature);
"""
# One statement per entry (split on the blank-line-free ";\n" ends, never inside the comments).
_SCHEMA_STATEMENTS = tuple(s.strip() for s in _SCHEMA.split(";\n") if s.strip())


def default_cache_dir() -> Path:
    """``$GRAPHOPT_CACHE_DIR``, else ``$XDG_CACHE_HOME/graphopt``, else ``~/.cache/graphopt``."""
    env = os.environ.get("GRAPHOPT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says relative values are to be ignored
        return Path(xdg) / "graphopt"
    return Path.home() / ".cache" / "graphopt"


class _Untrusted(Exception):
    """The file exists but must not be used (reason in args[0])."""


def is_busy(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "")  # Python >= 3.11
    if name:
        return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


def _file_problem(path: Path) -> str | None:
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None  # nothing there yet (creating the folder may still fail, in _connect)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_mode & stat.S_IWOTH:
        return "is world-writable (anyone could plant timings)"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"is owned by another user (uid {st.st_uid})"
    return None


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def quarantine(path: Path, reason: str, ident: tuple[int, int] | None, warn: Callable[[str], None]) -> None:
    """Move the file we judged (``ident``) aside, with its -wal/-shm, and warn.

    When another process has already replaced the file (a different inode is there now), the
    new file is left alone: it is that process's rebuilt cache, not the one we distrust.
    """
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    dest = path.with_name(f"{path.name}.bad-{stamp}-{os.getpid()}")
    moved = False
    if ident is not None and _identity(path) != ident:
        warn(f"tuning cache {path} {reason}: another process already rebuilt it; none of its timings are used")
        return
    # The -wal and -shm side files belong to the old database: a stale WAL replayed into the
    # new file would corrupt it, so they go too.
    for suffix in ("", "-wal", "-shm"):
        src = Path(str(path) + suffix)
        try:
            os.replace(src, Path(str(dest) + suffix))
            moved = moved or suffix == ""
        except FileNotFoundError:
            pass  # another process moved it first, or it never existed
    warn(
        f"tuning cache {path} {reason}: "
        + (f"moved aside to {dest.name} and rebuilt; " if moved else "rebuilt; ")
        + "none of its timings are used"
    )


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fresh = not path.exists()
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
    conn.row_factory = sqlite3.Row
    if fresh:
        try:
            os.chmod(path, 0o600)
        except OSError:
            pass
    return conn


def _ensure_schema(conn: sqlite3.Connection) -> None:
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise _Untrusted(f"could not be put in WAL mode (journal_mode={mode})")
    check = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
    if check != ["ok"]:
        raise _Untrusted(f"failed SQLite's integrity check ({'; '.join(map(str, check[:3]))})")
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    if not tables:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Statement by statement: executescript() would COMMIT the transaction implicitly.
            for stmt in _SCHEMA_STATEMENTS:
                conn.execute(stmt)
            if conn.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 0:
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        tables = ["schema_version", "timings"]
    if "schema_version" not in tables:
        raise _Untrusted("has no schema_version table (an old or foreign file)")
    rows = conn.execute("SELECT version FROM schema_version").fetchall()
    versions = [r[0] for r in rows]
    if versions != [SCHEMA_VERSION]:
        raise _Untrusted(f"has schema version {versions or 'none'}, this graphopt uses {SCHEMA_VERSION}")
    if "timings" not in tables:
        raise _Untrusted("has no timings table")


@contextmanager
def open_lock(path: Path):
    """Serialize opening, validation and repair across processes (an flock on a side file).

    Without it, two processes that find the same damaged file race to move it (and its -wal
    and -shm) aside while the other is creating the replacement. Plain reads and writes do not
    take it: SQLite's own locking covers those.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: SQLite's locking only
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def open_database(path: Path, warn: Callable[[str], None]) -> tuple[sqlite3.Connection, tuple[int, int] | None]:
    """The connection to the cache at ``path`` (created when missing, rebuilt when distrusted) and the
    identity of the file it opened (for a later :func:`quarantine`). ``warn`` says why a file was not
    trusted."""
    try:
        with open_lock(path):
            return _open_locked(path, warn)
    except OSError as exc:
        raise TuningError(f"cannot open the tuning cache {path}: {exc}; set GRAPHOPT_CACHE_DIR to a writable folder") from exc


def _open_locked(path: Path, warn: Callable[[str], None]) -> tuple[sqlite3.Connection, tuple[int, int] | None]:
    ident = _identity(path)
    problem = _file_problem(path)
    if problem:
        quarantine(path, problem, ident, warn)
    for attempt in range(2):
        conn = None
        ident = None
        try:
            conn = _connect(path)
            ident = _identity(path)
            _ensure_schema(conn)
            return conn, ident
        except _Untrusted as exc:
            reason = str(exc)
        except sqlite3.DatabaseError as exc:
            if is_busy(exc):
                if conn is not None:
                    conn.close()
                raise TuningError(
                    f"tuning cache {path} stayed locked for {BUSY_TIMEOUT_S:.0f} s: "
                    "another graphopt is writing it; try again"
                ) from exc
            reason = f"is corrupt or truncated ({exc})"
        except OSError as exc:
            raise TuningError(f"cannot open the tuning cache {path}: {exc}; set GRAPHOPT_CACHE_DIR to a writable folder") from exc
        if conn is not None:
            conn.close()
        if attempt == 1:
            raise TuningError(f"tuning cache {path} {reason} even after rebuilding it; remove the folder {path.parent}")
        quarantine(path, reason, ident, warn)
    raise AssertionError("unreachable")


__all__ = ["BUSY_TIMEOUT_S", "CACHE_FILE", "SCHEMA_VERSION", "default_cache_dir", "is_busy", "open_database", "open_lock", "quarantine"]
