"""--gpu name normalization and device detection (CPU)."""

from __future__ import annotations

import sys

import pytest

from graphopt.errors import UsageError
from graphopt.tune import gpus
from graphopt.tune.gpus import (
    KNOWN_GPUS, DeviceInfo, detect_devices, gpu_spec, known_gpu_names, normalize_gpu_name, resolve_target,
)

NAMES = [
    ("A100", "a100"),
    ("a100", "a100"),
    ("a100-sxm4-80gb", "a100"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100-PCIE-40GB", "a100"),
    ("NVIDIA H200", "h200"),
    ("h200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H100 NVL", "h100"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA L4", "l4"),
    ("l40s", "l40s"),
    ("NVIDIA L40S", "l40s"),
    ("L40-S", "l40s"),
    ("NVIDIA L40", "l40"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA A10G", "a10g"),
    ("Tesla T4", "t4"),
    ("t4", "t4"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("rtx4090", "rtx4090"),
    ("RTX 4090", "rtx4090"),
    ("rtx_3090", "rtx3090"),
    ("NVIDIA GeForce RTX 3090", "rtx3090"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA RTX A6000", "a6000"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),
    ("  A100  ", "a100"),
    ("auto", "auto"),
    ("AUTO", "auto"),
    ("none", "none"),
    ("None", "none"),
]


@pytest.mark.parametrize("raw, expected", NAMES)
def test_normalize(raw, expected):
    assert normalize_gpu_name(raw) == expected


@pytest.mark.parametrize("raw", ["", "   ", "a1000", "h300", "radeon 7900", "NVIDIA", "rtx", "gpu0", "sxm4-80gb"])
def test_unknown_names_raise_with_the_known_list(raw):
    with pytest.raises(UsageError) as err:
        normalize_gpu_name(raw)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"unknown GPU name '{raw.strip()}" in msg or not raw.strip()
    for name in ("a100", "h100", "h200", "l4", "rtx4090", "auto", "none"):
        assert name in msg


def test_every_known_name_normalizes_to_itself_and_from_its_display_name():
    for name, spec in KNOWN_GPUS.items():
        assert normalize_gpu_name(name) == name
        assert normalize_gpu_name(spec.display) == name
        assert normalize_gpu_name(name.upper()) == name


@pytest.mark.parametrize("name, cc", [
    ("a100", (8, 0)), ("h100", (9, 0)), ("h200", (9, 0)), ("l4", (8, 9)), ("l40s", (8, 9)),
    ("rtx4090", (8, 9)), ("t4", (7, 5)), ("v100", (7, 0)), ("a10g", (8, 6)), ("b200", (10, 0)),
])
def test_compute_capabilities(name, cc):
    assert gpu_spec(name).compute_capability == cc
    assert gpu_spec(name).arch == f"sm_{cc[0]}{cc[1]}"


def test_gpu_spec_refuses_special_names():
    with pytest.raises(UsageError):
        gpu_spec("auto")


def test_known_names_sorted():
    names = known_gpu_names()
    assert names == sorted(names) and "h200" in names


def test_detect_devices_without_cupy_is_silent(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    assert detect_devices() == []
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


class _FakeRuntime:
    def __init__(self, names, fail_count=False):
        self.names = names
        self.fail_count = fail_count

    def getDeviceCount(self):
        if self.fail_count:
            raise RuntimeError("cudaErrorNoDevice")
        return len(self.names)

    def driverGetVersion(self):
        return 13000

    def runtimeGetVersion(self):
        return 12040

    def getDeviceProperties(self, i):
        major, minor = {"NVIDIA H200": (9, 0), "NVIDIA A100-SXM4-80GB": (8, 0)}.get(self.names[i], (7, 5))
        return {"name": self.names[i].encode(), "major": major, "minor": minor, "totalGlobalMem": 1 << 30,
                "l2CacheSize": 50 << 20, "multiProcessorCount": 132}


def _install_fake_cupy(monkeypatch, runtime):
    import types

    cupy = types.ModuleType("cupy")
    cupy.__version__ = "14.2.0"
    cuda = types.ModuleType("cupy.cuda")
    cuda.runtime = runtime
    cupy.cuda = cuda
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)


def test_detect_devices_reads_cupy(monkeypatch):
    _install_fake_cupy(monkeypatch, _FakeRuntime(["NVIDIA H200", "Some Future GPU X1"]))
    devs = detect_devices()
    assert [d.normalized for d in devs] == ["h200", "some-future-gpu-x1"]
    d = devs[0]
    assert (d.index, d.name, d.compute_capability, d.arch) == (0, "NVIDIA H200", (9, 0), "sm_90")
    assert (d.driver_version, d.cuda_version, d.cupy_version) == ("13.0", "12.4", "14.2.0")
    fp = d.fingerprint()
    assert (fp.gpu, fp.compute_capability, fp.driver, fp.cuda, fp.cupy) == ("h200", "9.0", "13.0", "12.4", "14.2.0")


def test_detect_devices_no_device(monkeypatch):
    _install_fake_cupy(monkeypatch, _FakeRuntime([], fail_count=True))
    assert detect_devices() == []


def _dev(name="NVIDIA H200", norm="h200", cc=(9, 0), index=0):
    return DeviceInfo(index, name, norm, cc, "13.0", "13.0", "14.2.0")


def test_resolve_target():
    h200 = [_dev(index=0), _dev(index=1)]
    t = resolve_target("auto", h200)
    assert t.name == "h200" and t.present and len(t.devices) == 2
    t = resolve_target("NVIDIA H200", h200)
    assert t.present and t.compute_capability == (9, 0)
    t = resolve_target("a100", h200)
    assert t.name == "a100" and not t.present and t.compute_capability == (8, 0)
    t = resolve_target("auto", [])
    assert t.name == "none" and not t.present and t.compute_capability is None
    t = resolve_target("none", h200)
    assert t.name == "none" and not t.present
    with pytest.raises(UsageError):
        resolve_target("h300", h200)


def test_resolve_none_never_detects(monkeypatch):
    monkeypatch.setattr(gpus, "detect_devices", lambda: pytest.fail("detect_devices called for --gpu none"))
    assert resolve_target("none").name == "none"


def test_detect_devices_without_a_cuda_driver_does_not_import_cupy(monkeypatch):
    """No libcuda: CuPy could see no device, so it is not imported to find that out (0.065 s)."""
    import builtins

    def no_driver(name):
        raise OSError(f"{name}: cannot open shared object file")

    real_import = builtins.__import__

    def guarded(name, *args, **kwargs):
        if name == "cupy" or name.startswith("cupy."):
            pytest.fail("cupy was imported")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(gpus.ctypes, "CDLL", no_driver)
    monkeypatch.setattr(builtins, "__import__", guarded)
    assert detect_devices() == []
