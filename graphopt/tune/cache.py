"""The tuning cache: every measured timing, keyed so that it is only trusted where it was measured.

Storage is one SQLite file (:mod:`graphopt.tune.cache_file`: where it lives, its schema, and when it
is distrusted, moved aside and rebuilt). SQLite (in WAL mode with a busy timeout, every write in
one ``BEGIN IMMEDIATE`` transaction) gives atomic writes that are safe with many concurrent
processes; hand-rolled JSON files with locks would have to re-implement that.

The key is the design's: GPU name, compute capability, driver, CUDA and CuPy versions (together a
``DeviceFingerprint``), the kernel's source hash, the candidate key and the signature key
(:mod:`graphopt.tune.cache_record`). Every timing is stored, not just the winner's, and so are
failures (``ms`` is ``inf``, with the reason).

Every file or entry not trusted gives a warning (``TuningCacheWarning``). Entries for the same GPU
model measured under another driver / CUDA / CuPy / compute capability, or with another kernel
source, are ignored with a warning.

``export(path)`` writes a JSON document (atomically); ``import_(path)`` reads one after validating
every field (:mod:`graphopt.tune.cache_export`).
"""

from __future__ import annotations

import os
import sqlite3
import warnings
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from graphopt.errors import TuningError
from graphopt.files import Output, check_outputs
from graphopt.tune.cache_export import read_export, write_export
from graphopt.tune.cache_file import CACHE_FILE, default_cache_dir, is_busy, open_database, open_lock, quarantine
from graphopt.tune.cache_record import ALL_COLUMNS, KEY_COLUMNS, TimingRecord, record_from_row, record_row
from graphopt.tune.gpus import DeviceFingerprint


class TuningCacheWarning(UserWarning):
    """A cache file or entry was not trusted (it was moved aside, or ignored)."""


class TuningCache:
    """The on-disk tuning cache. Open one per process (``TuningCache()`` uses the default path)."""

    def __init__(self, path: str | os.PathLike | None = None, *, warn: bool = True):
        self.path = Path(path) if path is not None else default_cache_dir() / CACHE_FILE
        self.messages: list[str] = []  # every warning this instance gave, for reports
        self._warn_enabled = warn
        self._warned: set[str] = set()  # only for de-duplication, never iterated
        self._ident: tuple[int, int] | None = None
        self._conn = self._open()

    # ----------------------------------------------------------------- opening
    def _warn(self, message: str) -> None:
        if message in self._warned:
            return
        self._warned.add(message)
        self.messages.append(message)
        if self._warn_enabled:
            warnings.warn(message, TuningCacheWarning, stacklevel=3)

    def _open(self) -> sqlite3.Connection:
        conn, self._ident = open_database(self.path, self._warn)
        return conn

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
        rows = [record_row(r) for r in records]
        if not rows:
            return 0
        self._write(
            f"INSERT OR REPLACE INTO timings ({', '.join(ALL_COLUMNS)}) VALUES ({', '.join('?' * len(ALL_COLUMNS))})",
            rows,
        )
        return len(rows)

    def put(self, record: TimingRecord) -> None:
        self.put_many([record])

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
                f"SELECT * FROM timings {where} ORDER BY {', '.join(KEY_COLUMNS)}", tuple(args)
            ).fetchall()
            return [record_from_row(r) for r in rows]
        except (sqlite3.DatabaseError, ValueError, TypeError) as exc:
            if isinstance(exc, sqlite3.DatabaseError) and is_busy(exc):
                raise TuningError(f"tuning cache {self.path} stayed locked: another graphopt is writing it; try again") from exc
            # Damage that quick_check did not see (or a row that is not ours): distrust the file.
            self._conn.close()
            with open_lock(self.path):
                quarantine(self.path, f"is corrupt ({exc})", self._ident, self._warn)
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
        write_export(Path(path), records)
        return len(records)

    def import_(self, path: str | os.PathLike) -> int:
        """Read a JSON export; all entries are validated before any is stored. Returns the count.

        Imported entries never replace entries measured on this machine with the same key.
        """
        records = read_export(Path(path))
        rows = [record_row(r) for r in records]
        updates = ", ".join(f"{c} = excluded.{c}" for c in ALL_COLUMNS if c not in KEY_COLUMNS)
        if rows:
            self._write(
                f"INSERT INTO timings ({', '.join(ALL_COLUMNS)}) VALUES ({', '.join('?' * len(ALL_COLUMNS))}) "
                f"ON CONFLICT ({', '.join(KEY_COLUMNS)}) DO UPDATE SET {updates} WHERE timings.origin != 'local'",
                rows,
            )
        return len(rows)


__all__ = ["TuningCache", "TuningCacheWarning"]
