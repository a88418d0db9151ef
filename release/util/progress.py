"""The one rich console every step prints through (progress, tables, errors), and the progress
of long steps (wheels built, parity cells replayed, files uploaded, verify's installs).

A long step prints a line when it starts ("building the python 3.10 wheel (1 of 3) …") and one
when it ends, with its time. Meanwhile an interactive terminal shows a rich bar or spinner; a CI
log or a pipe, where rich draws neither until the step ends, gets a heartbeat every HEARTBEAT_S
seconds instead ("building the python 3.10 wheel: still running, 60 s"). `console.status(...)` is
such a step wherever it is called.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TextIO, TypeVar

from rich.console import Console, RenderableType
from rich.errors import MarkupError
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.status import Status
from rich.text import Text

# Logs and CI are not terminals: give tables room for wheel names and digests there.
LOG_WIDTH = 180
# A log line at least this often while a long step runs off a terminal.
HEARTBEAT_S = 30.0

# How a gate verdict is coloured wherever one is printed.
VERDICT_STYLE = {"pass": "green", "fail": "red", "not-run": "yellow", "other-wheels": "red"}

Item = TypeVar("Item")


def console_width(stream: TextIO, environ: Mapping[str, str] = os.environ) -> int | None:
    """The width to draw at: `COLUMNS` where it is a positive whole number; else the terminal's
    own (None: rich asks it, and follows a resize); else LOG_WIDTH off a terminal."""
    columns = environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if stream.isatty() else LOG_WIDTH


class _StepStatus(Status):
    """rich's spinner around a `step`: its start and end lines, and its heartbeat off a terminal."""

    def __enter__(self) -> _StepStatus:
        self._step = step(_plain(self.status), on=self.console)
        self._step.__enter__()
        super().__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            super().__exit__(kind, error, tb)
        finally:
            self._step.__exit__(kind, error, tb)


class StepConsole(Console):
    """A rich Console whose `status(...)` is also a long `step` (a start line, an end line with
    its time, heartbeats off a terminal): every call site gets them unchanged."""

    def status(self, status: RenderableType, **options: Any) -> Status:
        return _StepStatus(status, console=self, **options)


def new_console(*, stderr: bool = False, environ: Mapping[str, str] = os.environ) -> StepConsole:
    """The console of stdout (or stderr), at `console_width`; it writes to whatever sys.stdout is
    when it prints (pytest's capture included)."""
    stream = sys.stderr if stderr else sys.stdout
    return StepConsole(
        stderr=stderr, highlight=False, soft_wrap=True, width=console_width(stream, environ)
    )


console = new_console()
error_console = new_console(stderr=True)


def _plain(renderable: RenderableType) -> str:
    """The text of a status: a string's markup stripped (rich shows it styled), else str()."""
    if isinstance(renderable, str):
        try:
            return Text.from_markup(renderable).plain
        except MarkupError:  # "[/x]" closes nothing: not markup, the text itself
            return renderable
    return str(renderable)


# The steps in hand, innermost last: only the innermost beats (an outer one says nothing new).
_steps: list[object] = []
_steps_lock = threading.Lock()


def _innermost(token: object) -> bool:
    with _steps_lock:
        return bool(_steps) and _steps[-1] is token


def _seconds(started: float) -> str:
    """The time since `started`, as a log says it: "148 s", "2.4 s"."""
    elapsed = time.monotonic() - started
    return f"{elapsed:.1f} s" if elapsed < 10 else f"{elapsed:.0f} s"


def _beat(out: Console, doing: str, started: float, every: float, stop: threading.Event) -> None:
    token = threading.current_thread()
    while not stop.wait(every):
        if _innermost(token):
            out.print(f"{doing}: still running, {_seconds(started)}", markup=False, highlight=False)


@contextmanager
def _heartbeat(out: Console, doing: str, started: float, every: float) -> Iterator[None]:
    """Beats while the block runs, off an interactive terminal only (there the bar or spinner
    shows the time); stopped, its thread ended, once the block ends."""
    if out.is_interactive:
        yield
        return
    stop = threading.Event()
    beats = threading.Thread(
        target=_beat, args=(out, doing, started, every, stop), name=f"heartbeat: {doing}",
        daemon=True,  # never keeps a failed run alive
    )  # fmt: skip
    with _steps_lock:
        _steps.append(beats)
    beats.start()
    try:
        yield
    finally:
        stop.set()
        beats.join()
        with _steps_lock:
            _steps.remove(beats)


@contextmanager
def step(
    doing: str,
    *,
    count: tuple[int, int] | None = None,
    on: Console | None = None,
    every: float | None = None,
) -> Iterator[None]:
    """A long step named by what it is `doing` ("building the python 3.10 wheel"), `count`
    (i, n) when it is one of several: a line as it starts and one with its time as it ends;
    between them, off an interactive terminal, a heartbeat every `every` seconds (HEARTBEAT_S),
    stopped before the end line. Only the innermost step in hand beats."""
    out = on if on is not None else console
    of = f" ({count[0]} of {count[1]})" if count else ""
    out.print(f"{doing}{of} …", markup=False, highlight=False)
    started = time.monotonic()
    outcome = "failed after"
    try:
        with _heartbeat(out, doing, started, HEARTBEAT_S if every is None else every):
            yield
        outcome = "done in"
    except GeneratorExit:  # the loop around it stopped early (tracked's consumer)
        outcome = "stopped after"
        raise
    finally:
        out.print(f"{doing}: {outcome} {_seconds(started)}{of}", markup=False, highlight=False)


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


class Tally:
    """A bar counting `total` units (cells, wheels, files) while steps do them."""

    def __init__(self, progress: Progress, task: TaskID, what: str) -> None:
        self.progress, self.task, self.what = progress, task, what

    def describe(self, detail: str) -> None:
        """Names the part in hand beside the bar: "`what`: `detail`"."""
        self.progress.update(self.task, description=f"{self.what}: {detail}", refresh=True)

    def advance(self, units: int = 1) -> None:
        self.progress.advance(self.task, units)

    @property
    def total(self) -> float | None:
        return self.progress.tasks[self.task].total

    @property
    def completed(self) -> float:
        return self.progress.tasks[self.task].completed


@contextmanager
def tally(total: int, what: str) -> Iterator[Tally]:
    """A bar titled `what` counting `total` units; "`what`: done" once the block ends without
    an error."""
    with progress_bar() as progress:
        bar = Tally(progress, progress.add_task(what, total=total), what)
        yield bar
        bar.describe("done")


def tracked(
    items: Sequence[Item],
    what: str,
    label: Callable[[Item], str] = str,
    *,
    doing: Callable[[Item], str] | None = None,
) -> Iterator[Item]:
    """Yields `items` one by one under a progress bar titled `what` (e.g. "wheels"); the bar
    names the item in hand and counts it done when the loop asks for the next one. Each item is
    a `step`, `doing` it (default "`what`: `label`"): off a terminal, a line as it starts, a
    heartbeat while it runs and a line with its time as it ends.

    Lines printed meanwhile through `console` appear above the bar; a `console.status` inside
    the loop nests under it (and its heartbeat stands for the item's meanwhile).
    """
    with tally(len(items), what) as bar:
        for index, item in enumerate(items, 1):
            bar.describe(label(item))
            text = doing(item) if doing else f"{what}: {label(item)}"
            with step(text, count=(index, len(items))):
                yield item
            bar.advance()
