"""The reproducible gate, in the registry: every wheel built twice from two copies of the source
must be bit-identical, and identical to the release's own wheels (release/builder/reproduce.py
builds and compares; the build belongs to release/builder/)."""

from __future__ import annotations

from release.builder.reproduce import run_reproduce_gate
from release.evidence import Evidence
from release.gates.contract import GateInputs, Judges, Runner


class ReproducibleGate:
    name = "reproducible"
    runner: Runner = "cpu"
    judges = Judges.EVERY_WHEEL
    shared_file = None

    def run(self, inputs: GateInputs) -> Evidence:
        return run_reproduce_gate(
            inputs.manifest, source_dir=inputs.source_dir, out_dir=inputs.out_dir,
            cache_dir=inputs.cache_dir, only=inputs.options.python,
        )  # fmt: skip


GATE = ReproducibleGate()
