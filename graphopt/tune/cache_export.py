"""The tuning cache's JSON export: writing one atomically, reading one after validating every field.

No pickle anywhere: the file is data, not code. Imported entries serve ``--gpu X`` on machines where
X is absent (``TuningCache.best_for_gpu``).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Sequence

from graphopt.errors import TuningError
from graphopt.files import atomic_write
from graphopt.tune.cache_file import SCHEMA_VERSION
from graphopt.tune.cache_record import KEY_COLUMNS, TimingRecord

EXPORT_FORMAT = "graphopt-tuning-cache"


def write_export(path: Path, records: Sequence[TimingRecord]) -> None:
    """Write ``records`` to ``path`` as an export document, atomically."""
    doc = {
        "format": EXPORT_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "entries": [r.to_json() for r in records],
    }
    text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"
    _atomic_write_text(path, text)


def read_export(path: Path) -> list[TimingRecord]:
    """The records of the export document at ``path``, every one validated (else ``TuningError``)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise TuningError(f"cache import file {path} not found") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TuningError(f"cache import file {path} is not a graphopt cache export (not JSON: {exc})") from exc
    return _parse_export(doc, path)


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
    text_fields = KEY_COLUMNS + ("op", "lowering", "params", "status", "reason")
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


__all__ = ["EXPORT_FORMAT", "read_export", "write_export"]
