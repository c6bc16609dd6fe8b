"""The on-disk kernel cache compiles an instance once however many processes or threads want it at the
same time (a tuning worker's build beside the precompile pool): the second waits on the instance's lock
and reads the first one's cubin. Different instances still compile side by side."""

from __future__ import annotations

import threading
import time

from graphopt.kernels import source

CUBIN = b"\x7fELF fake cubin"


def _fake_compiler(monkeypatch, seconds):
    calls = []

    def compile_named(src, exprs, arch, fast=False):
        calls.append(exprs[0])
        time.sleep(seconds)
        return CUBIN + exprs[0].encode(), {exprs[0]: "lowered_" + exprs[0]}

    monkeypatch.setattr(source, "nvrtc_compile_named", compile_named)
    return calls


def _together(jobs):
    out = [None] * len(jobs)

    def run(i, job):
        out[i] = source._compile_one(job)

    threads = [threading.Thread(target=run, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_one_compile_for_concurrent_requests_of_one_instance(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHOPT_KERNEL_CACHE", str(tmp_path))
    calls = _fake_compiler(monkeypatch, 0.3)
    job = ("attention.cu", "attn_softmax<half_t,4,0,8,2>", "sm_90")
    results = _together([job] * 4)
    assert calls == [job[1]]
    assert all(r == (CUBIN + job[1].encode(), "lowered_" + job[1]) for r in results)
    assert source._compile_one(job) == results[0] and calls == [job[1]]  # served from the cache


def test_different_instances_compile_side_by_side(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHOPT_KERNEL_CACHE", str(tmp_path))
    calls = _fake_compiler(monkeypatch, 0.5)
    t0 = time.perf_counter()
    _together([("attention.cu", f"attn_softmax<half_t,{w},0,8,2>", "sm_90") for w in (1, 2, 4)])
    assert sorted(calls) == sorted(f"attn_softmax<half_t,{w},0,8,2>" for w in (1, 2, 4))
    assert time.perf_counter() - t0 < 1.4  # not serialized (3 x 0.5 s)


def test_an_unwritable_cache_compiles_without_a_lock(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GRAPHOPT_KERNEL_CACHE", str(blocker / "cubin"))
    calls = _fake_compiler(monkeypatch, 0.0)
    job = ("attention.cu", "attn_softmax<float,4,0,4,2>", "sm_90")
    assert source._compile_one(job)[1] == "lowered_" + job[1]
    assert source._compile_one(job)[1] == "lowered_" + job[1]
    assert calls == [job[1]] * 2  # nothing cached, nothing locked, no error
