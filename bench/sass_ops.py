"""What the compiler made of an own kernel, on a machine without a GPU: registers, the SASS instruction
mix, and the order of its memory instructions.

    pip install nvidia-cuda-cuobjdump          # the disassembler (CUDA 13; one wheel, ~10 MB)
    python3 bench/sass_ops.py depthwise_nhwc.cu 'depthwise_nhwc<half_t,8,3,3,1>' [more instances] [--sequence]

Each instance is compiled as the runtime compiles it (``source.nvrtc_compile_named``, NVRTC with the
project's options, here for ``--arch``), disassembled with ``cuobjdump -sass`` and summarised: its resource
use (``cuobjdump -res-usage``: registers, stack, local memory), the count of each opcode, and with
``--sequence`` every global / shared / local load and store in program order, which is where one sees
whether a loop's loads are issued together or one round trip at a time (bench/NOTES_kernels.md, sixteenth
session: the depthwise window's nine loads were issued one at a time, which the PTX did not show).

Why by hand: NVRTC gives the cubin but no disassembly, and the CUDA toolkit's ``cuobjdump`` is the only
reader of SASS; this script only runs it and counts its lines.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

MEMORY_OPS = ("LDG", "STG", "LDS", "STS", "LDL", "STL", "LDSM", "LDGSTS", "ATOM", "RED")
_INSN = re.compile(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)")


def find_cuobjdump() -> str | None:
    """``cuobjdump`` on PATH, else the one the ``nvidia-cuda-cuobjdump`` wheel installs."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    for site in sys.path:
        for path in glob.glob(os.path.join(site, "nvidia", "cu*", "bin", "cuobjdump")):
            if os.access(path, os.X_OK):
                return path
    return None


def opcodes(sass: str) -> list[tuple[str, str]]:
    """(opcode, its modifiers) of every instruction line of ``cuobjdump -sass`` output, in order."""
    return [(m.group(1), m.group(2)) for m in map(_INSN.match, sass.splitlines()) if m]


def resources(tool: str, path: str) -> str:
    """The kernel's resource line of ``cuobjdump -res-usage`` (``REG:48 STACK:0 SHARED:... LOCAL:0 ...``)."""
    out = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    lines = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("REG:")]
    return lines[0] if lines else "(no resource line)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a kernel source of graphopt/kernels, e.g. depthwise_nhwc.cu")
    ap.add_argument("instances", nargs="+", help="template instances, e.g. 'depthwise_nhwc<half_t,8,3,3,1>'")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--sequence", action="store_true", help="list the memory instructions in program order")
    ap.add_argument("--top", type=int, default=16, help="opcodes to list (most frequent first)")
    args = ap.parse_args(argv)
    tool = find_cuobjdump()
    if tool is None:
        print("sass_ops: cuobjdump not found; pip install nvidia-cuda-cuobjdump", file=sys.stderr)
        return 2

    from graphopt.errors import GraphoptError
    from graphopt.kernels.source import nvrtc_compile_named

    with tempfile.TemporaryDirectory() as tmp:
        for expr in args.instances:
            try:
                cubin, _ = nvrtc_compile_named(args.source, [expr], args.arch)
            except GraphoptError as exc:
                print(f"sass_ops: {expr}: {' '.join(str(exc).split())[:400]}", file=sys.stderr)
                return 1
            path = os.path.join(tmp, "k.cubin")
            with open(path, "wb") as f:  # cupy's getCUBIN drops the image's last byte; cuobjdump wants it
                f.write(cubin + b"\0" * 8)
            sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
            ops = opcodes(sass)
            counts = collections.Counter(op for op, _ in ops)
            print(f"{expr}: {len(ops)} instructions; {resources(tool, path)}")
            print("  " + ", ".join(f"{op} {n}" for op, n in counts.most_common(args.top)))
            if args.sequence:
                mem = [op + mods for op, mods in ops if op in MEMORY_OPS]
                print("  memory, in order: " + " ".join(mem))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
