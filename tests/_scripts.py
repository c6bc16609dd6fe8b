"""A repository script (``bench/*.py``, ``models/build_samples.py``) loaded as a module for its tests:
the scripts are run by path, not installed, so they are not importable by name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str, register: bool = False):
    """The module of ``ROOT / relpath``; ``register``: also as ``sys.modules[its name]`` (dataclasses
    and sibling imports look the module up there)."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod
