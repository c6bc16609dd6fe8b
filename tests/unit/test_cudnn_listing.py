"""cuDNN plan listings remembered on disk (``graphopt.providers.cudnn_listing``): a warm run names
every plan without building a cuDNN graph; a new GPU or cuDNN version lists again; an empty listing
(a graph cuDNN refused) is kept, a failed one is not; a damaged file is listed over."""

from __future__ import annotations

import json
import os

import pytest

from graphopt.providers import cudnn_listing as cl

V1 = (("cudnn", "91900"), ("cudnn_frontend", "1.32.0"))
V2 = (("cudnn", "92000"), ("cudnn_frontend", "1.33.0"))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHOPT_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(cl, "_MEMO", {})
    return tmp_path


def _lister(names, calls):
    def listing():
        calls.append(1)
        return list(names)
    return listing


def test_a_second_process_reads_the_listing_from_disk(cache_dir, monkeypatch):
    calls = []
    assert cl.remembered("conv|sig", "NVIDIA H200 sm_90", V1, _lister(["eng0", "eng7_k2=3"], calls)) == ["eng0", "eng7_k2=3"]
    monkeypatch.setattr(cl, "_MEMO", {})  # a fresh process
    assert cl.remembered("conv|sig", "NVIDIA H200 sm_90", V1, _lister(["other"], calls)) == ["eng0", "eng7_k2=3"]
    assert calls == [1]
    (path,) = [p for p in os.listdir(cache_dir) if p.startswith("cudnn-plans-")]
    assert json.loads((cache_dir / path).read_text()) == {"conv|sig": ["eng0", "eng7_k2=3"]}
    assert oct((cache_dir / path).stat().st_mode & 0o777) == "0o644"


def test_another_gpu_or_version_lists_again(cache_dir):
    calls = []
    cl.remembered("k", "NVIDIA H200 sm_90", V1, _lister(["a"], calls))
    assert cl.remembered("k", "NVIDIA A100 sm_80", V1, _lister(["b"], calls)) == ["b"]
    assert cl.remembered("k", "NVIDIA H200 sm_90", V2, _lister(["c"], calls)) == ["c"]
    assert calls == [1, 1, 1] and len(os.listdir(cache_dir)) == 3


def test_an_empty_listing_is_kept_and_a_failed_one_is_not(cache_dir, monkeypatch):
    calls = []
    assert cl.remembered("k", "gpu", V1, _lister([], calls)) == []  # cuDNN's verdict: no plan here
    monkeypatch.setattr(cl, "_MEMO", {})  # a fresh process
    assert cl.remembered("k", "gpu", V1, _lister(["a"], calls)) == [] and calls == [1]

    def failed():
        calls.append(1)
        return None

    assert cl.remembered("k2", "gpu", V1, failed) == []  # not a verdict: listed again next time
    assert cl.remembered("k2", "gpu", V1, _lister(["b"], calls)) == ["b"] and calls == [1, 1, 1]


def test_listings_of_several_signatures_accumulate_and_a_damaged_file_is_listed_over(cache_dir, monkeypatch):
    calls = []
    path = cl._path("gpu", V1)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("{not json")
    assert cl.remembered("k1", "gpu", V1, _lister(["a"], calls)) == ["a"]
    cl.remembered("k2", "gpu", V1, _lister(["b"], calls))
    monkeypatch.setattr(cl, "_MEMO", {})
    assert cl.remembered("k1", "gpu", V1, _lister(["x"], calls)) == ["a"]
    assert cl.remembered("k2", "gpu", V1, _lister(["x"], calls)) == ["b"] and calls == [1, 1]
