"""A gate as a newcomer would add one: this module and one registry line (tests only)."""

from __future__ import annotations

from release.evidence import Evidence, write_evidence
from release.gates.contract import GateInputs, Judges, Runner


class NonEmptyGate:
    name = "non-empty"
    runner: Runner = "cpu"
    judges = Judges.EVERY_WHEEL
    shared_file = None

    def run(self, inputs: GateInputs) -> Evidence:
        empty = [wheel.name for wheel in inputs.wheels if wheel.size == 0]
        evidence = Evidence(
            gate=self.name,
            verdict="fail" if empty else "pass",
            artefacts=inputs.wheels.digests,
            reason="; ".join(f"{name}: empty" for name in empty),
        )
        write_evidence(inputs.out_dir, evidence)
        return evidence


GATE = NonEmptyGate()
