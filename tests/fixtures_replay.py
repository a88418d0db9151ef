"""The parity replay in this process, for tests: a generated trace replayed through the
reference or a wheel's engine (the gate itself replays in child interpreters,
release/scripts/parity_replay.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from release.gates.trace import Trace
from release.scripts.parity_replay import (
    Implementation,
    OpOutcome,
    engine_implementation,
    first_difference,
    reference_implementation,
    trace_from_lines,
)
from release.scripts.parity_replay import replay as replay_trace
from release.util.private_site import install_private

__all__ = ["engine_implementation", "reference_implementation"]


def install_wheel(wheel: Path, site: Path) -> Path:
    """The wheel under test installed into a private folder (never into this environment)."""
    return install_private(Path(sys.executable), wheel, site)


def replay(trace: Trace, implementation: Implementation, device: str = "cpu") -> list[OpOutcome]:
    """Every operation of `trace` run in this process; what each returned, in order."""
    return replay_trace(trace_from_lines(trace.to_lines()), implementation, device)


def compare_cell(
    trace: Trace, reference: Implementation, engine: Implementation, device: str = "cpu"
) -> tuple[str | None, int]:
    """The first difference between the two replays (None: none), and the events replayed."""
    expected = replay(trace, reference)
    actual = replay(trace, engine, device)
    return first_difference(expected, actual), sum(len(o.events) for o in expected)
