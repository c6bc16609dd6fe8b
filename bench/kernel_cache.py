"""Build the device's compiled-kernel cache on a CPU machine: every own kernel instance
(``registry.all_kernel_instances``) compiled by NVRTC for ``--arch`` (what ``graphopt cache kernels`` does
in place), packed as the tarball that ``bench/device_bench.sh`` unpacks into ``$GRAPHOPT_KERNEL_CACHE`` on a
fresh machine (``.cubin/cubin.tar.xz``).

Why: a fresh device machine spends ~140 s of its 30-minute budget compiling the 1,121 instances
(16 cores, seventeenth session), and a cache packed there is often over the size a run returns.
NVRTC needs no GPU, and a cubin's cache key is its source text, instance, arch and NVRTC
``major.minor`` (``source.cubin_cache_key``), so the same compiler version here writes the files
the device would read. Run it with the device's NVRTC (13.0 on the lent H100/H200):

    python3 -m venv /tmp/v130 && /tmp/v130/bin/pip install -e '.[nvrtc]' 'nvidia-cuda-nvrtc==13.0.88'
    /tmp/v130/bin/python bench/kernel_cache.py --nvrtc 13.0 --out .cubin/cubin.tar.xz

``--cache-dir`` keeps the compiled files between runs, so only changed instances compile again; the
tarball holds only the current instances. Exit 2 on a version mismatch, 1 if any instance fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90", help="target, as device_arch() names it (default sm_90)")
    ap.add_argument("--nvrtc", default="13.0", help="the device's NVRTC major.minor; this interpreter's must match")
    ap.add_argument("--cache-dir", default=None, help="compiled files kept between runs (default: a folder per arch and NVRTC under the temp dir)")
    ap.add_argument("--out", default=".cubin/cubin.tar.xz", help="the tarball to write (atomically)")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)

    from graphopt.kernels.source import nvrtc_version

    have = nvrtc_version()
    if have != args.nvrtc:
        print(f"kernel_cache: this interpreter's NVRTC is {have}, the device's is {args.nvrtc}: the device would not "
              f"find these cubins under its keys; run with an environment that has nvidia-cuda-nvrtc=={args.nvrtc}.* "
              "(see this script's docstring)", file=sys.stderr)
        return 2
    cache = args.cache_dir or os.path.join(tempfile.gettempdir(), f"graphopt-kernel-cache-{args.arch}-nvrtc{have}")
    os.makedirs(cache, exist_ok=True)
    os.environ["GRAPHOPT_KERNEL_CACHE"] = cache  # read by cubin_cache_dir() in every compile worker

    from graphopt.kernels.registry import all_kernel_instances
    from graphopt.kernels.source import cached_in, compile_to_cache, cubin_cache_key

    jobs = list(dict.fromkeys(all_kernel_instances()))
    missing = [job for job, there in zip(jobs, cached_in(jobs, args.arch)) if not there]
    print(f"kernel_cache: {len(jobs)} instances for {args.arch}, NVRTC {have}; {len(missing)} to compile into {cache}", flush=True)
    t = time.perf_counter()
    errors = compile_to_cache(missing, args.arch, args.workers)
    print(f"kernel_cache: compiled in {time.perf_counter() - t:.0f} s; failures: {len(errors)}", flush=True)
    for (s, e), why in sorted(errors.items()):
        print(f"kernel_cache: {s} {e}: {why}", file=sys.stderr)

    present = {cubin_cache_key(s, e, args.arch, have) for (s, e), there in zip(jobs, cached_in(jobs, args.arch)) if there}
    files = sorted(key + ext for key in present for ext in (".cubin", ".name"))  # whole instances only (cached_in)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".kernel_cache.", suffix=".tmp", dir=out_dir)
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:xz", preset=6) as tar:
            for f in files:  # sorted names, fixed metadata: the same cubins give the same tarball
                info = tar.gettarinfo(os.path.join(cache, f), arcname=f"./{f}")
                info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
                with open(os.path.join(cache, f), "rb") as fh:
                    tar.addfile(info, fh)
        os.chmod(tmp, 0o644)
        os.replace(tmp, args.out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"kernel_cache: {args.out}: {len(files) // 2} instances, {os.path.getsize(args.out) / 2**20:.1f} MiB", flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
