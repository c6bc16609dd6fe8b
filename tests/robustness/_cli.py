"""Helpers to run the real command line on many cases and to check the refusal contract."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_many(jobs: list[tuple[list[str], Path]], workdir: Path, timeout: float = 120) -> list[CliResult]:
    """Run each ``(argv, cwd)`` as its own ``graphopt`` process (see ``_forkrun``)."""
    spec = []
    for i, (argv, cwd) in enumerate(jobs):
        spec.append({"argv": [str(a) for a in argv], "cwd": str(cwd), "stdout": str(workdir / f"job{i}.out"),
                     "stderr": str(workdir / f"job{i}.err"), "timeout": timeout})
    spec_path = workdir / "jobs.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    env.pop("GRAPHOPT_DEBUG", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "tests.robustness._forkrun", str(spec_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout * max(1, len(jobs)) + 60)
    assert r.returncode == 0, r.stderr
    codes = json.loads((workdir / "jobs.json.result").read_text())
    return [CliResult(c, Path(s["stdout"]).read_text(errors="replace"), Path(s["stderr"]).read_text(errors="replace"))
            for c, s in zip(codes, spec)]


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (not following symlinks): files by SHA-256, others by kind."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = str(p.relative_to(folder))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_fifo():
                out[rel] = "fifo"
            elif p.is_dir():
                out[rel] = "dir"
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def assert_refused(r: CliResult, exit_code: int, label: str = "") -> None:
    """The refusal contract: the documented exit code, exactly one ``graphopt: error:`` line on
    stderr, no traceback, nothing on stdout."""
    assert r.returncode == exit_code, (label, r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphopt: error: "), (label, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, (label, r.stderr)
    assert r.stdout == "", (label, r.stdout)
