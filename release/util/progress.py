"""The one rich console every step prints through (progress, tables, errors), and the progress
bar of long steps (wheels built, parity cells replayed, files uploaded)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

# Logs and CI are not terminals: give tables room for wheel names and digests there.
_WIDTH = None if sys.stdout.isatty() else 180

# How a gate verdict is coloured wherever one is printed.
VERDICT_STYLE = {"pass": "green", "fail": "red", "not-run": "yellow", "other-wheels": "red"}

console = Console(highlight=False, soft_wrap=True, width=_WIDTH)
error_console = Console(stderr=True, highlight=False, soft_wrap=True, width=_WIDTH)

Item = TypeVar("Item")


def progress_bar() -> Progress:
    """A bar that says what is being done, how many of how many, and for how long."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def tracked(items: Sequence[Item], what: str, label: Callable[[Item], str] = str) -> Iterator[Item]:
    """Yields `items` one by one under a progress bar titled `what` (e.g. "wheels"); the bar
    names the item in hand and counts it done when the loop asks for the next one.

    Lines printed meanwhile through `console` appear above the bar; a `console.status` inside
    the loop nests under it.
    """
    with progress_bar() as progress:
        task = progress.add_task(what, total=len(items))
        for item in items:
            progress.update(task, description=f"{what}: {label(item)}", refresh=True)
            yield item
            progress.advance(task)
        progress.update(task, description=f"{what}: done")
