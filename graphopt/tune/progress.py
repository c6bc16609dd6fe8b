"""The progress bar of lowering selection, one step per node (and of ``graphopt cache kernels``, one per kernel
instance): rich, on stderr when it is a terminal."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def node_progress(total: int, *, enabled: bool | None = None, description: str = "profiling") -> Iterator[Callable[[str], None]]:
    """A rich progress bar over nodes; yields ``advance(label)``. Off when stderr is not a terminal."""
    if enabled is False:
        yield lambda label: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = Console(stderr=True)
    if enabled is None:
        enabled = console.is_terminal
    progress = Progress(
        TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[label]}", markup=False),
        console=console, disable=not enabled, transient=False,
    )
    with progress:
        task = progress.add_task(description, total=total, label="")

        def advance(label: str) -> None:
            progress.update(task, advance=1, label=label)

        yield advance


__all__ = ["node_progress"]
