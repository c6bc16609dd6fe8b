"""Bucket dispatch of ``lowering_buckets`` (one choice per ``--shape-profile`` bucket): the half the
runtime needs (``decode``, ``choose``) and the encoder the tuner writes with. The profile parsing and
resolution stay in ``graphopt.tune.buckets``; one rule for the optimizer and the runtime lives here.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from graphopt.errors import TuningError

ATTR = "lowering_buckets"
OPTION = "--shape-profile"


def _sort_key(dims: Mapping[str, int]) -> tuple:
    return tuple(dims[k] for k in sorted(dims))


def encode(entries: Sequence[tuple[Mapping[str, int], str, str]]) -> str:
    """The ``lowering_buckets`` attribute value for ``[(dims, lowering, params), ...]``: compact JSON,
    sorted ascending, keys sorted (byte-identical for the same choices)."""
    rows = [{"dims": {k: int(v) for k, v in sorted(dims.items())}, "lowering": str(lowering), "params": str(params or "")}
            for dims, lowering, params in entries]
    rows.sort(key=lambda r: _sort_key(r["dims"]))
    return json.dumps(rows, sort_keys=True, separators=(",", ":"))


def _bad(why: str) -> TuningError:
    return TuningError(f"node attribute {ATTR}: {why}; run `graphopt optimize {OPTION} ...` again to rewrite it")


def decode(value: "str | bytes | Sequence[Mapping]") -> list[dict[str, Any]]:
    """The bucket list of a ``lowering_buckets`` value (JSON text or the list), checked and sorted."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise _bad(f"not valid JSON ({exc})") from None
    if not isinstance(value, list) or not value:
        raise _bad("expected a non-empty JSON list of buckets")
    rows = []
    names = None
    for i, row in enumerate(value):
        if not isinstance(row, Mapping) or not isinstance(row.get("dims"), Mapping) or not row["dims"]:
            raise _bad(f"bucket {i} is not an object with a non-empty 'dims' object")
        dims = row["dims"]
        if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in dims.items()):
            raise _bad(f"bucket {i}: dims must map names to positive integers, got {dict(dims)!r}")
        if names is not None and set(dims) != names:
            raise _bad(f"bucket {i} has dims {sorted(dims)}, bucket 0 has {sorted(names)}")
        names = set(dims)
        if not isinstance(row.get("lowering"), str) or not row["lowering"] or not isinstance(row.get("params", ""), str):
            raise _bad(f"bucket {i} needs a string 'lowering' and a string 'params'")
        rows.append({"dims": dict(dims), "lowering": row["lowering"], "params": row.get("params", "")})
    rows.sort(key=lambda r: _sort_key(r["dims"]))
    return rows


def choose(node_attrs_or_json: Any, actual_dims: Mapping[str, int]) -> tuple[str, str]:
    """The runtime's dispatch: ``(lowering, params)`` for the actual sizes of the profiled dims.

    ``node_attrs_or_json`` is the ``lowering_buckets`` JSON text (or its decoded list), a node's
    attributes as a mapping, or a node with ``attrs_dict()``. The first bucket (ascending) whose
    every dim is >= the actual size wins; above every bucket, the last (largest) one. A node
    without ``lowering_buckets`` gives its ``lowering`` / ``lowering_params``. ``TuningError``
    when the attribute is malformed or ``actual_dims`` lacks a dim the buckets dispatch on.
    """
    value = node_attrs_or_json
    if hasattr(value, "attrs_dict"):
        value = value.attrs_dict()
    if isinstance(value, Mapping):
        if value.get(ATTR) is None:
            lowering = value.get("lowering")
            if not lowering:
                raise TuningError("the node has neither lowering_buckets nor lowering; run `graphopt optimize` on it")
            return str(lowering), str(value.get("lowering_params") or "")
        value = value[ATTR]
    rows = decode(value)
    missing = sorted(set(rows[0]["dims"]) - set(actual_dims))
    if missing:
        raise TuningError(f"{ATTR} dispatches on dim(s) {', '.join(missing)}, but actual_dims gives only "
                          f"{sorted(actual_dims) or 'none'}; pass the actual size of every profiled dim")
    for row in rows:
        if all(actual_dims[k] <= v for k, v in row["dims"].items()):
            return row["lowering"], row["params"]
    return rows[-1]["lowering"], rows[-1]["params"]
