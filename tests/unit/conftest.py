"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest


@pytest.fixture()
def emulated(monkeypatch):
    """The cuBLASLt provider over EmulatedLt (``_fake_cublaslt``: descriptors computed as cuBLASLt
    would, on host memory), on stream 0."""
    from _fake_cublaslt import EmulatedLt

    from graphopt.providers import cublaslt as prov
    from graphopt.providers import cublaslt_lib as lt

    lib = EmulatedLt()
    monkeypatch.setattr(lt, "_STATE", {"api": lt.Api(lib), "reason": None})
    monkeypatch.setattr(prov, "_SETUPS", {})
    monkeypatch.setattr(prov, "_stream", lambda: 0)
    return lib
