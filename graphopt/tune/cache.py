"""The tuning cache: every measured timing, keyed so that it is only trusted where it was measured.

Storage is one SQLite file, ``tuning.sqlite3``, in the cache directory: ``$GRAPHOPT_CACHE_DIR`` if
set, else ``$XDG_CACHE_HOME/graphopt``, else ``~/.cache/graphopt``. SQLite (in WAL mode with a
busy timeout, every write in one ``BEGIN IMMEDIATE`` transaction) gives atomic writes that are safe
with many concurrent processes; hand-rolled JSON files with locks would have to re-implement that.

The key is the design's: GPU name, compute capability, driver, CUDA and CuPy versions (together a
``DeviceFingerprint``), the kernel's source hash, the candidate key and the signature key. Every
timing is stored, not just the winner's, and so are failures (``ms`` is ``inf``, with the reason).

Never trusted, always with a warning (``TuningCacheWarning``) and moved aside to
``tuning.sqlite3.bad-<time>-<pid>`` then rebuilt empty: a corrupt or truncated file, a file of an
older schema or of another program, a world-writable file, or a file owned by another user.
Entries for the same GPU model measured under another driver / CUDA / CuPy / compute capability,
or with another kernel source, are ignored with a warning.

``export(path)`` writes a JSON document (atomically: temp file + ``os.replace``); ``import_(path)``
reads one after validating every field. No pickle anywhere: the file is data, not code.
Imported entries serve ``--gpu X`` on machines where X is absent (see ``best_for_gpu``).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import stat
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from graphopt.errors import TuningError
from graphopt.files import Output, atomic_write, check_outputs
from graphopt.tune.gpus import DeviceFingerprint

SCHEMA_VERSION = 1
CACHE_FILE = "tuning.sqlite3"
EXPORT_FORMAT = "graphopt-tuning-cache"
BUSY_TIMEOUT_S = 60.0

_KEY_COLUMNS = ("gpu", "compute_capability", "driver", "cuda", "cupy", "source_hash", "candidate", "signature")

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
    PRIMARY KEY ({", ".join(_KEY_COLUMNS)})
);
CREATE INDEX IF NOT EXISTS timings_by_sig ON timings (gpu, signature);
"""
# One statement per entry (split on the blank-line-free ";\n" ends, never inside the comments).
_SCHEMA_STATEMENTS = tuple(s.strip() for s in _SCHEMA.split(";\n") if s.strip())


class TuningCacheWarning(UserWarning):
    """A cache file or entry was not trusted (it was moved aside, or ignored)."""


def default_cache_dir() -> Path:
    """``$GRAPHOPT_CACHE_DIR``, else ``$XDG_CACHE_HOME/graphopt``, else ``~/.cache/graphopt``."""
    env = os.environ.get("GRAPHOPT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says relative values are to be ignored
        return Path(xdg) / "graphopt"
    return Path.home() / ".cache" / "graphopt"


@dataclass(frozen=True)
class TimingRecord:
    """One cached measurement (or failure) of one candidate on one signature on one device."""

    gpu: str
    compute_capability: str
    driver: str
    cuda: str
    cupy: str
    source_hash: str
    candidate: str
    signature: str
    op: str
    lowering: str
    params: str
    ms: float  # math.inf for a failure
    status: str = "ok"
    reason: str = ""
    samples: tuple[float, ...] = ()
    origin: str = "local"
    created: float = 0.0

    @property
    def ok(self) -> bool:
        return math.isfinite(self.ms)

    @property
    def fingerprint(self) -> DeviceFingerprint:
        return DeviceFingerprint(self.gpu, self.compute_capability, self.driver, self.cuda, self.cupy)

    def key(self) -> tuple[str, ...]:
        return tuple(getattr(self, c) for c in _KEY_COLUMNS)

    def to_json(self) -> dict:
        d = asdict(self)
        d["ms"] = self.ms if self.ok else None
        d["samples"] = list(self.samples)
        return d


def _record_from_row(row: sqlite3.Row) -> TimingRecord:
    return TimingRecord(
        gpu=row["gpu"], compute_capability=row["compute_capability"], driver=row["driver"],
        cuda=row["cuda"], cupy=row["cupy"], source_hash=row["source_hash"], candidate=row["candidate"],
        signature=row["signature"], op=row["op"], lowering=row["lowering"], params=row["params"],
        ms=math.inf if row["ms"] is None else float(row["ms"]), status=row["status"], reason=row["reason"],
        samples=tuple(float(x) for x in json.loads(row["samples"])), origin=row["origin"],
        created=float(row["created"]),
    )


class _Untrusted(Exception):
    """The file exists but must not be used (reason in args[0])."""


def _is_busy(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "")  # Python >= 3.11
    if name:
        return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


class TuningCache:
    """The on-disk tuning cache. Open one per process (``TuningCache()`` uses the default path)."""

    def __init__(self, path: str | os.PathLike | None = None, *, warn: bool = True):
        self.path = Path(path) if path is not None else default_cache_dir() / CACHE_FILE
        self.messages: list[str] = []  # every warning this instance gave, for reports
        self._warn_enabled = warn
        self._warned: set[str] = set()  # only for de-duplication, never iterated
        self._ident: tuple[int, int] | None = None
        self._conn = self._open()

    # ----------------------------------------------------------------- opening and validation
    def _warn(self, message: str) -> None:
        if message in self._warned:
            return
        self._warned.add(message)
        self.messages.append(message)
        if self._warn_enabled:
            warnings.warn(message, TuningCacheWarning, stacklevel=3)

    def _file_problem(self) -> str | None:
        try:
            st = os.lstat(self.path)
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

    def _identity(self) -> tuple[int, int] | None:
        try:
            st = os.lstat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _quarantine(self, reason: str, ident: tuple[int, int] | None = None) -> None:
        """Move the file we judged (``ident``) aside, with its -wal/-shm, and warn.

        When another process has already replaced the file (a different inode is there now), the
        new file is left alone: it is that process's rebuilt cache, not the one we distrust.
        """
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        dest = self.path.with_name(f"{self.path.name}.bad-{stamp}-{os.getpid()}")
        moved = False
        if ident is not None and self._identity() != ident:
            self._warn(f"tuning cache {self.path} {reason}: another process already rebuilt it; none of its timings are used")
            return
        # The -wal and -shm side files belong to the old database: a stale WAL replayed into the
        # new file would corrupt it, so they go too.
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            try:
                os.replace(src, Path(str(dest) + suffix))
                moved = moved or suffix == ""
            except FileNotFoundError:
                pass  # another process moved it first, or it never existed
        self._warn(
            f"tuning cache {self.path} {reason}: "
            + (f"moved aside to {dest.name} and rebuilt; " if moved else "rebuilt; ")
            + "none of its timings are used"
        )

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh = not self.path.exists()
        conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.row_factory = sqlite3.Row
        if fresh:
            try:
                os.chmod(self.path, 0o600)
            except OSError:
                pass
        return conn

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
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
    def _open_lock(self):
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
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _open(self) -> sqlite3.Connection:
        try:
            with self._open_lock():
                return self._open_locked()
        except OSError as exc:
            raise TuningError(f"cannot open the tuning cache {self.path}: {exc}; set GRAPHOPT_CACHE_DIR to a writable folder") from exc

    def _open_locked(self) -> sqlite3.Connection:
        ident = self._identity()
        problem = self._file_problem()
        if problem:
            self._quarantine(problem, ident)
        for attempt in range(2):
            conn = None
            ident = None
            try:
                conn = self._connect()
                ident = self._identity()
                self._ensure_schema(conn)
                self._ident = ident
                return conn
            except _Untrusted as exc:
                reason = str(exc)
            except sqlite3.DatabaseError as exc:
                if _is_busy(exc):
                    if conn is not None:
                        conn.close()
                    raise TuningError(
                        f"tuning cache {self.path} stayed locked for {BUSY_TIMEOUT_S:.0f} s: "
                        "another graphopt is writing it; try again"
                    ) from exc
                reason = f"is corrupt or truncated ({exc})"
            except OSError as exc:
                raise TuningError(f"cannot open the tuning cache {self.path}: {exc}; set GRAPHOPT_CACHE_DIR to a writable folder") from exc
            if conn is not None:
                conn.close()
            if attempt == 1:
                raise TuningError(f"tuning cache {self.path} {reason} even after rebuilding it; remove the folder {self.path.parent}")
            self._quarantine(reason, ident)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "TuningCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- writing
    def put_many(self, records: Iterable[TimingRecord]) -> int:
        """Store records in one transaction (replacing any with the same key). Returns the count."""
        rows = [self._row(r) for r in records]
        if not rows:
            return 0
        self._write(
            f"INSERT OR REPLACE INTO timings ({', '.join(_ALL_COLUMNS)}) VALUES ({', '.join('?' * len(_ALL_COLUMNS))})",
            rows,
        )
        return len(rows)

    def put(self, record: TimingRecord) -> None:
        self.put_many([record])

    @staticmethod
    def _row(r: TimingRecord) -> tuple:
        created = r.created or time.time()
        return (
            r.gpu, r.compute_capability, r.driver, r.cuda, r.cupy, r.source_hash, r.candidate,
            r.signature, r.op, r.lowering, r.params, r.ms if r.ok else None, "ok" if r.ok else (r.status if r.status != "ok" else "error"), r.reason,
            json.dumps([float(x) for x in r.samples]), r.origin, created,
        )

    def _write(self, sql: str, rows: list[tuple]) -> None:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(sql, rows)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise TuningError(f"could not write the tuning cache {self.path}: {exc}") from exc

    def clear(self, gpu: str | None = None) -> int:
        """Delete all entries (or only those of one normalized GPU name); returns how many."""
        conn = self._conn
        where, args = ("WHERE gpu = ?", (gpu,)) if gpu else ("", ())
        n = conn.execute(f"SELECT COUNT(*) FROM timings {where}", args).fetchone()[0]
        self._write(f"DELETE FROM timings {where}", [args])
        return int(n)

    # ----------------------------------------------------------------- reading
    def _select(self, where: str, args: Sequence) -> list[TimingRecord]:
        try:
            rows = self._conn.execute(
                f"SELECT * FROM timings {where} ORDER BY {', '.join(_KEY_COLUMNS)}", tuple(args)
            ).fetchall()
            return [_record_from_row(r) for r in rows]
        except (sqlite3.DatabaseError, ValueError, TypeError) as exc:
            if isinstance(exc, sqlite3.DatabaseError) and _is_busy(exc):
                raise TuningError(f"tuning cache {self.path} stayed locked: another graphopt is writing it; try again") from exc
            # Damage that quick_check did not see (or a row that is not ours): distrust the file.
            self._conn.close()
            with self._open_lock():
                self._quarantine(f"is corrupt ({exc})", self._ident)
            self._conn = self._open()
            return []

    def entries(self, gpu: str | None = None) -> list[TimingRecord]:
        """All records (of one GPU name when given), in key order."""
        return self._select("WHERE gpu = ?", (gpu,)) if gpu else self._select("", ())

    def __len__(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM timings").fetchone()[0])

    def lookup(
        self, fingerprint: DeviceFingerprint, signature: str, candidates: Mapping[str, str]
    ) -> dict[str, TimingRecord]:
        """Records measured exactly here: ``candidates`` maps candidate key -> current source hash.

        Entries for the same GPU model and signature measured under other versions (or an older
        kernel source) are ignored with a warning.
        """
        found: dict[str, TimingRecord] = {}
        stale: list[TimingRecord] = []
        for rec in self._select("WHERE gpu = ? AND signature = ?", (fingerprint.gpu, signature)):
            if rec.fingerprint != fingerprint:
                stale.append(rec)
            elif rec.candidate not in candidates:
                continue  # a candidate that no longer exists
            elif rec.source_hash == candidates[rec.candidate]:
                found[rec.candidate] = rec
            else:
                stale.append(rec)
        for rec in stale:
            # Only stale entries that cost a re-measurement are worth a warning; old entries next
            # to fresh ones (after a driver upgrade, say) are simply unused.
            if rec.candidate not in candidates or rec.candidate in found:
                continue
            if rec.fingerprint != fingerprint:
                self._warn(
                    f"tuning cache: ignoring entries measured on {rec.fingerprint.describe()}; "
                    f"this machine is {fingerprint.describe()}: they will be re-measured"
                )
            else:
                self._warn(
                    f"tuning cache: ignoring entries for {rec.candidate} measured with another kernel "
                    "source (the kernel changed since): they will be re-measured"
                )
        return found

    def best_for_gpu(
        self, gpu: str, signature: str, *, source_hashes: Mapping[str, str] | None = None,
        fingerprint: DeviceFingerprint | None = None,
    ) -> tuple[TimingRecord | None, list[TimingRecord]]:
        """For an absent GPU: the fastest successful record for (gpu, signature), and all its records.

        Entries of any driver / CUDA / CuPy version for that GPU model are used (the device is not
        here to compare with). When ``source_hashes`` (candidate key -> current hash) is given,
        entries whose kernel source changed since are ignored with a warning. When ``fingerprint``
        is given (the GPU is present), only entries measured under exactly that fingerprint count;
        the others are ignored with a warning.
        """
        records = []
        others: list[TimingRecord] = []
        for rec in self._select("WHERE gpu = ? AND signature = ?", (gpu, signature)):
            if fingerprint is not None and rec.fingerprint != fingerprint:
                others.append(rec)
                continue
            if source_hashes is not None and rec.candidate in source_hashes and source_hashes[rec.candidate] != rec.source_hash:
                self._warn(f"tuning cache: ignoring entries for {rec.candidate} on {gpu} measured with another kernel source")
                continue
            records.append(rec)
        if others and not records:
            self._warn(
                f"tuning cache: ignoring entries measured on {others[0].fingerprint.describe()}; "
                f"this machine is {fingerprint.describe()}"
            )
        ok = [r for r in records if r.ok]
        best = min(ok, key=lambda r: (r.ms, r.candidate)) if ok else None
        return best, records

    def stats(self) -> list[dict]:
        """One row per device fingerprint: entries, distinct signatures, failures, imported entries."""
        rows = self._conn.execute(
            "SELECT gpu, compute_capability, driver, cuda, cupy, COUNT(*) AS entries, "
            "COUNT(DISTINCT signature) AS signatures, SUM(ms IS NULL) AS failures, "
            "SUM(origin = 'imported') AS imported FROM timings "
            "GROUP BY gpu, compute_capability, driver, cuda, cupy "
            "ORDER BY gpu, compute_capability, driver, cuda, cupy"
        ).fetchall()
        return [{k: r[k] for k in r.keys()} for r in rows]

    # ----------------------------------------------------------------- export / import
    def export(self, path: str | os.PathLike, gpu: str | None = None) -> int:
        """Write all entries (or one GPU's) to a JSON file, atomically. Returns the count. The file may
        not be the cache's own database (or its -wal/-shm/.lock companions)."""
        own = [self.path, *(Path(f"{self.path}{suffix}") for suffix in ("-wal", "-shm", "-journal", ".lock"))]
        check_outputs([Output(Path(path), "cache export file")], own)
        records = self.entries(gpu)
        doc = {
            "format": EXPORT_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "entries": [r.to_json() for r in records],
        }
        text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"
        _atomic_write_text(Path(path), text)
        return len(records)

    def import_(self, path: str | os.PathLike) -> int:
        """Read a JSON export; all entries are validated before any is stored. Returns the count.

        Imported entries never replace entries measured on this machine with the same key.
        """
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise TuningError(f"cache import file {path} not found") from exc
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TuningError(f"cache import file {path} is not a graphopt cache export (not JSON: {exc})") from exc
        records = _parse_export(doc, path)
        rows = [self._row(r) for r in records]
        updates = ", ".join(f"{c} = excluded.{c}" for c in _ALL_COLUMNS if c not in _KEY_COLUMNS)
        if rows:
            self._write(
                f"INSERT INTO timings ({', '.join(_ALL_COLUMNS)}) VALUES ({', '.join('?' * len(_ALL_COLUMNS))}) "
                f"ON CONFLICT ({', '.join(_KEY_COLUMNS)}) DO UPDATE SET {updates} WHERE timings.origin != 'local'",
                rows,
            )
        return len(rows)


_ALL_COLUMNS = _KEY_COLUMNS + ("op", "lowering", "params", "ms", "status", "reason", "samples", "origin", "created")


def _parse_export(doc, path: Path) -> list[TimingRecord]:
    def bad(msg: str) -> TuningError:
        return TuningError(f"cache import file {path}: {msg}; nothing was imported")

    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise bad(f"not a graphopt cache export (expected \"format\": \"{EXPORT_FORMAT}\")")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise bad(f"schema version {doc.get('schema_version')!r}, this graphopt reads {SCHEMA_VERSION}")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise bad("\"entries\" must be a list")
    text_fields = _KEY_COLUMNS + ("op", "lowering", "params", "status", "reason")
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise bad(f"entry {i} is not an object")
        for f in text_fields:
            if not isinstance(e.get(f), str):
                raise bad(f"entry {i}: field {f!r} must be a string")
        ms = e.get("ms")
        if ms is not None and (isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms < 0):
            raise bad(f"entry {i}: field 'ms' must be a non-negative number or null")
        samples = e.get("samples", [])
        if not isinstance(samples, list) or not all(
            isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in samples
        ):
            raise bad(f"entry {i}: field 'samples' must be a list of numbers")
        created = e.get("created", 0.0)
        if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created):
            raise bad(f"entry {i}: field 'created' must be a number")
        out.append(
            TimingRecord(
                **{f: e[f] for f in text_fields},
                ms=math.inf if ms is None else float(ms),
                samples=tuple(float(s) for s in samples),
                origin="imported",
                created=float(created) or time.time(),
            )
        )
    return out


def _atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, with the user's normal permissions (graphopt.files)."""
    atomic_write(path.expanduser(), [text.encode("utf-8")], error=TuningError)


def records_for(
    fingerprint: DeviceFingerprint, signature: str, op: str, results: Iterable, *, now: float | None = None
) -> list[TimingRecord]:
    """Build cache records from profiler ``CandidateResult``s (pruned candidates are not stored)."""
    now = time.time() if now is None else now
    out = []
    for r in results:
        if r.status == "pruned":
            continue
        out.append(
            TimingRecord(
                gpu=fingerprint.gpu, compute_capability=fingerprint.compute_capability,
                driver=fingerprint.driver, cuda=fingerprint.cuda, cupy=fingerprint.cupy,
                source_hash=r.source_hash, candidate=r.candidate, signature=signature, op=op,
                lowering=r.lowering, params=r.params, ms=r.ms, status=r.status, reason=r.reason,
                samples=tuple(r.samples), origin="local", created=now,
            )
        )
    return out


__all__ = [
    "CACHE_FILE", "SCHEMA_VERSION", "TimingRecord", "TuningCache", "TuningCacheWarning",
    "default_cache_dir", "records_for",
]
