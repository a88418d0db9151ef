"""`python -m release ...` run in the test process: the same entry point (release.cli.main, its
argparse refusals included) without a child interpreter that spends a second importing the
pipeline; stdout and stderr as pytest captured them."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from release.cli import main

REPO = Path(__file__).resolve().parent.parent


def run_release(
    argv: Sequence[str | Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> subprocess.CompletedProcess[str]:
    """`python -m release ARGV` from the checkout's root, as a finished process would report it:
    its exit status, stdout and stderr."""
    arguments = [str(argument) for argument in argv]
    monkeypatch.chdir(REPO)
    capsys.readouterr()  # what the test printed before is not the command's
    try:
        status = main(arguments)
    except SystemExit as stopped:  # argparse's own refusals
        status = stopped.code if isinstance(stopped.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["python", "-m", "release", *arguments], status, out, err)
