"""The gates a manifest may name: one line per gate, its name, the module that implements it and
the runner it needs.

Data only, and below everything that reads it: ``release.manifest`` checks ``[gates.<name>]``
(the name and its ``runner``) against it, ``release.gates.registry`` imports a gate's module from
it when that gate runs, and trust and CI read a gate's runner from it. It imports nothing of the
pipeline, so loading a manifest loads no gate.
"""

from __future__ import annotations

from typing import Literal

Runner = Literal["cpu", "gpu"]

GATES: dict[str, tuple[str, Runner]] = {
    "policy": ("release.gates.policy", "cpu"),
    "payload": ("release.gates.payload", "cpu"),
    "casters": ("release.gates.casters", "cpu"),
    "served-path": ("release.gates.served_path", "cpu"),
    "parity": ("release.gates.parity", "cpu"),
    "warmup": ("release.gates.warmup", "gpu"),
    "gpu-parity": ("release.gates.gpu_parity", "gpu"),
    "reproducible": ("release.gates.reproducible", "cpu"),
}


def names() -> tuple[str, ...]:
    return tuple(GATES)


def runner_of(name: str) -> Runner:
    return GATES[name][1]
