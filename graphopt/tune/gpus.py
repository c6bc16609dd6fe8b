"""GPU names for ``--gpu`` and detection of the devices present.

``normalize_gpu_name`` turns whatever a user or a driver calls a GPU ("A100", "a100-sxm4-80gb",
"NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090") into one short lower-case name ("a100",
"rtx4090") that is compared with the device present and used as the GPU part of the tuning-cache
key. ``"auto"`` and ``"none"`` are passed through: they are the two special ``--gpu`` values.

``detect_devices`` lists the GPUs CuPy can see. On a machine without CuPy or without a GPU it
returns ``[]``; it never raises and never prints there (CuPy's import-time warnings are silenced).
"""

from __future__ import annotations

import ctypes
import re
import sys
import warnings
from dataclasses import dataclass

from graphopt.errors import UsageError, did_you_mean

SPECIAL_NAMES = ("auto", "none")


@dataclass(frozen=True)
class GpuSpec:
    """A GPU model graphopt knows: its normalized name, compute capability and marketing name."""

    name: str
    compute_capability: tuple[int, int]
    display: str

    @property
    def arch(self) -> str:
        """The NVRTC architecture flag value, for example ``"sm_90"``."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


# Normalized name -> spec. Kept sorted by name; the order is the order shown in error messages.
_SPECS = (
    GpuSpec("a10", (8, 6), "NVIDIA A10"),
    GpuSpec("a100", (8, 0), "NVIDIA A100"),
    GpuSpec("a10g", (8, 6), "NVIDIA A10G"),
    GpuSpec("a30", (8, 0), "NVIDIA A30"),
    GpuSpec("a40", (8, 6), "NVIDIA A40"),
    GpuSpec("a6000", (8, 6), "NVIDIA RTX A6000"),
    GpuSpec("b100", (10, 0), "NVIDIA B100"),
    GpuSpec("b200", (10, 0), "NVIDIA B200"),
    GpuSpec("gh200", (9, 0), "NVIDIA GH200"),
    GpuSpec("h100", (9, 0), "NVIDIA H100"),
    GpuSpec("h200", (9, 0), "NVIDIA H200"),
    GpuSpec("l4", (8, 9), "NVIDIA L4"),
    GpuSpec("l40", (8, 9), "NVIDIA L40"),
    GpuSpec("l40s", (8, 9), "NVIDIA L40S"),
    GpuSpec("rtx3080", (8, 6), "NVIDIA GeForce RTX 3080"),
    GpuSpec("rtx3090", (8, 6), "NVIDIA GeForce RTX 3090"),
    GpuSpec("rtx4080", (8, 9), "NVIDIA GeForce RTX 4080"),
    GpuSpec("rtx4090", (8, 9), "NVIDIA GeForce RTX 4090"),
    GpuSpec("rtx5090", (12, 0), "NVIDIA GeForce RTX 5090"),
    GpuSpec("rtx6000ada", (8, 9), "NVIDIA RTX 6000 Ada Generation"),
    GpuSpec("t4", (7, 5), "NVIDIA T4"),
    GpuSpec("v100", (7, 0), "NVIDIA V100"),
)
KNOWN_GPUS: dict[str, GpuSpec] = {s.name: s for s in _SPECS}

# Spellings that are not simply the normalized name with separators removed.
_ALIASES = {
    "rtxa6000": "a6000",
    "rtx6000adageneration": "rtx6000ada",
    "gh200480gb": "gh200",
}

# Words that carry no model information ("NVIDIA GeForce RTX 4090", "Tesla T4").
_NOISE = ("nvidia", "geforce", "tesla", "quadro")


def known_gpu_names() -> list[str]:
    """The normalized names ``--gpu`` accepts (besides ``auto`` and ``none``), sorted."""
    return sorted(KNOWN_GPUS)


def _lookup(tokens: list[str]) -> str | None:
    # Longest prefix of tokens first, so "l40 s" becomes l40s (not l40) and "rtx 4090" rtx4090,
    # while trailing variant words ("sxm4", "80gb", "pcie", "hbm3") are dropped.
    for k in range(len(tokens), 0, -1):
        joined = "".join(tokens[:k])
        if joined in KNOWN_GPUS:
            return joined
        if joined in _ALIASES:
            return _ALIASES[joined]
    return None


def try_normalize_gpu_name(name: str) -> str | None:
    """Like ``normalize_gpu_name`` but returns ``None`` for an unknown name instead of raising."""
    text = str(name).strip().lower()
    if text in SPECIAL_NAMES:
        return text
    tokens = [t for t in re.split(r"[\s_\-/,()]+", text) if t and t not in _NOISE]
    return _lookup(tokens) if tokens else None


def normalize_gpu_name(name: str) -> str:
    """Return the normalized GPU name (``"a100"``, ``"h200"``, ``"rtx4090"``) or ``auto`` / ``none``.

    Raises ``UsageError`` (exit 2) naming the closest known names and listing them all when the name
    is not recognised.
    """
    found = try_normalize_gpu_name(name)
    if found is None:
        hint = did_you_mean(str(name).strip().lower(), [*known_gpu_names(), *SPECIAL_NAMES])
        raise UsageError(
            f"unknown GPU name {name!r} for --gpu{hint or ';'} known names: {', '.join(known_gpu_names())}, "
            "or 'auto' to detect the device, or 'none' to skip lowering selection"
        )
    return found


def gpu_spec(name: str) -> GpuSpec:
    """The ``GpuSpec`` for any spelling of a known GPU name (``UsageError`` when unknown or special)."""
    norm = normalize_gpu_name(name)
    if norm in SPECIAL_NAMES:
        raise UsageError(f"--gpu {norm} names no particular GPU; give a GPU name such as a100")
    return KNOWN_GPUS[norm]


def _slug(name: str) -> str:
    return "-".join(t for t in re.split(r"[^a-z0-9]+", name.lower()) if t) or "unknown"


def _cuda_version_str(v: int) -> str:
    # CUDA encodes versions as 1000*major + 10*minor (13000 -> "13.0", 12040 -> "12.4").
    return f"{v // 1000}.{(v % 1000) // 10}"


@dataclass(frozen=True)
class DeviceInfo:
    """One visible GPU, as CuPy reports it.

    ``normalized`` is the ``--gpu`` name when the model is known, otherwise a slug of the device's
    own name (so an unknown GPU is still profiled and cached under a stable name).
    """

    index: int
    name: str
    normalized: str
    compute_capability: tuple[int, int]
    driver_version: str
    cuda_version: str
    cupy_version: str
    total_memory: int = 0
    l2_cache_bytes: int = 0
    multiprocessors: int = 0

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def fingerprint(self) -> "DeviceFingerprint":
        return DeviceFingerprint(
            gpu=self.normalized,
            compute_capability=f"{self.compute_capability[0]}.{self.compute_capability[1]}",
            driver=self.driver_version,
            cuda=self.cuda_version,
            cupy=self.cupy_version,
        )


@dataclass(frozen=True)
class DeviceFingerprint:
    """The device part of the tuning-cache key: a timing is only trusted when all five match."""

    gpu: str
    compute_capability: str
    driver: str
    cuda: str
    cupy: str

    def describe(self) -> str:
        return (
            f"{self.gpu} (sm {self.compute_capability}, driver {self.driver}, CUDA {self.cuda}, "
            f"CuPy {self.cupy})"
        )


def _no_cuda_driver() -> bool:
    """True when this Linux process cannot load the CUDA driver library (``libcuda.so.1``, which CuPy's
    runtime loads the same way): CuPy would then see no device, and importing it only to learn that
    cost 0.065 s of every ``optimize --gpu NAME`` on a machine without a GPU. False on other systems
    and when CuPy is already imported (asking it costs nothing; tests put a stand-in there)."""
    if not sys.platform.startswith("linux") or "cupy" in sys.modules:
        return False
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


def detect_devices() -> list[DeviceInfo]:
    """All GPUs CuPy can see, in device-index order; ``[]`` without CuPy or a GPU (never raises)."""
    if _no_cuda_driver():
        return []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import cupy  # noqa: PLC0415 - optional dependency, imported only when asked
            from cupy.cuda import runtime
    except Exception:  # ImportError, or a CuPy that cannot find its CUDA libraries
        return []
    try:
        count = runtime.getDeviceCount()
    except Exception:  # no driver, no device, or a driver too old for this CuPy
        return []
    try:
        driver = _cuda_version_str(runtime.driverGetVersion())
        cuda = _cuda_version_str(runtime.runtimeGetVersion())
    except Exception:
        return []
    devices = []
    for i in range(count):
        try:
            props = runtime.getDeviceProperties(i)
        except Exception:
            continue
        raw = props.get("name", b"")
        name = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        name = name.strip("\x00 ").strip()
        devices.append(
            DeviceInfo(
                index=i,
                name=name,
                normalized=try_normalize_gpu_name(name) or _slug(name),
                compute_capability=(int(props.get("major", 0)), int(props.get("minor", 0))),
                driver_version=driver,
                cuda_version=cuda,
                cupy_version=str(getattr(cupy, "__version__", "unknown")),
                total_memory=int(props.get("totalGlobalMem", 0)),
                l2_cache_bytes=int(props.get("l2CacheSize", 0)),
                multiprocessors=int(props.get("multiProcessorCount", 0)),
            )
        )
    return devices


@dataclass(frozen=True)
class Target:
    """What ``--gpu`` resolved to.

    ``name`` is the normalized target (``"none"`` for ``--gpu none`` and for ``--gpu auto`` on a
    machine without a GPU); ``devices`` are the visible GPUs of that model (empty when absent).
    """

    requested: str
    name: str
    devices: tuple[DeviceInfo, ...]

    @property
    def present(self) -> bool:
        return bool(self.devices)

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        if self.devices:
            return self.devices[0].compute_capability
        spec = KNOWN_GPUS.get(self.name)
        return spec.compute_capability if spec else None


def resolve_target(gpu: str, devices: list[DeviceInfo] | None = None) -> Target:
    """Resolve a ``--gpu`` value against the visible devices (``detect_devices()`` when not given).

    ``auto`` picks the model of device 0 (and every visible device of that model); a name picks the
    visible devices of that model, if any; ``none`` never looks at the devices.
    """
    norm = normalize_gpu_name(gpu)
    if norm == "none":
        return Target(str(gpu), "none", ())
    if devices is None:
        devices = detect_devices()
    if norm == "auto":
        if not devices:
            return Target(str(gpu), "none", ())
        norm = devices[0].normalized
    return Target(str(gpu), norm, tuple(d for d in devices if d.normalized == norm))
