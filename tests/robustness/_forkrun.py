"""Run many real ``graphopt`` command lines cheaply: import the CLI once, then fork one child per
command line. Each child is a separate process running ``graphopt.cli.main`` exactly as
``python -m graphopt.cli`` would (its own stdout/stderr files, its own exit code, an uncaught
exception printed as a traceback and exit code 1, as the interpreter does), without paying the
~1 s interpreter + onnx/onnxruntime import per command. ``run_graphopt`` (a fresh interpreter)
stays the reference; ``test_forkrun_matches_a_fresh_interpreter`` checks they agree.

Usage: python -m tests.robustness._forkrun JOBS.json   (a list of {argv, cwd, stdout, stderr, timeout})
Writes JOBS.json.result: a list of exit codes (-9 when a child ran past its timeout and was killed).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback


def _child(job: dict) -> None:
    import graphopt.cli as cli

    fo = os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fe = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fo, 1)
    os.dup2(fe, 2)
    os.chdir(job["cwd"])
    code = 0
    try:
        sys.argv = ["graphopt", *job["argv"]]
        cli.main(args=job["argv"], prog_name="graphopt")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def main(spec_path: str) -> None:
    import graphopt.cli  # noqa: F401  (the imports every child shares)
    import graphopt.pipeline  # noqa: F401
    import graphopt.passes  # noqa: F401
    import graphopt.rewrite  # noqa: F401
    import graphopt.tune.tuner  # noqa: F401
    import graphopt.compare  # noqa: F401
    import onnxruntime  # noqa: F401

    jobs = json.load(open(spec_path))
    workers = max(1, int(os.environ.get("GRAPHOPT_FORKRUN_WORKERS", os.cpu_count() or 2)))
    codes: list[int | None] = [None] * len(jobs)
    running: dict[int, tuple[int, float]] = {}
    todo = list(range(len(jobs)))
    sys.stdout.flush()
    sys.stderr.flush()
    while todo or running:
        while todo and len(running) < workers:
            i = todo.pop(0)
            pid = os.fork()
            if pid == 0:
                _child(jobs[i])
            running[pid] = (i, time.monotonic() + float(jobs[i].get("timeout", 120)))
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            for p, (i, deadline) in list(running.items()):
                if now > deadline:
                    os.kill(p, signal.SIGKILL)
            time.sleep(0.005)
            continue
        i, _ = running.pop(pid)
        codes[i] = os.waitstatus_to_exitcode(status)
    with open(spec_path + ".result", "w") as f:
        json.dump(codes, f)


if __name__ == "__main__":
    main(sys.argv[1])
