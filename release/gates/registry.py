"""The registry of gates: loads and runs the gates of ``release.catalogue`` (one line per gate,
its name, module and runner).

Each module holds ``GATE``, an object that keeps ``release.gates.contract.Gate`` (its declared
name and runner must be its catalogue line's). Modules are imported only when their gate runs,
so a GPU runner judging one gate loads only what that gate needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from release import catalogue
from release.evidence import Evidence, write_evidence
from release.gpu import NO_GPU_RUNNER

if TYPE_CHECKING:
    from release.gates.contract import Gate, GateInputs

# The catalogue's own table: a gate added there is loaded here.
_GATES = catalogue.GATES


def load(name: str) -> Gate:
    """The gate called `name` (KeyError for a name the registry does not hold)."""
    entry = _GATES[name]
    module, runner = entry.module, entry.runner
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
