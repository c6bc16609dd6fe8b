"""The device scripts under bench/ on the CPU: each parses (a syntax error costs a device call), and
device_bench.sh's ``exit_of`` says a bench script's failure plainly (a status hidden behind ``tee`` /
``tail`` once hid a segfault)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.sh")))
def test_script_parses(script):
    r = subprocess.run(["bash", "-n", str(BENCH / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_exit_of_names_the_script_and_the_reason(tmp_path):
    text = (BENCH / "device_bench.sh").read_text()
    fn = re.search(r"^exit_of\(\) \{.*?^\}", text, re.S | re.M).group(0)
    body = fn + f"""
'{sys.executable}' -c "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)" 2>&1 | tail -1; exit_of crash.py "${{PIPESTATUS[0]}}"
timeout 1 sleep 5 | tail -1; exit_of slow.py "${{PIPESTATUS[0]}}"
true | tail -1; exit_of fine.py "${{PIPESTATUS[0]}}"
"""
    r = subprocess.run(["bash", "-c", body], capture_output=True, text=True, env={**os.environ, "OUT": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "exit_status.txt").read_text().splitlines()
    assert lines == ["device_bench: crash.py exited with status 139 (signal 11: PYTHONFAULTHANDLER printed the "
                     "Python stack in its log)", "device_bench: slow.py exited with status 124 (its time limit)"]


def test_result_files_are_named_by_the_gpu_that_made_them(monkeypatch):
    """A fixed default suffix (it was h200) merged an A100's rows, or a dry run's, into the H200's
    committed result files: the default is the machine's GPU as ``--gpu auto`` names it, cpu without one."""
    sys.path.insert(0, str(BENCH))
    from lowering_bench import gpu_tag

    import graphopt.tune.gpus as gpus

    monkeypatch.setattr(gpus, "detect_devices", lambda: [])
    assert gpu_tag() == "cpu"
    fake = gpus.DeviceInfo(index=0, name="NVIDIA A100-SXM4-80GB", normalized=gpus.try_normalize_gpu_name("NVIDIA A100-SXM4-80GB"),
                           compute_capability=(8, 0), driver_version="13.0", cuda_version="13.0", cupy_version="14",
                           total_memory=0, l2_cache_bytes=0, multiprocessors=108)
    monkeypatch.setattr(gpus, "detect_devices", lambda: [fake])
    assert gpu_tag() == "a100"
    assert gpu_tag("NVIDIA H200") == "h200" and gpu_tag("") == "unknown"  # a run header's GPU
    for script in ("e2e.py", "cbr_layers.py", "gemm_act.py", "transformer_kernels.py", "runtime_bench.py",
                   "cache_speed.py", "conformance.py"):
        text = (BENCH / script).read_text()
        assert not re.search(r"""add_argument\("--gpu(-name)?", default="h200""", text), script


def test_the_early_start_probe_names_signatures_the_registry_accepts():
    """bench/probe_early_start.py runs on the device only (it reads a captured graph's edges through the
    driver): here its signatures are checked to be ones every family accepts, so a device call is not
    spent on a typo."""
    sys.path.insert(0, str(BENCH))
    from _scripts import load_script  # noqa: PLC0415

    from graphopt.kernels.check import output_shape
    from graphopt.kernels.registry import applicable

    probe = load_script("bench/probe_early_start.py")
    for label, sig in probe.signatures():
        ok, _ = applicable(sig, (9, 0))
        assert ok, label
        assert all(d > 0 for d in output_shape(sig)), label
    from graphopt.lowering.early_start import EdgeData

    assert EdgeData.type.offset == 2 and ctypes_size(EdgeData) == 8  # CUgraphEdgeData's layout


def ctypes_size(struct) -> int:
    import ctypes

    return ctypes.sizeof(struct)


def test_rewriting_a_run_on_the_cpu_keeps_the_name_of_the_gpu_it_ran_on(tmp_path):
    """``gemm_act.py --rerender`` and ``transformer_kernels.py --merge`` need no GPU: without --gpu-name
    their file is named by the GPU the run's header names, not by this machine (cpu)."""
    results = BENCH / "results"
    for cmd, name in (
        (["gemm_act.py", "--rerender", str(results / "gemm_act_h200.json")], "gemm_act_h200.json"),
        (["transformer_kernels.py", "--merge", str(results / "transformer_kernels_h200_2026-12-04.json"),
          str(results / "transformer_kernels_h200_attention_f90f151.json")], "transformer_kernels_h200.json"),
    ):
        r = subprocess.run([sys.executable, str(BENCH / cmd[0]), *cmd[1:], "--out", str(tmp_path)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / name).is_file(), sorted(p.name for p in tmp_path.iterdir())


class _FakeDriver:
    """The driver calls graphopt.lowering.early_start makes for the probe, over a fixed graph: marker -> plan -> plan -> marker,
    the plan's kernel launched to start early (programmatic edge) after the first plan only."""

    NODES = [0x10, 0x20, 0x30, 0x40]
    NAMES = {0x10: b"graphopt_order_marker", 0x20: b"sdpa_kernel", 0x30: b"sdpa_kernel", 0x40: b"graphopt_order_marker"}
    EDGES = [(0x10, 0x20, 0), (0x20, 0x30, 1), (0x30, 0x40, 0)]

    def cuGraphGetNodes(self, graph, nodes, count):
        if nodes is not None:
            for i, n in enumerate(self.NODES):
                nodes[i] = n
        count._obj.value = len(self.NODES)
        return 0

    def cuGraphGetEdges_v2(self, graph, src, dst, data, count):
        if src is not None:
            for k, (a, b, t) in enumerate(self.EDGES):
                src[k], dst[k] = a, b
                data[k].type, data[k].from_port = t, t
        count._obj.value = len(self.EDGES)
        return 0

    def cuGraphNodeGetType(self, node, out):
        out._obj.value = 0
        return 0

    def cuGraphKernelNodeGetParams_v2(self, node, buf):
        import ctypes

        ctypes.c_void_p.from_buffer(buf, 0).value = node.value + 1  # a CUfunction handle per node
        return 0

    def cuFuncGetName(self, name, func):
        name._obj.value = self.NAMES[func.value - 1]
        return 0

    def cuKernelGetName(self, name, kern):
        return 1


def test_the_early_start_probe_reads_kernel_names_and_programmatic_edges():
    from _scripts import load_script  # noqa: PLC0415

    probe = load_script("bench/probe_early_start.py")
    got = probe.graph_structure(_FakeDriver(), 0x1234)
    assert [n.get("kernel") for n in got["nodes"]] == ["graphopt_order_marker", "sdpa_kernel", "sdpa_kernel",
                                                        "graphopt_order_marker"]
    assert got["edges"] == [{"from": 0, "to": 1, "type": "default", "from_port": "default"},
                            {"from": 1, "to": 2, "type": "programmatic", "from_port": "programmatic"},
                            {"from": 2, "to": 3, "type": "default", "from_port": "default"}]
    assert probe.early_kernels(got) == ["sdpa_kernel"]
    assert probe.early_kernels({**got, "edges": [{**e, "type": "default"} for e in got["edges"]]}) == []


def test_barrier_left_out_restores_the_barrier_even_after_an_error():
    sys.path.insert(0, str(BENCH))
    from lowering_bench import barrier_left_out

    from graphopt.lowering import barrier as barrier_mod

    real = barrier_mod.barrier
    with pytest.raises(RuntimeError):
        with barrier_left_out():
            assert barrier_mod.barrier is not real and barrier_mod.barrier() is None
            raise RuntimeError("a timing failed")
    assert barrier_mod.barrier is real


def test_the_attention_table_shows_the_placed_timing_and_counts_its_verdict(tmp_path, monkeypatch):
    """``transformer_kernels.py``'s table: a row's ``placed`` figures (graphopt's choice and SDPA each
    after the same ordinary launch, ``placed_timing.py``) are shown and counted; rows without them
    (earlier runs, or a failed placed timing) are left out of that count, not failed."""
    import json

    monkeypatch.syspath_prepend(str(BENCH))
    import transformer_kernels

    run = json.loads((BENCH / "results" / "transformer_kernels_h200_attention_f90f151.json").read_text())
    rows = run["attention"][:3]
    rows[0]["placed"] = {"graphopt_placed_us": 24.1, "torch_placed_us": 24.5, "lead_us": 1.9, "placed_ratio_paired": 0.984}
    rows[1]["placed"] = {"graphopt_placed_us": 25.0, "torch_placed_us": 24.8, "lead_us": 1.9, "placed_ratio_paired": 1.008}
    rows[2]["placed"] = {"error": "RuntimeError: capture failed"}
    transformer_kernels._write(str(tmp_path), dict(run["header"]), [], rows, [], 4.0, "h200")
    out = json.loads((tmp_path / "transformer_kernels_h200.json").read_text())
    assert out["header"]["summary"]["attention_placed_at_least_as_fast_as_sdpa_(paired)"] == "1 of 2"
    md = (tmp_path / "transformer_kernels_h200.md").read_text()
    assert "| 24.1 / 24.5 | 0.984 |" in md and "| 25.0 / 24.8 | 1.008 |" in md and "| - | - |" in md


def test_a_partial_transformer_rerun_merged_into_the_full_table_drops_no_row(tmp_path, monkeypatch):
    """``transformer_kernels.py --merge MEM ATTN --previous FULL``: the 805f74b memory run measured only the GELU
    and softmax rows, and merged on its own it replaced the H200's 17-row table with 8 rows. With the full
    table as ``previous`` the new rows replace theirs, the norms and the attention rows not measured again
    (4096 keys) stay, marked with the run they came from."""
    import json

    monkeypatch.syspath_prepend(str(BENCH))
    import transformer_kernels

    results = BENCH / "results"
    full = results / "transformer_kernels_h200.json"
    partial = results / "transformer_kernels_h200_805f74b.json"
    transformer_kernels.merge(str(tmp_path), str(partial), str(partial), gpu_name="h200", previous=str(full))
    out = json.loads((tmp_path / "transformer_kernels_h200.json").read_text())
    old, new = json.loads(full.read_text()), json.loads(partial.read_text())
    key = transformer_kernels.MEMORY_KEY
    assert {tuple(r[k] for k in key) for r in out["memory_bound"]} == \
        {tuple(r[k] for k in key) for r in old["memory_bound"] + new["memory_bound"]}
    by_key = {tuple(r[k] for k in key): r for r in out["memory_bound"]}
    for r in new["memory_bound"]:  # a measured row is the new run's, unmarked
        assert by_key[tuple(r[k] for k in key)]["graphopt_us"] == r["graphopt_us"]
        assert "earlier_run" not in by_key[tuple(r[k] for k in key)]
    norms = [r for r in out["memory_bound"] if r["kernel"] == "LayerNorm"]
    assert norms and all("556fae7" in r["earlier_run"] for r in norms)
    seqs = {r["seq"] for r in out["attention"]}
    assert 4096 in seqs and len(out["attention"]) == len(old["attention"])
    assert "(earlier run: " in (tmp_path / "transformer_kernels_h200.md").read_text()


def test_a_rerun_of_some_layers_keeps_their_rows_at_other_batches():
    """``cbr_layers.py --only L --batches 32 --previous F`` dropped L's bs1 rows from F (the H100's table lost
    eight MobileNetV2 depthwise bs1 rows that way): only the rows the run measures again are replaced."""
    sys.path.insert(0, str(BENCH))
    import importlib

    cbr_layers = importlib.import_module("cbr_layers")
    prev = [{"layer": layer, "bs": bs, "dtype": dt} for layer in ("a", "b") for bs in (1, 32) for dt in ("float16", "float32")]
    kept = cbr_layers.kept_rows(prev, {"a"}, [32], ["float16"])
    assert {"layer": "a", "bs": 32, "dtype": "float16"} not in kept and len(kept) == len(prev) - 1
    assert cbr_layers.kept_rows(prev, None, [32], ["float16"]) == prev
    assert len(cbr_layers.kept_rows(prev, {"a", "b"}, [1, 32], ["float16", "float32"])) == 0


def test_a_rerun_cut_by_its_budget_keeps_the_earlier_rows_it_did_not_reach():
    """An ``--only`` rerun at bs1,32 with a 90 s budget measured bs1 and dropped the eleven bs32 rows it had
    meant to measure again (the H200's table at 805f74b): a layer the budget did not reach keeps its earlier row."""
    sys.path.insert(0, str(BENCH))
    import importlib

    cbr_layers = importlib.import_module("cbr_layers")
    earlier = {("a", 32, "float16"): {"layer": "a", "bs": 32, "dtype": "float16", "graphopt_us": 1.0}}
    rows, skipped = [], []
    cbr_layers.skip_for_time(rows, skipped, earlier, "a", 32, "float16")
    cbr_layers.skip_for_time(rows, skipped, earlier, "b", 32, "float16")
    assert rows == [earlier[("a", 32, "float16")]]
    assert skipped == ["a bs32 float16 (its earlier row kept)", "b bs32 float16"]


def test_the_depthwise_profile_names_forms_and_layers_the_registry_takes():
    """bench/dw_profile.py (device step 35) builds its forms by key on MobileNetV2's depthwise layers: every
    key resolves, every layer is a valid depthwise signature, and each form applies where the tuner offers it."""
    sys.path.insert(0, str(BENCH))
    import importlib

    from graphopt.kernels import geometry as geo
    from graphopt.kernels.registry import candidate_from_key

    dw = importlib.import_module("dw_profile")
    for name, (c, h, s) in dw.LAYERS.items():
        sig = dw.layer_sig(name, 32, "float16")
        g = geo.conv_geom(sig)
        assert (g.G, g.C, g.H, g.sh, g.OH) == (c, c, h, s, (h + 2 - 3) // s + 1)
        applies = {k: candidate_from_key("CBR", k).applies(sig) for k in dw.FORMS}
        assert applies["depthwise_nhwc"] is None and applies["depthwise_nhwc:tile=16x16"] is None
        assert (applies["depthwise_nhwc:rows=4"] is None) == (s == 1)


def test_sass_ops_reads_opcodes_in_order_and_says_when_cuobjdump_is_missing(monkeypatch, capsys):
    """``bench/sass_ops.py``: the instruction lines of ``cuobjdump -sass`` (predicated or not) become
    (opcode, modifiers) in program order; without cuobjdump it says what to install and exits 2."""
    sys.path.insert(0, str(BENCH))
    import importlib

    sass_ops = importlib.import_module("sass_ops")
    text = """
        /*0360*/              @!P0 LDG.E.128.CONSTANT R8, desc[UR12][R26.64] ;                     /* 0x0000000c1a088981 */
                                                                                                     /* 0x000fe200000e0000 */
        /*3160*/                   LDS.128 R16, [R16] ;                                            /* 0x0000000010107984 */
        /*3170*/                   FFMA R3, R4, R5, R3 ;                                           /* 0x0000000504037223 */
        .L_x_12:
        /*a1f0*/                   STG.E.128 desc[UR12][R4.64], R8 ;                               /* 0x0000000804007986 */
    """
    assert sass_ops.opcodes(text) == [("LDG", ".E.128.CONSTANT"), ("LDS", ".128"), ("FFMA", ""), ("STG", ".E.128")]
    monkeypatch.setattr(sass_ops, "find_cuobjdump", lambda: None)
    assert sass_ops.main(["depthwise_nhwc.cu", "depthwise_nhwc<half_t,8,3,3,1>"]) == 2
    assert "pip install nvidia-cuda-cuobjdump" in capsys.readouterr().err


def _kernel_cache():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernel_cache", BENCH / "kernel_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_kernel_cache_refuses_another_nvrtc_version(tmp_path, capsys):
    """A cache built by another NVRTC than the device's would never be read there (its keys differ): exit 2
    with the versions named, and no tarball."""
    from graphopt.kernels.source import nvrtc_version

    out = tmp_path / "cubin.tar.xz"
    assert _kernel_cache().main(["--nvrtc", "9.9", "--out", str(out), "--cache-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "9.9" in err and nvrtc_version() in err and "nvidia-cuda-nvrtc==9.9" in err
    assert not out.exists()


def test_the_kernel_cache_packs_the_files_the_device_reads(tmp_path, monkeypatch):
    """The tarball holds each instance's cubin and lowered name under ``source.cubin_cache_key`` (what
    ``get_kernel`` looks up on the device), only the current instances, byte-identical on a rerun."""
    import tarfile

    from graphopt.kernels import registry, source

    if source.nvrtc_version() == "?":
        pytest.skip("NVRTC not importable")
    jobs = [("elementwise.cu", "spin"), ("elementwise.cu", source.instance("epilogue_gemm_vec", "float16", 8, 1))]
    monkeypatch.setattr(registry, "all_kernel_instances", lambda: jobs)
    cache = tmp_path / "c"
    cache.mkdir()
    monkeypatch.setenv("GRAPHOPT_KERNEL_CACHE", str(cache))  # main() points the compile cache there; restored after
    (cache / ("0" * 32 + ".cubin")).write_bytes(b"\x7fELF stale")  # an instance no longer listed
    (cache / ("0" * 32 + ".name")).write_text("stale")
    out = tmp_path / "o" / "cubin.tar.xz"
    mod = _kernel_cache()
    ver = source.nvrtc_version()
    args = ["--nvrtc", ver, "--arch", "sm_90", "--cache-dir", str(cache), "--out", str(out), "--workers", "1"]
    assert mod.main(args) == 0
    with tarfile.open(out) as tar:
        names = sorted(tar.getnames())
        keys = sorted(source.cubin_cache_key(s, e, "sm_90", ver) for s, e in jobs)
        assert names == sorted(f"./{k}.{x}" for k in keys for x in ("cubin", "name"))
        assert tar.extractfile(f"./{keys[0]}.cubin").read()[:4] == b"\x7fELF"
    first = out.read_bytes()
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert mod.main(args) == 0  # served from --cache-dir, packed the same
    assert out.read_bytes() == first
