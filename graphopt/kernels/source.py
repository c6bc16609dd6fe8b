"""Kernel sources: reading, hashing, naming template instances, and compiling them.

Every ``.cu`` file here is compiled with ``common.cuh`` prepended (so no ``#include`` path is needed,
and NVRTC needs no CUDA headers). Template instances are named only from validated integers and the
fixed C type map below: nothing from a model reaches the CUDA text.

Two compilers:
- :func:`get_kernel` (GPU): ``cupy.RawModule`` through NVRTC; CuPy adds ``-arch=sm_XX`` of the
  current device itself.
- :func:`nvrtc_compile` (CPU, used by CI): NVRTC directly through ``cupy_backends.cuda.libs.nvrtc``
  for an explicit ``arch``; this needs the NVRTC shared library (pip ``nvidia-cuda-nvrtc``) but no
  GPU and no driver.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

from graphopt.errors import TuningError

KERNEL_DIR = Path(__file__).resolve().parent
PRELUDE = "common.cuh"
SOURCES = ("direct_conv.cu", "depthwise_nhwc.cu", "stem_conv.cu", "mma_gemm.cu", "elementwise.cu", "norm.cu", "attention.cu", "pool.cu", "rope.cu",
           "group_norm.cu", "glu.cu", "im2col_rows.cu")
OPTIONS = ("-std=c++17",)

# numpy dtype name -> C storage type used in the kernels (fp16 is stored as raw 16-bit words).
CTYPE = {"float32": "float", "float16": "half_t"}
# Dynamic shared memory a launch gets without opting in to more (cudaFuncAttributeMaxDynamicSharedMemorySize).
SHARED_DEFAULT_BYTES = 48 * 1024
# Elements of each kernel dtype in one 16-byte load (the vector width every vectorized kernel uses).
VEC16 = {"float16": 8, "float32": 4}

# Activation name (the ops contract) -> code in common.cuh.
ACT_CODES = {
    "none": 0, "Relu": 1, "Clip": 2, "LeakyRelu": 3, "Sigmoid": 4, "SiLU": 5,
    "HardSwish": 6, "HardSigmoidMul": 7, "Gelu": 8, "GeluTanh": 9, "HardSigmoid": 10, "QuickGelu": 11,
}


# Sources added with register_source (kernels defined outside this package): name -> CUDA text.
_REGISTERED: dict[str, str] = {}


def register_source(name: str, text: str) -> None:
    """Make CUDA ``text`` a kernel source named ``name`` (for example ``"bias_relu.cu"``), so that
    ``get_kernel``, ``source_hash`` and ``nvrtc_compile`` work with it as with the shipped ``.cu``
    files (``common.cuh`` is prepended). Call it at import time of the module that defines the
    candidates. The same name with other text is refused: the tuning cache keys on the hash."""
    if name in SOURCES:
        raise TuningError(f"kernel source {name!r} is shipped with graphopt; pick another name")
    old = _REGISTERED.get(name)
    if old is not None and old != text:
        raise TuningError(f"kernel source {name!r} is already registered with other text; pick another name")
    _REGISTERED[name] = str(text)


@lru_cache(maxsize=None)
def read_source(name: str) -> str:
    """The full text NVRTC compiles for ``name``: the prelude, then the file (or registered text)."""
    if name not in SOURCES and name not in _REGISTERED:
        raise TuningError(f"unknown kernel source {name!r}; known: {', '.join(SOURCES + tuple(sorted(_REGISTERED)))}")
    prelude = (KERNEL_DIR / PRELUDE).read_text()
    body = _REGISTERED[name] if name in _REGISTERED else (KERNEL_DIR / name).read_text()
    return f'{prelude}\n#line 1 "{name}"\n{body}'


@lru_cache(maxsize=None)
def source_hash(name: str) -> str:
    """Short SHA-256 of the compiled text (prelude included, compile options too)."""
    h = hashlib.sha256(read_source(name).encode())
    h.update(" ".join(OPTIONS).encode())
    return h.hexdigest()[:16]


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TuningError(f"kernel template parameter {v!r} is not an int")
    return int(v)


def instance(template: str, dtype: str, *ints: int) -> str:
    """``template<ctype, i0, i1, ...>`` from validated parts, e.g. ``mma_gemm<half_t,2,128,...>``."""
    if template not in ("direct_conv", "depthwise_nhwc", "depthwise_nhwc_tiled", "stem_conv", "mma_gemm", "epilogue_nchw", "epilogue_gemm", "epilogue_gemm_vec", "im2col", "im2col_rows", "nchw_to_nhwc", "weight_to_rsc",
                        "pad_channels_nhwc",
                        "norm_rows", "attn_softmax", "attn_softmax_rows", "attn_batch_ptrs", "flash_attn", "flash_mma", "pool2d", "global_pool", "global_pool_finish", "rope", "rope_vec", "group_norm",
                        "glu_gate"):
        raise TuningError(f"unknown kernel template {template!r}")
    if dtype not in CTYPE:
        raise TuningError(f"dtype {dtype!r} has no kernel; supported: {', '.join(CTYPE)}")
    parts = [CTYPE[dtype]] + [str(_int(i)) for i in ints]
    return f"{template}<{','.join(parts)}>"


_KERNELS: dict[tuple[str, str, str], Any] = {}
_CUBIN_DIR: list[str] = []


def device_arch() -> str:
    """``sm_XY`` of the current CUDA device."""
    import cupy

    return "sm_" + cupy.cuda.Device().compute_capability


def _load(source: str, expr: str, arch: str, cubin: bytes, lowered: str):
    import os
    import tempfile

    import cupy

    if not _CUBIN_DIR:
        _CUBIN_DIR.append(tempfile.mkdtemp(prefix="graphopt-cubin-"))
    path = os.path.join(_CUBIN_DIR[0], hashlib.sha256(f"{source}|{expr}|{arch}".encode()).hexdigest()[:24] + ".cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    return cupy.RawModule(path=path).get_function(lowered)


def get_kernel(source: str, expr: str, arch: str | None = None):
    """The ``cupy.RawKernel`` for template instance ``expr`` of ``source``, compiled by NVRTC for
    ``arch`` (default: the current device's ``sm_XY``) and cached for the process."""
    arch = arch or device_arch()
    key = (source, expr, arch)
    k = _KERNELS.get(key)
    if k is None:
        cubin, lowered = _compile_one((source, expr, arch))
        k = _KERNELS[key] = _load(source, expr, arch, cubin, lowered)
    return k


def cubin_cache_dir() -> str:
    """Where compiled cubins are kept between processes: ``$GRAPHOPT_KERNEL_CACHE`` or
    ``$XDG_CACHE_HOME/graphopt/cubin`` (``~/.cache/graphopt/cubin``)."""
    import os

    d = os.environ.get("GRAPHOPT_KERNEL_CACHE")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "graphopt", "cubin")
    return d


def nvrtc_version() -> str:
    """``major.minor`` of the NVRTC CuPy loads (``?`` without one): part of every cached cubin's key."""
    try:
        from cupy_backends.cuda.libs import nvrtc

        return ".".join(map(str, nvrtc.getVersion()))
    except Exception:
        return "?"


def cubin_cache_key(source: str, expr: str, arch: str, nvrtc: str | None = None) -> str:
    """The on-disk cache's name for one instance: source text (with its headers), instance, arch and
    NVRTC version; ``<key>.cubin`` and ``<key>.name`` hold the cubin and its lowered name."""
    ver = nvrtc or nvrtc_version()
    return hashlib.sha256(f"{source_hash(source)}|{expr}|{arch}|{ver}".encode()).hexdigest()[:32]


def _compile_one(job: tuple[str, str, str]) -> tuple[bytes, str]:
    """Compile one instance, through an on-disk cache keyed by source text, options, NVRTC
    version, instance and arch (atomic writes: concurrent processes never see half a file)."""
    import os

    source, expr, arch = job
    key = cubin_cache_key(source, expr, arch)
    d = cubin_cache_dir()
    path = os.path.join(d, key + ".cubin")
    name_path = os.path.join(d, key + ".name")
    cached = _read_cached(path, name_path)
    if cached:
        return cached
    with _compiling(d, key):
        cached = _read_cached(path, name_path)  # compiled by the process we waited for
        if cached:
            return cached
        cubin, names = nvrtc_compile_named(source, [expr], arch)
        try:
            os.makedirs(d, exist_ok=True)
            for target, data in ((name_path, names[expr].encode()), (path, cubin)):
                tmp = f"{target}.{os.getpid()}.tmp"
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, target)
        except OSError:
            pass  # a read-only cache only costs a recompile
    return cubin, names[expr]


def _read_cached(path: str, name_path: str) -> tuple[bytes, str] | None:
    """(cubin, lowered name) from the on-disk cache, or None."""
    try:
        with open(path, "rb") as f:
            cubin = f.read()
        with open(name_path) as f:
            lowered = f.read().strip()
    except OSError:
        return None
    return (cubin, lowered) if cubin[:4] == b"\x7fELF" and lowered else None


@contextmanager
def _compiling(d: str, key: str):
    """Hold an exclusive lock on instance ``key`` while this process compiles it, so a second process
    wanting it (a tuning worker's build while the precompile pool compiles the same instance) waits and
    reads the cubin instead of compiling it again. By hand on ``fcntl.flock`` (the standard library; the
    ``filelock`` package would be a dependency for these few lines); the kernel releases the lock if
    the holder dies. No lock where the cache cannot be written or ``fcntl`` is missing (each process
    then compiles, as before)."""
    import os

    try:
        import fcntl

        os.makedirs(d, exist_ok=True)
        f = open(os.path.join(d, key + ".lock"), "a")
    except (ImportError, OSError):
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prebuild(jobs: Sequence[tuple[str, str]], arch: str | None = None, workers: int | None = None) -> dict[tuple[str, str], str]:
    """Compile many instances in parallel worker processes (NVRTC only, no GPU there) and load them.

    Returns ``{(source, expr): error}`` for the instances that failed; the others are cached for
    :func:`get_kernel`.
    """
    import os
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp

    arch = arch or device_arch()
    todo = [(s, e, arch) for s, e in dict.fromkeys(jobs) if (s, e, arch) not in _KERNELS]
    errors: dict[tuple[str, str], str] = {}
    if not todo:
        return errors
    workers = workers or max(1, min(len(todo), (os.cpu_count() or 2)))
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futs = [(job, pool.submit(_compile_one, job)) for job in todo]
        for job, fut in futs:
            try:
                cubin, lowered = fut.result()
            except Exception as exc:
                errors[(job[0], job[1])] = str(exc).splitlines()[0]
                continue
            _KERNELS[job] = _load(job[0], job[1], job[2], cubin, lowered)
    return errors


def cached_in(jobs: Sequence[tuple[str, str]], arch: str) -> list[bool]:
    """Whether each instance's cubin is already in the on-disk kernel cache for ``arch`` (this NVRTC)."""
    import os

    d, ver = cubin_cache_dir(), nvrtc_version()
    keys = [os.path.join(d, cubin_cache_key(s, e, arch, ver)) for s, e in jobs]
    return [os.path.exists(k + ".name") and os.path.exists(k + ".cubin") for k in keys]  # both: a write cut between them leaves one


def compile_to_cache(jobs: Sequence[tuple[str, str]], arch: str, workers: int | None = None,
                     progress: Callable[[], None] | None = None) -> dict[tuple[str, str], str]:
    """Compile many instances for ``arch`` into the on-disk kernel cache (:func:`cubin_cache_dir`), in
    parallel worker processes, without loading them (no GPU is touched): a later :func:`get_kernel`
    in any process reads the cubin instead of compiling. ``progress`` is called once per finished
    instance. Returns ``{(source, expr): error}``."""
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed
    import multiprocessing as mp

    todo = [(s, e, arch) for s, e in dict.fromkeys(jobs)]
    errors: dict[tuple[str, str], str] = {}
    if not todo:
        return errors
    workers = workers or max(1, min(len(todo), (os.cpu_count() or 2)))
    if workers == 1 or len(todo) == 1:
        for job in todo:
            try:
                _compile_one(job)
            except Exception as exc:  # noqa: BLE001 - reported, and the build reports it again
                errors[(job[0], job[1])] = (str(exc).splitlines() or [type(exc).__name__])[0]
            if progress:
                progress()
        return errors
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futs = {pool.submit(_compile_one, job): job for job in todo}
        for fut in as_completed(futs):
            job = futs[fut]
            try:
                fut.result()
            except Exception as exc:  # noqa: BLE001
                errors[(job[0], job[1])] = (str(exc).splitlines() or [type(exc).__name__])[0]
            if progress:
                progress()
    return dict(sorted(errors.items()))  # finished in any order; reported in one


class NvrtcUnavailable(RuntimeError):
    """NVRTC could not be loaded (no ``cupy`` or no NVRTC shared library)."""


def nvrtc_compile(source: str, exprs: Sequence[str], arch: str, fast: bool = False) -> bytes:
    return nvrtc_compile_named(source, exprs, arch, fast)[0]


def nvrtc_compile_named(source: str, exprs: Sequence[str], arch: str, fast: bool = False) -> tuple[bytes, dict[str, str]]:
    """Compile ``exprs`` of ``source`` for ``arch`` without any GPU.

    ``arch="sm_80"`` runs the whole compiler (ptxas included: inline PTX is checked) and returns
    the cubin; ``arch="compute_80"`` stops at PTX (about ten times faster) and returns the PTX.

    ``fast=True`` adds ``-Ofc=max`` (NVRTC's fast-compile mode: the same front end, PTX and ptxas
    checks with little optimisation, about 40x quicker); CI uses it, the GPU path never does.
    Returns the binary and each expression's lowered (mangled) name.
    Raises :class:`NvrtcUnavailable` when NVRTC cannot be loaded, and ``TuningError`` with the
    compiler's log when the source does not compile.
    """
    try:
        from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
    except Exception as exc:  # ImportError, or the shared library is missing
        raise NvrtcUnavailable(f"NVRTC is not available ({exc}); pip install 'graphopt[nvrtc]' (cupy-cuda13x and nvidia-cuda-nvrtc)") from exc
    prog = nvrtc.createProgram(read_source(source), source, [], [])
    try:
        for e in exprs:
            nvrtc.addNameExpression(prog, e)
        try:
            nvrtc.compileProgram(prog, list(OPTIONS) + [f"-arch={arch}"] + (["-Ofc=max"] if fast else []))
        except Exception as exc:
            raise TuningError(f"{source} failed to compile for {arch}: {exc}\n{nvrtc.getProgramLog(prog)}") from exc
        names = {e: nvrtc.getLoweredName(prog, e) for e in exprs}
        binary = nvrtc.getCUBIN(prog) if arch.startswith("sm_") else bytes(nvrtc.getPTX(prog))
        return binary, names
    finally:
        nvrtc.destroyProgram(prog)
