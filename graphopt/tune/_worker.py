"""The profiler's worker process: ``python -m graphopt.tune._worker READ_FD WRITE_FD``.

Started by ``graphopt.tune.runners.IsolatedRunner``. It receives ``(timer, checker, buffers,
arch)`` once, answers ``{"ready": True}``, then runs one ``(signature, candidate)`` task at a time
and exits after the first failure (see ``worker_loop``). A candidate that crashes takes only this
process with it.
"""

from __future__ import annotations

import sys
import traceback
from multiprocessing.connection import Connection

from graphopt.tune.candidate_run import describe_exc, run_batch, run_one, survives
from graphopt.tune.results import ERROR, WORKER_FAILED


def main(argv: list[str]) -> int:
    recv = Connection(int(argv[1]), writable=False)
    send = Connection(int(argv[2]), readable=False)
    try:
        timer, checker, buffers, arch = recv.recv()
    except EOFError:
        return 0
    except Exception as exc:  # noqa: BLE001 - e.g. the checker's module is not importable here
        send.send({"ready": False, "reason": f"{type(exc).__name__}: {exc}"})
        return 1
    send.send({"ready": True})
    worker_loop(recv, send, timer, checker, buffers, arch)
    return 0


def worker_loop(recv, send, timer, checker, buffers, arch) -> None:
    """The worker's loop: one (sig, candidate) task at a time.

    The worker exits after any failure: on the GPU a fault leaves the CUDA context unusable, so
    the next candidate gets a fresh process.
    """
    while True:
        try:
            task = recv.recv()
        except (EOFError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 - the candidate's class is not importable here
            send.send({"status": WORKER_FAILED, "reason": f"the worker could not load the candidate: {describe_exc(exc)} "
                       "(candidates must be module-level classes in importable modules)"})
            return
        if task is None:
            return
        sig, cand = task
        if isinstance(cand, list):
            if not _batch(send, sig, cand, timer, checker, buffers, arch):
                return
            continue
        try:
            reply = run_one(sig, cand, timer, checker, buffers, arch)
        except BaseException as exc:  # noqa: BLE001 - report, then die
            reply = {"status": ERROR, "reason": f"worker error {describe_exc(exc)}"}
        reply["alive"] = survives(reply)
        try:
            send.send(reply)
        except Exception:  # noqa: BLE001 - e.g. an unpicklable sample; report it plainly
            send.send({"status": ERROR, "reason": "worker could not send its result: " + traceback.format_exc(limit=1)})
            return
        if not reply["alive"]:
            return


def _batch(send, sig, cands, timer, checker, buffers, arch) -> bool:
    """Runs one batch; whether the worker may go on (every candidate ran and each reply ``survives``)."""
    state = {"at": 0}

    def progress(i: int) -> None:
        state["at"] = i
        send.send({"progress": i})

    try:
        replies = run_batch(sig, cands, timer, checker, buffers, arch, progress)
    except BaseException as exc:  # noqa: BLE001 - report against the candidate in progress, then die
        replies = {state["at"]: {"status": ERROR, "reason": f"worker error {describe_exc(exc)}"}}
    alive = len(replies) == len(cands) and all(survives(r) for r in replies.values())
    try:
        send.send({"replies": replies, "alive": alive})
    except Exception:  # noqa: BLE001 - e.g. an unpicklable sample; report it plainly
        send.send({"replies": {state["at"]: {"status": ERROR, "reason": "worker could not send its result: "
                                             + traceback.format_exc(limit=1)}}, "alive": False})
        return False
    return alive


if __name__ == "__main__":
    sys.exit(main(sys.argv))
