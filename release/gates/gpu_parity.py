"""The GPU parity gate: the parity cells and the GPU cells replayed through the engine's CUDA route
on this machine's GPU, for every wheel in an interpreter of its version (release/gates/parity.py
does the work, with device "cuda"; the device KV is memory the wheel allocates itself).
"""

from __future__ import annotations

from release.gates.contract import Runner
from release.gates.parity import ParityGate


class GpuParityGate(ParityGate):
    name = "gpu-parity"
    runner: Runner = "gpu"
    device = "cuda"


GATE = GpuParityGate()
