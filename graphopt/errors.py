"""User-facing errors and their exit codes.

Every error a user can cause is a ``GraphoptError`` subclass with a one-line message that names the
file, node or rule and says what to do. The CLI prints ``graphopt: error: <message>`` and exits with
the class's ``exit_code``; it never prints a traceback for these. The codes are listed in
``graphopt --help`` from ``EXIT_CODES`` below, so the docs cannot drift from the code.
"""

from __future__ import annotations

import difflib
from typing import Iterable


class GraphoptError(Exception):
    """Base class: a problem with the user's input or environment, not a bug in graphopt."""

    exit_code = 1

    #: Longest message kept whole; a longer one (it quotes some huge user text) loses its middle.
    MAX_MESSAGE = 10_000

    def __init__(self, message: str):
        # One line only: the CLI contract is a single line per error, of a readable length.
        text = " ".join(str(message).split())
        if len(text) > self.MAX_MESSAGE:
            cut = len(text) - self.MAX_MESSAGE + 40
            text = f"{text[:self.MAX_MESSAGE * 2 // 3]} ...[{cut} characters cut]... {text[-(self.MAX_MESSAGE // 3 - 40):]}"
        super().__init__(text)


class UsageError(GraphoptError):
    """A bad option value that click cannot check by itself (for example ``--shape-profile``)."""

    exit_code = 2


class InputNotFound(GraphoptError):
    exit_code = 3


class InvalidModel(GraphoptError):
    """Not an ONNX model: empty, truncated, random bytes, another protobuf message, bad tensor data."""

    exit_code = 4


class UnsupportedModel(GraphoptError):
    """An opset, ir_version or domain graphopt does not support."""

    exit_code = 5


class InvalidGraph(GraphoptError):
    """The graph breaks an IR invariant: a cycle, a dangling input, duplicate names."""

    exit_code = 6


class UnsafeExternalData(GraphoptError):
    """External data that would escape the model's folder, or is missing or malformed."""

    exit_code = 7


class OutputRefused(GraphoptError):
    """The output would overwrite the input (or its external data), or cannot be written."""

    exit_code = 8


class VerificationFailed(GraphoptError):
    """The optimized model's outputs differ from the original's beyond the tolerance."""

    exit_code = 9


class RuleError(GraphoptError):
    """A rule file is malformed, names an unknown op or constraint, or rules do not converge."""

    exit_code = 10


class WriteFailed(GraphoptError):
    """Writing the output failed (disk full, permission denied); nothing partial is left behind."""

    exit_code = 11


class TuningError(GraphoptError):
    """The GPU, its tuning cache or a lowering could not be used as asked."""

    exit_code = 12


def did_you_mean(word: str, choices: Iterable[str], n: int = 3) -> str:
    """``"; did you mean a100?"`` for the closest of ``choices`` to ``word`` (difflib), else ``""``."""
    choices = [str(c) for c in choices]
    close = difflib.get_close_matches(str(word), choices, n=n, cutoff=0.6)
    if not close:
        low = {c.lower(): c for c in choices}
        close = [low[c] for c in difflib.get_close_matches(str(word).lower(), list(low), n=n, cutoff=0.6)]
    return f"; did you mean {' or '.join(close)}?" if close else ""


EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "internal error (a bug in graphopt: please report it with the model)",
    UsageError.exit_code: "usage error (bad option or argument)",
    InputNotFound.exit_code: "input file not found or unreadable",
    InvalidModel.exit_code: "not a valid ONNX model (empty, truncated, corrupt tensor data)",
    UnsupportedModel.exit_code: "unsupported opset, ir_version or custom domain",
    InvalidGraph.exit_code: "invalid graph (cycle, dangling input, duplicate names)",
    UnsafeExternalData.exit_code: "unsafe or missing external data",
    OutputRefused.exit_code: "output path refused (it would overwrite the input)",
    VerificationFailed.exit_code: "verification failed (outputs differ beyond tolerance)",
    RuleError.exit_code: "rule file error",
    WriteFailed.exit_code: "could not write the output (nothing partial was left)",
    TuningError.exit_code: "GPU / tuning error",
}
