"""The registry of gates: one line per gate, its name, the module that implements it and the
runner it needs.

Each module holds ``GATE``, an object that keeps ``release.gates.contract.Gate`` (its declared
name and runner must be this line's). Modules are imported only when their gate runs, so a GPU
runner judging one gate loads only what that gate needs, and the manifest schema checks
``[gates.<name>]`` (the name and its ``runner``) against this table without importing any gate.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from release.evidence import Evidence, write_evidence
from release.gates.gpu_runner import NO_GPU_RUNNER

if TYPE_CHECKING:
    from release.gates.contract import Gate, GateInputs, Runner

_GATES: dict[str, tuple[str, Runner]] = {
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
    return tuple(_GATES)


def runner_of(name: str) -> Runner:
    return _GATES[name][1]


def load(name: str) -> Gate:
    """The gate called `name` (KeyError for a name the registry does not hold)."""
    module, runner = _GATES[name]
    gate: Gate = importlib.import_module(module).GATE
    if (gate.name, gate.runner) != (name, runner):
        raise AssertionError(f"{module}.GATE declares {gate.name!r} on {gate.runner!r}; the "
                             f"registry says {name!r} on {runner!r}")  # fmt: skip
    return gate


def run_gate(name: str, inputs: GateInputs) -> Evidence:
    """Runs one declared gate through the contract; a GPU gate on a machine without a GPU
    writes "not run: no GPU runner" evidence instead (it never passes there)."""
    gate = load(name)
    if gate.runner == "gpu" and inputs.gpu is None:
        evidence = Evidence(
            gate=name, verdict="not-run", artefacts=inputs.wheels.digests, reason=NO_GPU_RUNNER
        )
        write_evidence(inputs.out_dir, evidence)
        return evidence
    return gate.run(inputs)
