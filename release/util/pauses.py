"""Tests only: a pause at a named point of a step, so that a test can kill it there."""

from __future__ import annotations

import os
import time


def pause_for_tests(variable: str) -> None:
    """Sleep the seconds ``variable`` names, if set (tests kill a publish in between)."""
    if seconds := os.environ.get(variable):
        time.sleep(float(seconds))
