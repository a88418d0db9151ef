"""The progress bar of long steps (release/util/progress.py): every item, in order, under a bar that
names the item in hand and counts what is done."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from release.util import progress


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
