"""What a gate that judges every wheel in an interpreter of its version finds, wheel by wheel
(parity, gpu-parity, warmup): the interpreter each wheel is judged with, each wheel's figures and
problems, and the one verdict of them all.

A wheel no interpreter here can judge is "not run: no Python X.Y on this runner"; the verdict is
"fail" if any wheel failed, else "not-run" if any was not judged, else "pass".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release.evidence import Verdict
from release.util.interpreters import interpreter_for, no_interpreter
from release.wheelset import Wheel


@dataclass
class PerWheel:
    given: Sequence[Path] = ()  # interpreters named with --python
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)  # wheel name -> figures
    problems: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)

    def interpreter(self, wheel: Wheel) -> Path | None:
        """The interpreter to judge `wheel` with; None (recorded as not run) when there is none."""
        python = interpreter_for(wheel.serves, self.given)
        if python is None:
            reason = no_interpreter(wheel.python)
            self.figures[wheel.name] = {"status": reason}
            self.not_run.append(f"{wheel.name}: {reason}")
        return python

    def found(self, wheel: Wheel, problems: Sequence[str]) -> None:
        """`wheel`'s problems, each named with the wheel."""
        self.problems += [f"{wheel.name}: {problem}" for problem in problems]

    @property
    def verdict(self) -> Verdict:
        return "fail" if self.problems else "not-run" if self.not_run else "pass"

    @property
    def reason(self) -> str:
        return "; ".join(self.problems + self.not_run)
