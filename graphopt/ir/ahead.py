"""Work done ahead in a forked child process while the parent goes on: ``Forked`` (one child, one
``bytes`` answer, a deadline, every failure a fallback) and, on it, ``InferAhead``: onnx shape
inference of the validated input while the parent builds the IR from the same model. The tuner's
tuning-size shapes use ``Forked`` too (``graphopt.tune.shapes_ahead``).

Why a process: onnx holds the GIL for the whole of ``infer_shapes`` (a thread beside Python work
took the sum of both), and on the 20k-node GPT-2 the input's inference (0.17 s) and ``from_model`` +
``lint`` (0.27 s) each take one core of two. The child runs exactly ``graphopt.ir.shapes.infer`` on
the model as the parent holds it at the fork (the same bytes reach onnx), and hands back only what
the pipeline reads: the inferred ``value_info`` (a ``GraphProto`` holding nothing else), or that
inference failed. Whenever the child cannot be used (no ``os.fork``, not Linux, other Python threads
alive, weights not in memory or not small, the child died or said something malformed), ``result``
answers ``NOT_RUN`` and the caller infers in-process as before, so the answer never depends on the
route. Measured on that model: load + inference 0.58 -> 0.44 s (bench/NOTES_optimizer.md).
"""

from __future__ import annotations

import gc
import os
import select
import sys
import threading
import time
from typing import Callable, Iterable, Iterator

import onnx

from graphopt.ir.external import has_lazy
from graphopt.ir.large import WEIGHTLESS_ABOVE, initializer_bytes
from graphopt.ir.shapes import infer

#: ``result`` when no child answered: infer in this process instead.
NOT_RUN = object()

#: Seconds the parent waits for the child's answer before killing it and inferring in-process. The
#: child's inference takes what the parent's would (0.17 s on the 20k-node GPT-2); the deadline only
#: bounds the pathological case (a child stuck on a lock some native thread held at the fork), so a
#: forked inference can cost time but never hang the optimizer.
ANSWER_DEADLINE_S = 30.0

_FAILED = b"F"  # infer() gave back its input: inference failed (best effort, like in-process)
_INFERRED = b"V"  # followed by a GraphProto with the inferred value_info
_CHECKED = b"C"  # before either, from a child started with a check: the check passed


def can_fork() -> bool:
    """Fork only where it is cheap and safe: Linux, and no other Python thread that the child would
    inherit half-way (a lock held in another thread stays held forever in the child)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork") and threading.active_count() == 1


def worth_forking(model: onnx.ModelProto) -> bool:
    """Only a model whose weights are in memory and under ``WEIGHTLESS_ABOVE`` (the 20k-node GPT-2
    holds 5 MB): a larger one is inferred from its weightless copy, and building that copy (or
    serializing hundreds of MB) in a child beside the parent's own copies would raise peak memory,
    which the large-model path is there to bound (bench/results/large_model.md)."""
    return not has_lazy(model) and initializer_bytes(model) < WEIGHTLESS_ABOVE


def _run_child(compute: Callable[[], "bytes | Iterable[bytes]"], fd: int) -> None:
    """In the child: write ``compute()`` to ``fd`` (bytes, or chunks written as each is made, so the
    parent can read a first part early) and leave without running the parent's exit handlers or
    flushing its buffered output (``os._exit``). Exit status 0 only once all is written."""
    status = 1
    try:
        gc.disable()  # a short-lived process: collections would only copy the parent's pages
        answer = compute()
        for chunk in (answer,) if isinstance(answer, bytes) else answer:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        status = 0
    except BaseException:  # noqa: BLE001 -- any failure: the parent computes in-process
        pass
    finally:
        os._exit(status)


class Forked:
    """One forked child computing one ``bytes`` answer while the parent goes on: ``fork(compute)``,
    then ``answer()``. A context manager, so a child whose answer is never collected (an error in
    between) is killed and reaped. Every way the child cannot help (no safe fork, a dead child, the
    deadline) answers None, and the caller computes in-process."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._fd: int | None = None
        self._read: list[bytes] = []  # what ``prefix`` read of the answer already

    @property
    def running(self) -> bool:
        return self._pid is not None

    def fork(self, compute: Callable[[], bytes]) -> bool:
        """Fork a child running ``compute``; False (and nothing started) when forking is not safe here
        (``can_fork``), fails, or a child runs already. What ``compute`` reads must not change in the
        parent in a way the answer depends on: the child sees the parent's memory at the fork."""
        if self._pid is not None or not can_fork():
            return False
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:  # out of processes or memory: the caller computes in-process later
            os.close(r)
            os.close(w)
            return False
        if pid == 0:  # the child
            os.close(r)
            _run_child(compute, w)
        os.close(w)
        self._pid, self._fd, self._read = pid, r, []
        return True

    def answer(self) -> bytes | None:
        """The child's answer (waiting for it at most ``ANSWER_DEADLINE_S``), the child reaped; None
        when there is no child, it failed, or the deadline passed (it is killed)."""
        if self._pid is None:
            return None
        chunks = self._read_until(time.monotonic() + ANSWER_DEADLINE_S)
        if chunks is None:  # no answer in time: the child is killed, the caller computes in-process
            self.cancel()
            return None
        ok = self._reap()
        return b"".join(chunks) if ok else None

    def prefix(self, size: int) -> bytes | None:
        """The first ``size`` bytes of the answer, as soon as the child has written them (the rest
        stays for ``answer``); None when the child closed the pipe or died before, or the deadline
        passed (then it is killed)."""
        if self._pid is None:
            return None
        chunks = self._read_until(time.monotonic() + ANSWER_DEADLINE_S, want=size)
        if chunks is None:
            self.cancel()
            return None
        data = b"".join(chunks)
        return data[:size] if len(data) >= size else None

    def _read_until(self, deadline: float, want: int | None = None) -> list[bytes] | None:
        """What the child wrote (with what ``prefix`` read before) until it closes the pipe, or until
        ``want`` bytes are in; [] on a read error, None when ``deadline`` (``time.monotonic``)
        passes first."""
        chunks = self._read
        try:
            while want is None or sum(map(len, chunks)) < want:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._fd], [], [], left)[0]:
                    return None
                chunk = os.read(self._fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError:
            return []
        return chunks

    def _reap(self) -> bool:
        """Close the pipe and wait for the child; True when it exited with status 0."""
        pid, fd = self._pid, self._fd
        self._pid = self._fd = None
        self._read = []
        if fd is not None:
            os.close(fd)
        if pid is None:
            return False
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 0

    def cancel(self) -> None:
        """Kill and reap a child whose answer is not wanted."""
        if self._pid is not None:
            try:
                os.kill(self._pid, 9)
            except ProcessLookupError:
                pass
            self._reap()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


def _inference_payload(model: onnx.ModelProto) -> bytes:
    """What ``InferAhead``'s child sends: ``_FAILED``, or ``_INFERRED`` and the inferred value_info."""
    inferred = infer(model)
    if inferred is model:
        return _FAILED
    vi = onnx.GraphProto()
    vi.value_info.extend(inferred.graph.value_info)
    return _INFERRED + vi.SerializeToString()


def _checked_payload(model: onnx.ModelProto, check: Callable[[onnx.ModelProto], None] | None) -> Iterator[bytes]:
    """The child's answer in two parts: ``_CHECKED`` once ``check`` passed (sent at once, so the
    parent reads it long before the inference is done), then ``_inference_payload``. Nothing at all
    when ``check`` raised: the parent then runs it itself, for its error."""
    if check is not None:
        try:
            check(model)
        except BaseException:  # noqa: BLE001 -- the parent's own check gives the error
            return
        yield _CHECKED
    yield _inference_payload(model)


class InferAhead(Forked):
    """Start with ``start(model)``; collect with ``result()`` (or ``inferred_graph``).

    ``start(model, check)`` forks before the input is validated: the child runs ``check`` (the header
    check, 0.07 s on the 20k-node GPT-2) and then infers, while the parent goes on with the rest of
    loading; ``check_passed`` says whether it passed. The parent runs ``check`` itself whenever the
    child cannot vouch for it, so a bad input meets the same error by either route."""

    def __init__(self) -> None:
        super().__init__()
        self._model: onnx.ModelProto | None = None
        self._checked = False

    def start(self, model: onnx.ModelProto, check: Callable[[onnx.ModelProto], None] | None = None) -> bool:
        """Fork a child inferring ``model`` (after ``check(model)`` passed, with ``check``); True when
        one runs. Does nothing when forking is not safe here (``can_fork``), the model is not small
        (``worth_forking``) or a child is running already. ``model`` must not change until ``result``."""
        if self.running or not worth_forking(model):
            return False
        if not self.fork(lambda: _checked_payload(model, check)):
            return False
        self._model, self._checked = model, check is not None
        return True

    def check_passed(self) -> bool:
        """Whether the child's ``check`` passed: False when it raised, the child died or was started
        without one (then the caller checks in-process)."""
        return self._checked and self.prefix(len(_CHECKED)) == _CHECKED

    def result(self, model: onnx.ModelProto) -> onnx.GraphProto | None | object:
        """The child's answer for ``model``: a ``GraphProto`` whose ``value_info`` is what
        ``infer(model).graph.value_info`` is, None where ``infer`` failed, or ``NOT_RUN`` (no child,
        a child for another model, or no usable answer)."""
        if not self.running:
            return NOT_RUN
        same, self._model = model is self._model, None
        data = self.answer()
        if data is not None and self._checked:
            data = data[len(_CHECKED):] if data.startswith(_CHECKED) else None
        if not (same and data is not None and data[:1] in (_FAILED, _INFERRED)):
            return NOT_RUN
        if data[:1] == _FAILED:
            return None
        graph = onnx.GraphProto()
        try:
            graph.ParseFromString(data[1:])
        except Exception:  # noqa: BLE001 -- cannot happen unless the pipe lied: infer in-process
            return NOT_RUN
        return graph

    def inferred_graph(self, model: onnx.ModelProto) -> onnx.GraphProto | None:
        """What the pipeline reads of the input's shape inference: a graph holding the inferred
        ``value_info``; None when inference failed (best effort). The child's answer when it has
        one for ``model``, else ``infer`` here (a large model from its weightless copy)."""
        answer = self.result(model)
        if answer is not NOT_RUN:
            return answer
        inferred = infer(model)
        return None if inferred is model else inferred.graph

    def cancel(self) -> None:
        super().cancel()
        self._model, self._checked = None, False
