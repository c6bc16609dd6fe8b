"""Fixtures of the runtime tests."""

from __future__ import annotations

import sys

import pytest

import _fake_cupy


@pytest.fixture()
def fake_cuda(monkeypatch):
    """A NumPy-backed stand-in for CuPy (``_fake_cupy``) installed as ``cupy``, with fresh streams."""
    cp, extra = _fake_cupy.make()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    for k, v in extra.items():
        monkeypatch.setitem(sys.modules, k, v)
    from graphopt.runtime import backend

    monkeypatch.setattr(backend, "_STREAMS", [])
    monkeypatch.setattr(backend, "_BLAS", {})
    return cp
