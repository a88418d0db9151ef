"""The parity gate's progress bar counts what it says: the cells replayed, of every cell of every
wheel (release/gates/parity.py), counted as the child replays each one."""

from __future__ import annotations

import io

import pytest
from rich.text import Text
from test_parity_gate import CACHE, MANIFEST, REFUSALS, REQUESTS_TIGHT, _stand_in

from release.gates.parity import run_parity_gate
from release.util import progress
from release.wheelset import Wheel, WheelSet, running_python


@pytest.mark.integration  # pip installs the stand-in wheel for its child interpreter
def test_the_parity_bar_counts_cells_of_every_wheel(tmp_path, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(progress, "console", progress.StepConsole(file=stream, width=160))
    here = running_python().replace(".", "")
    (judged,) = WheelSet.from_files(
        MANIFEST, [_stand_in(tmp_path, f"cp{here}-cp{here}-linux_x86_64")]
    )
    unknown = Wheel(tmp_path / "activekv-0.1.0-cp399-cp399.whl", "1" * 64, "3.99", ("3.99",), 0)
    cells = [REFUSALS, REQUESTS_TIGHT]
    evidence = run_parity_gate(MANIFEST, WheelSet((judged, unknown)), tmp_path / "out",
                               cells=cells, cache_dir=CACHE)  # fmt: skip
    assert evidence.figures["wheels"][judged.name]["status"] == "pass"
    lines = Text.from_ansi(stream.getvalue()).plain.splitlines()
    # 2 cells x 2 wheels; the wheel with no Python 3.99 here replayed none of its 2.
    assert "parity: cells: done" in lines[-1] and " 2/4 " in lines[-1], lines[-1]
    doing = f"parity: replaying 2 cells on {judged.name}"
    assert f"{doing} (1 of 2) …" in lines
    assert any(line.startswith(f"{doing}: done in ") for line in lines)
