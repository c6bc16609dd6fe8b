"""The wheel ships every package and the top-level rules/ (as graphopt._rules)."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_on_disk_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "graphopt").rglob("__init__.py")}
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert "graphopt._rules" in listed


def test_shipped_rules_are_found_from_the_package():
    from graphopt.rewrite import shipped_rules_dir

    files = sorted(p.name for p in Path(shipped_rules_dir()).glob("*.toml"))
    assert files == sorted(p.name for p in (ROOT / "rules").glob("*.toml")) and "conv.toml" in files
