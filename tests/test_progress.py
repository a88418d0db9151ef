"""The progress bar of long steps (release/util/progress.py): every item, in order, under a bar that
names the item in hand and counts what is done."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text

from release.util import progress

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    stream = io.StringIO()
    monkeypatch.setattr(
        progress, "console", Console(file=stream, width=100, force_terminal=True, highlight=False)
    )
    return stream


def test_tracked_yields_every_item_and_counts_them(screen: io.StringIO) -> None:
    seen = []
    for item in progress.tracked(["3.10", "3.11", "3.12"], "wheels", lambda v: f"python {v}"):
        progress.console.print(f"built {item}")
        seen.append(item)
    assert seen == ["3.10", "3.11", "3.12"]
    text = screen.getvalue()
    assert "wheels: python 3.11" in text
    assert "3/3" in text and "wheels: done" in text
    assert text.index("built 3.10") < text.index("built 3.12")


def test_tracked_stops_the_bar_when_the_loop_fails(screen: io.StringIO) -> None:
    with pytest.raises(RuntimeError):
        for item in progress.tracked([1, 2, 3], "parity cells"):
            if item == 2:
                raise RuntimeError("cell 2 differs")
    text = screen.getvalue()
    assert "1/3" in text and "parity cells: done" not in text
    assert progress.console._live_stack == []  # no live display left behind


# --- long steps in a log: a start line, heartbeats, an end line with the time ---

BEAT = 0.02  # the heartbeat of these tests (30 s in a real run)


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """The pipeline's kind of console, printing into a file that is not a terminal (as in CI)."""
    stream = io.StringIO()
    monkeypatch.setattr(progress, "console", progress.StepConsole(file=stream, highlight=False))
    monkeypatch.setattr(progress, "HEARTBEAT_S", BEAT)
    assert not progress.console.is_interactive
    return stream


def _lines(stream: io.StringIO) -> list[str]:
    return [line.strip() for line in stream.getvalue().splitlines()]


def _beats(lines: list[str], doing: str) -> list[str]:
    return [line for line in lines if line.startswith(f"{doing}: still running, ")]


def _quiet_after_the_step(stream: io.StringIO) -> None:
    """Nothing more is printed once the step has ended (its heartbeat has stopped)."""
    ended = stream.getvalue()
    time.sleep(BEAT * 4)
    assert stream.getvalue() == ended


def test_a_long_step_off_a_terminal_prints_its_start_heartbeats_and_end(log: io.StringIO) -> None:
    doing = "building the python 3.10 wheel"
    with progress.step(doing, count=(1, 3)):
        time.sleep(BEAT * 5)
    _quiet_after_the_step(log)
    lines = _lines(log)
    assert lines[0] == f"{doing} (1 of 3) …"
    assert _beats(lines, doing)
    assert re.fullmatch(rf"{doing}: done in \d+\.\d s \(1 of 3\)", lines[-1]), lines[-1]
    assert lines[1:-1] == _beats(lines, doing)


def test_a_step_that_fails_says_so_and_its_heartbeat_stops(log: io.StringIO) -> None:
    with pytest.raises(RuntimeError), progress.step("installing into a fresh venv"):
        time.sleep(BEAT * 3)
        raise RuntimeError("pip failed")
    _quiet_after_the_step(log)
    assert _lines(log)[-1].startswith("installing into a fresh venv: failed after ")
    assert not [t for t in threading.enumerate() if t.name.startswith("heartbeat: ")]


def test_every_console_status_is_a_long_step(log: io.StringIO) -> None:
    """verify's installs (release/trust/steps.py) and the served-path gate call console.status:
    off a terminal it prints the step's lines, markup stripped as the spinner shows it."""
    with progress.console.status("[bold]checking every file[/], then installing"):
        time.sleep(BEAT * 4)
    _quiet_after_the_step(log)
    lines = _lines(log)
    doing = "checking every file, then installing"
    assert lines[0] == f"{doing} …"
    assert _beats(lines, doing)
    assert lines[-1].startswith(f"{doing}: done in ")


def test_each_item_of_a_tracked_loop_is_a_long_step(log: io.StringIO) -> None:
    wheels = ["3.10", "3.11"]
    for _ in progress.tracked(wheels, "wheels", doing=lambda v: f"building cp{v} wheel"):
        time.sleep(BEAT * 3)
    _quiet_after_the_step(log)
    lines = _lines(log)
    for index, version in enumerate(wheels, 1):
        doing = f"building cp{version} wheel"
        start, end = (
            lines.index(f"{doing} ({index} of 2) …"),
            lines.index(next(line for line in lines if line.startswith(f"{doing}: done in "))),
        )
        assert _beats(lines[start:end], doing)
    assert "2/2" in lines[-1] and "wheels: done" in lines[-1]  # the bar's last state


def test_only_the_innermost_step_beats(log: io.StringIO) -> None:
    with progress.step("reproduce: build a", count=(1, 2)):
        with progress.step("building the python 3.12 wheel"):
            time.sleep(BEAT * 4)
    lines = _lines(log)
    assert _beats(lines, "building the python 3.12 wheel")
    inner_end = next(i for i, line in enumerate(lines) if "3.12 wheel: done in" in line)
    assert not _beats(lines[:inner_end], "reproduce: build a")


def test_on_a_terminal_the_bar_shows_the_time_and_no_heartbeat_is_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    terminal = progress.StepConsole(file=stream, width=100, force_terminal=True,
                                    force_interactive=True)  # fmt: skip
    monkeypatch.setattr(progress, "console", terminal)
    monkeypatch.setattr(progress, "HEARTBEAT_S", BEAT)
    for _ in progress.tracked(["3.10"], "wheels", doing=lambda v: f"building cp{v} wheel"):
        with terminal.status("installing"):
            time.sleep(BEAT * 4)
    text = Text.from_ansi(stream.getvalue()).plain
    assert "still running" not in text
    assert "building cp3.10 wheel (1 of 1) …" in text and "building cp3.10 wheel: done in" in text


# --- the width: COLUMNS, else the terminal's, else 180 in a log ---


@pytest.mark.parametrize(("columns", "width"), [
    ("120", 120), (" 90 ", 90), (None, 180), ("", 180), ("0", 180), ("-3", 180), ("wide", 180),
])  # fmt: skip
def test_columns_sets_the_width_off_a_terminal(columns: str | None, width: int) -> None:
    environ = {} if columns is None else {"COLUMNS": columns}
    assert progress.console_width(io.StringIO(), environ) == width


def test_the_consoles_of_a_run_in_a_log_take_columns() -> None:
    """The real consoles, in a process whose stdout and stderr are pipes (a CI log)."""
    code = "from release.util import progress as p; print(p.console.width, p.error_console.width)"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    for columns, expected in ((None, "180 180"), ("120", "120 120")):
        run_env = env if columns is None else {**env, "COLUMNS": columns}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env=run_env, cwd=REPO, check=True)  # fmt: skip
        assert result.stdout.split() == expected.split(), (columns, result.stdout)
