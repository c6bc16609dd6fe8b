"""Where candidates run: :class:`IsolatedRunner` (a worker subprocess, the default) or :class:`InlineRunner`.

With ``isolate=True`` the candidates, timer, checker and buffers are sent to the worker process
(``python -m graphopt.tune._worker``) as pickles over a pipe, so they must be picklable:
module-level classes and functions. This is messaging with our own child process, not storage;
the tuning cache never uses pickle.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from graphopt.lowering.contract import Candidate, Signature
from graphopt.tune.candidate_run import GPU_LOCK_ENV, describe_exc, no_buffers, run_one
from graphopt.tune.results import CRASHED, ERROR, OK, TIMEOUT, WORKER_FAILED

DEFAULT_TIMEOUT_S = 120.0
TIME_BATCH = 8  # candidates a worker sharing its GPU checks before timing them in one turn (run_batch)


def _visible_device(index: int | None) -> str | None:
    """The CUDA_VISIBLE_DEVICES value that shows a worker only device ``index`` of this process."""
    if index is None:
        return None
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    if parent:
        visible = [v.strip() for v in parent.split(",") if v.strip()]
        if index < len(visible):
            return visible[index]
    return str(index)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _last_line(f) -> str:
    try:
        f.flush()
        f.seek(max(0, f.seek(0, 2) - 4096))
        lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""
    except (OSError, ValueError):
        return ""


class IsolatedRunner:
    """Runs candidates in a worker subprocess, replacing it after a crash, timeout or failure.

    The worker is ``python -m graphopt.tune._worker`` (not ``multiprocessing``: its spawn mode
    re-imports the caller's ``__main__``, which breaks scripts without an ``if __name__ ==
    "__main__"`` guard, and fork does not work with CUDA). Tasks and results travel over two pipes
    as ``multiprocessing.connection`` messages; the worker sees this process's ``sys.path``, and
    its stdout and stderr go to a temporary file whose last line explains a crash. A worker that
    cannot start is an environment problem, not the candidate's: it is reported as
    ``worker_failed`` (never cached) and not retried for every candidate.
    """

    def __init__(self, timer, checker, buffers=no_buffers, arch: str = "", *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 startup_timeout_s: float = 120.0, device_index: int | None = None, gpu_lock: str | None = None):
        self._init = (timer, checker, buffers, arch)
        self.gpu_lock = gpu_lock  # the lock file of workers sharing this GPU (None: the GPU is this worker's)
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._visible = _visible_device(device_index)
        self._proc = None
        self._send = self._recv = None
        self._log = None
        self._broken: str | None = None
        self.workers_started = 0

    def _start(self) -> str | None:
        """Start a worker; returns the reason when it could not start."""
        from multiprocessing.connection import Connection

        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else os.getcwd() for p in sys.path)
        if self._visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = self._visible
        env.pop(GPU_LOCK_ENV, None)
        if self.gpu_lock:
            env[GPU_LOCK_ENV] = self.gpu_lock
        self._log = tempfile.TemporaryFile(prefix="graphopt-tune-worker-")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "graphopt.tune._worker", str(p2c_r), str(c2p_w)],
                pass_fds=(p2c_r, c2p_w), env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            )
        except OSError as exc:
            for fd in (p2c_r, p2c_w, c2p_r, c2p_w):
                os.close(fd)
            return f"could not start a worker process: {exc}"
        finally:
            if self._proc is not None:
                os.close(p2c_r)
                os.close(c2p_w)
        self._send = Connection(p2c_w, readable=False)
        self._recv = Connection(c2p_r, writable=False)
        self.workers_started += 1
        try:
            self._send.send(self._init)
        except Exception as exc:  # noqa: BLE001 - an unpicklable timer/checker/buffers
            self._stop(kill=True)
            return f"the timer, checker or buffers cannot be sent to a worker ({describe_exc(exc)}); make them module-level"
        if not self._recv.poll(self.startup_timeout_s):
            self._stop(kill=True)
            return f"the worker did not start within {self.startup_timeout_s:g} s"
        try:
            hello = self._recv.recv()
        except (EOFError, OSError):
            why = _last_line(self._log)
            code = self._stop(kill=True)
            return f"the worker died while starting (exit code {code}){': ' + why if why else ''}"
        if not hello.get("ready"):
            self._stop(kill=True)
            return f"the worker could not load the timer/checker: {hello.get('reason', '?')}"
        return None

    def _stop(self, kill: bool = False) -> int | None:
        proc = self._proc
        self._proc = None
        code = None
        if proc is not None:
            if kill:
                proc.kill()
            else:
                try:
                    self._send.send(None)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            try:
                code = proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(10)
        for conn in (self._send, self._recv):
            if conn is not None:
                conn.close()
        self._send = self._recv = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    @property
    def broken(self) -> str | None:
        """Why this runner's worker cannot start (then every run answers ``worker_failed``), else ``None``."""
        return self._broken

    @property
    def batch_size(self) -> int:
        """Candidates sent to the worker at once: a worker sharing its GPU (``gpu_lock``) checks a
        batch, then times it in one exclusive turn (``candidate_run.run_batch``); alone, one at a time."""
        return TIME_BATCH if self.gpu_lock else 1

    def _ensure_worker(self) -> tuple[float, dict | None]:
        """(seconds spent starting a worker, a failure reply when none could start)."""
        if self._broken:
            return 0.0, {"status": WORKER_FAILED, "reason": self._broken}
        started = 0.0
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            t0 = time.perf_counter()
            why = self._start()
            started = time.perf_counter() - t0
            if why:
                self._broken = why
                return started, {"status": WORKER_FAILED, "reason": why, "phases": {"worker_start": started}}
        return started, None

    def _died(self) -> dict:
        why = _last_line(self._log)
        code = self._stop(kill=True) if self._proc is not None else None
        how = _signal_name(code) if code is not None and code < 0 else f"exit code {code}"
        return {"status": CRASHED, "reason": f"worker process died ({how}){': ' + why if why else ''}"}

    def _timed_out(self) -> dict:
        self._stop(kill=True)
        return {"status": TIMEOUT, "reason": f"timed out after {self.timeout_s:g} s (killed)"}

    def run(self, sig: Signature, cand: Candidate) -> dict:
        started, failed = self._ensure_worker()
        if failed:
            return failed
        try:
            self._send.send((sig, cand))
        except Exception as exc:  # noqa: BLE001 - unpicklable candidate, or a dead pipe
            self._stop(kill=True)
            return {"status": ERROR, "reason": f"could not send the candidate to the worker: {describe_exc(exc)}"}
        if not self._recv.poll(self.timeout_s):
            return self._timed_out()
        try:
            reply = self._recv.recv()
        except (EOFError, OSError):
            return self._died()
        if not reply.pop("alive", reply.get("status") == OK):
            self._stop()  # the worker exits after a failure it may not survive
        if started:
            reply.setdefault("phases", {})["worker_start"] = started
        return reply

    def run_batch(self, sig: Signature, cands: list[Candidate]) -> list[dict | None]:
        """Replies to ``cands`` run as one batch (see ``batch_size``), in order; ``None`` for a
        candidate that did not run because another failed first (run it again). A crash or a hang
        is the reply of the candidate the worker last said it was at; ``timeout_s`` holds for each
        candidate's check and for each one's timing."""
        if len(cands) == 1:
            return [self.run(sig, cands[0])]
        started, failed = self._ensure_worker()
        if failed:
            return [dict(failed) for _ in cands]
        out: list[dict | None] = [None] * len(cands)
        try:
            self._send.send((sig, list(cands)))
        except Exception as exc:  # noqa: BLE001 - unpicklable candidate, or a dead pipe
            self._stop(kill=True)
            return [{"status": ERROR, "reason": f"could not send the candidates to the worker: {describe_exc(exc)}"}
                    for _ in cands]
        at = 0
        while True:
            if not self._recv.poll(self.timeout_s):
                out[at] = self._timed_out()
                break
            try:
                msg = self._recv.recv()
            except (EOFError, OSError):
                out[at] = self._died()
                break
            if "progress" in msg:
                at = int(msg["progress"])
                continue
            for i, reply in msg["replies"].items():
                out[int(i)] = reply
            if not msg.get("alive"):
                self._stop()  # the worker exits after a failure it may not survive
            break
        if started:
            first = next((r for r in out if r is not None), None)
            if first is not None:
                first.setdefault("phases", {})["worker_start"] = started
        return out

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> "IsolatedRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class InlineRunner:
    """Runs candidates in this process (``isolate=False``): no protection from faults or hangs.

    With a non-zero ``device_index`` each run happens inside ``cupy.cuda.Device(device_index)``, so
    the target GPU is measured even when it is not this process's current device (0).
    """

    broken = None  # an inline runner has no worker that could fail to start
    batch_size = 1  # one process: no other worker waits for the GPU

    def __init__(self, timer, checker, buffers=no_buffers, arch: str = "", *, device_index: int | None = None):
        self._args = (timer, checker, buffers, arch)
        self.device_index = device_index

    def run(self, sig: Signature, cand: Candidate) -> dict:
        if not self.device_index:
            return run_one(sig, cand, *self._args)
        import cupy  # noqa: PLC0415 - only with a real device other than 0

        with cupy.cuda.Device(self.device_index):
            return run_one(sig, cand, *self._args)

    def close(self) -> None:
        pass


__all__ = ["DEFAULT_TIMEOUT_S", "TIME_BATCH", "InlineRunner", "IsolatedRunner"]
