"""The contract every gate keeps: what it declares, what it is given, what it returns.

A gate declares its name (the key of ``[gates.<name>]``), the runner it needs (``cpu`` or
``gpu``) and what it judges: every wheel of the release, the wheel of the interpreter running it,
or one file that every wheel carries (such as the vLLM shim). It is given ``GateInputs`` and
returns one ``Evidence`` (``release.evidence``), already written under ``<out>/evidence/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from release.catalogue import Runner
from release.gates.options import GateOptions

if TYPE_CHECKING:
    from release.catalogue import GateSettings
    from release.evidence import Evidence
    from release.manifest import Manifest
    from release.wheelset import WheelSet


class Judges(Enum):
    """What a gate's verdict is about (its evidence names the digests of exactly that)."""

    EVERY_WHEEL = "every wheel"
    EVERY_WHEEL_IN_ITS_INTERPRETER = "every wheel, each in an interpreter of its Python version"
    RUNNING_INTERPRETER_WHEEL = "the wheel of the interpreter running the gate"
    SHARED_FILE = "one file every wheel carries"


@dataclass(frozen=True)
class GateInputs:
    manifest: Manifest
    wheels: WheelSet
    out_dir: Path
    source_dir: Path
    cache_dir: Path  # compiler caches and framework wheels (the payload gate's citations)
    gpu: str | None  # this runner's GPU, detected once; None on a machine without one
    options: GateOptions = field(default_factory=GateOptions)

    def spec(self, name: str) -> GateSettings:
        return self.manifest.gates[name]


class Gate(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def runner(self) -> Runner: ...

    @property
    def judges(self) -> Judges: ...

    @property
    def shared_file(self) -> str | None:
        """The path inside every wheel that a SHARED_FILE gate judges; None otherwise."""
        ...

    def run(self, inputs: GateInputs) -> Evidence:
        """Judges, writes the evidence under ``<out>/evidence/`` and returns it."""
        ...
