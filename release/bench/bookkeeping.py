"""`python -m release bench`: host-side bookkeeping of one layer of one step, engine against the
Python reference, on the same trace and in the same run (these machines are noisy: the ratio is
what counts).

The geometry is tiny (one token, one head, eight elements per block) so that data copies cost next
to nothing and what is timed is the bookkeeping: lookups, plans, pins, leases, LRU, events.
"""

from __future__ import annotations

import operator
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, SupportsIndex

import numpy as np

from release.errors import ReleaseError
from release.scripts.parity_replay import (
    Implementation,
    engine_implementation,
    reference_implementation,
)
from release.util.private_site import install_private
from release.util.progress import console

LAYOUT = {"num_layers": 32, "block_size": 1, "num_kv_heads": 1, "head_dim": 8, "dtype": "bf16"}
# The most blocks per step: the engine's pool is 4 x blocks slots and each step draws 2 x blocks
# random hashes, so more is a run of minutes and gigabytes, not a measurement.
MAX_BLOCKS = 1 << 20
MAX_STEPS = 1 << 16


@dataclass(frozen=True)
class BenchResult:
    implementation: str
    microseconds_per_layer_step: float
    steps: int


def _engine(implementation: Implementation, blocks: int) -> tuple[Any, list[np.ndarray]]:
    module = implementation.module
    layout = implementation.make_layout(LAYOUT)
    slot = module.stored_block_bytes(layout, "exact")
    device_blocks = 2 * blocks
    engine = module.Engine(layout, "exact", 4 * blocks * slot, 4, blocks, device_blocks)
    layers = [
        np.zeros((2, device_blocks, 1, 1, 8), dtype=np.uint16) for _ in range(LAYOUT["num_layers"])
    ]
    engine.register_kv_caches(layers)
    return engine, layers


def _step(engine: Any, loads: list[int], stores: list[int], blocks: int) -> None:
    if loads:
        engine.plan_load(loads, list(range(len(loads))))
    engine.plan_store(stores, list(range(blocks, blocks + len(stores))))
    engine.build_step()
    engine.start_load()
    for layer in range(LAYOUT["num_layers"]):
        engine.wait_for_layer_load(layer)
        engine.save_kv_layer(layer)
    engine.wait_for_save()
    engine.events()


def _check_count(value: SupportsIndex, name: str, high: int) -> None:
    """ReleaseError naming ``name`` unless ``value`` is a whole number from 1 to ``high`` (an int
    or anything with __index__; a bool is no count, though Python says it is an int)."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or not 1 <= number <= high:
        raise ReleaseError(f"{name}: expected a whole number from 1 to {high}; got {value!r}")


def _check_counts(blocks: SupportsIndex, steps: SupportsIndex) -> None:
    # A count of 0 would time no step (the median of nothing) and -1 would ask the engine for a
    # negative pool: both are refused before anything is installed or built.
    _check_count(blocks, "--blocks", MAX_BLOCKS)
    _check_count(steps, "steps", MAX_STEPS)


def measure(implementation: Implementation, blocks: int, steps: int, seed: int) -> BenchResult:
    """Each step loads the `blocks` stored by the step before and stores `blocks` new ones."""
    _check_counts(blocks, steps)
    rng = random.Random(seed)
    engine, _ = _engine(implementation, blocks)
    previous: list[int] = []
    timings = []
    for _ in range(steps + 1):
        fresh = [rng.getrandbits(64) for _ in range(blocks)]
        started = time.perf_counter()
        _step(engine, previous, fresh, blocks)
        timings.append(time.perf_counter() - started)
        previous = fresh
    per_layer = statistics.median(timings[1:]) / LAYOUT["num_layers"] * 1e6
    return BenchResult(implementation.name, per_layer, steps)


def run_bench(wheel: Path, out_dir: Path, *, blocks: int = 256, steps: int = 30) -> dict[str, Any]:
    _check_counts(blocks, steps)
    site = install_private(Path(sys.executable), wheel, out_dir / "bench" / "site")
    engine = measure(engine_implementation(site), blocks, steps, seed=1)
    reference = measure(reference_implementation(), blocks, max(3, steps // 10), seed=1)
    ratio = reference.microseconds_per_layer_step / engine.microseconds_per_layer_step
    console.print(f"bookkeeping per layer-step at {blocks} blocks ({LAYOUT['num_layers']} layers):")
    console.print(f"  engine     {engine.microseconds_per_layer_step:10.2f} µs  (target ≤ 5 µs)")
    console.print(f"  reference  {reference.microseconds_per_layer_step:10.2f} µs")
    console.print(f"  ratio      {ratio:10.1f}x    (target ≥ 50x)")
    return {
        "blocks": blocks,
        "engine_us": engine.microseconds_per_layer_step,
        "reference_us": reference.microseconds_per_layer_step,
        "ratio": ratio,
    }
