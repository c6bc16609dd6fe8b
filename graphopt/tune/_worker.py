"""The profiler's worker process: ``python -m graphopt.tune._worker READ_FD WRITE_FD``.

Started by ``graphopt.tune.profiler.IsolatedRunner``. It receives ``(timer, checker, buffers,
arch)`` once, answers ``{"ready": True}``, then runs one ``(signature, candidate)`` task at a time
and exits after the first failure (see ``profiler.worker_loop``). A candidate that crashes takes
only this process with it.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from multiprocessing.connection import Connection

    recv = Connection(int(argv[1]), writable=False)
    send = Connection(int(argv[2]), readable=False)
    try:
        timer, checker, buffers, arch = recv.recv()
    except EOFError:
        return 0
    except Exception as exc:  # noqa: BLE001 - e.g. the checker's module is not importable here
        send.send({"ready": False, "reason": f"{type(exc).__name__}: {exc}"})
        return 1
    from graphopt.tune.profiler import worker_loop

    send.send({"ready": True})
    worker_loop(recv, send, timer, checker, buffers, arch)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
