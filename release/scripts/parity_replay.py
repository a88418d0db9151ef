"""Replays parity traces through the Python reference and the engine of one installed wheel, in the
interpreter of that wheel's Python version (release/gates/parity.py runs it, one child per wheel).

`python -m release.scripts.parity_replay --site DIR --trace T.jsonl ... --device cpu|cuda
--report R.json`: for each trace (the activekv-trace format the gate wrote), replays every
operation through both implementations with the same driver and reports, per trace, the first
difference (operation, layer, byte offset, event, or the allocator's counts, `extent_stats`,
after a step) or none. Standard library and numpy only, plus `reference` (this repository's, on
PYTHONPATH) and the wheel under test (`--site`): nothing of the pipeline. On the CUDA route the
device KV is memory the wheel allocates itself (`activekv._engine.DeviceKvCache`), so a GPU
runner needs no torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

Event = tuple[str, int]


@dataclass(frozen=True)
class Implementation:
    """One side of the comparison: its module and how it builds a layout."""

    name: str
    module: Any
    make_layout: Callable[[dict[str, Any]], Any]


@dataclass
class OpOutcome:
    events: list[Event]
    lookup: int | None = None
    lost: list[list[int]] | None = None  # per layer
    loaded: dict[int, list[bytes]] | None = None  # device block -> bytes per layer
    # Engine.extent_stats after a step: the allocator's decisions, which no event shows.
    extents: dict[str, int] | None = None


def reference_implementation() -> Implementation:
    """The oracle in reference/ (never shipped)."""
    module = importlib.import_module("reference.engine")
    return Implementation("reference", module, lambda layout: SimpleNamespace(**layout))


def engine_implementation(site: Path) -> Implementation:
    """The engine as the wheel installed under `site` ships it."""
    sys.path.insert(0, str(site))
    module = importlib.import_module("activekv._engine")
    origin = Path(module.__file__).resolve()
    if site.resolve() not in origin.parents:
        raise SystemExit(f"activekv._engine was imported from {origin}, not from {site}")

    def make_layout(layout: dict[str, Any]) -> Any:
        return module.KvBlockLayout(
            layout["num_layers"], layout["block_size"], layout["num_kv_heads"],
            layout["head_dim"], getattr(module.KvDtype, layout["dtype"]),
        )  # fmt: skip

    return Implementation("engine", module, make_layout)


class HostKv:
    """The device KV of the CPU route: numpy arrays of raw words, one per layer."""

    def __init__(self, shape: tuple[int, ...], word: type, num_layers: int) -> None:
        self.layers = [np.zeros(shape, dtype=word) for _ in range(num_layers)]
        self.arrays: list[Any] = self.layers

    def fill(self, kv_seed: int) -> None:
        rng = np.random.Generator(np.random.PCG64(kv_seed))
        for layer in self.layers:
            bits = layer.dtype.itemsize * 8
            layer[...] = rng.integers(0, 2**bits, layer.shape, dtype=layer.dtype)

    def read(self) -> list[np.ndarray]:
        return self.layers


class CudaKv(HostKv):
    """The device KV of the CUDA route, allocated by the wheel itself (DeviceKvCache), filled
    from and read back into the same host words."""

    def __init__(self, shape: tuple[int, ...], word: type, module: Any, layout: Any) -> None:
        super().__init__(shape, word, layout.num_layers)
        self.cache = module.DeviceKvCache(layout, shape[1])
        self.arrays = self.cache.layers

    def fill(self, kv_seed: int) -> None:
        super().fill(kv_seed)
        for index, layer in enumerate(self.layers):
            self.cache.upload(index, layer)

    def read(self) -> list[np.ndarray]:
        return [np.frombuffer(self.cache.download(index), layer.dtype).reshape(layer.shape)
                for index, layer in enumerate(self.layers)]  # fmt: skip


def replay(trace: dict[str, Any], implementation: Implementation, device: str) -> list[OpOutcome]:
    """Runs every operation of `trace` (header and ops as the format holds them)."""
    layout_spec, spec = trace["layout"], trace["engine"]
    module = implementation.module
    layout = implementation.make_layout(layout_spec)
    slot_bytes = module.stored_block_bytes(layout, spec["mode"])
    on_device = {"device": device} if device != "cpu" else {}
    engine = module.Engine(
        layout, spec["mode"], spec["pool_blocks"] * slot_bytes, spec["num_regions"],
        spec["region_blocks"], spec["num_device_blocks"], **on_device,
    )  # fmt: skip
    shape = (2, spec["num_device_blocks"], layout_spec["block_size"],
             layout_spec["num_kv_heads"], layout_spec["head_dim"])  # fmt: skip
    word = np.uint32 if layout_spec["dtype"] == "fp32" else np.uint16
    if device == "cuda":
        kv: HostKv = CudaKv(shape, word, module, layout)
    else:
        kv = HostKv(shape, word, layout_spec["num_layers"])
    engine.register_kv_caches(kv.arrays)
    outcomes: list[OpOutcome] = []
    for op in trace["ops"]:
        if op["op"] == "lookup":
            found = engine.lookup(list(op["hashes"]))
            outcomes.append(OpOutcome([tuple(e) for e in engine.events()], lookup=found))
        else:
            outcomes.append(_replay_step(engine, op, kv))
    return outcomes


def _replay_step(engine: Any, step: dict[str, Any], kv: HostKv) -> OpOutcome:
    kv.fill(step["kv_seed"])
    if step["loads"]:
        engine.plan_load([h for h, _ in step["loads"]], [d for _, d in step["loads"]])
    if step["stores"]:
        engine.plan_store([h for h, _ in step["stores"]], [d for _, d in step["stores"]])
    engine.build_step()
    for fault in step["faults"]:
        engine.inject_fence_fault(fault["direction"], fault["layer"])
    engine.start_load()
    lost = []
    for layer in range(len(kv.layers)):
        lost.append(sorted(engine.wait_for_layer_load(layer)))
        engine.save_kv_layer(layer)
    engine.wait_for_save()
    events = [tuple(event) for event in engine.events()]
    loaded_hashes = {value for kind, value in events if kind == "loaded"}
    layers = kv.read()
    loaded = {
        device: [layer[:, device].tobytes() for layer in layers]
        for block_hash, device in step["loads"]
        if block_hash in loaded_hashes
    }
    return OpOutcome(events, lost=lost, loaded=loaded, extents=dict(engine.extent_stats))


def first_difference(expected: list[OpOutcome], actual: list[OpOutcome]) -> str | None:
    """Where the engine first departs from the reference, in words; None when identical."""
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if want.lookup != got.lookup:
            return f"operation {index}: lookup returned {got.lookup}, reference {want.lookup}"
        for position, (a, b) in enumerate(zip(want.events, got.events, strict=False)):
            if a != b:
                return f"operation {index}: event {position} is {b}, reference {a}"
        if len(want.events) != len(got.events):
            return (f"operation {index}: {len(got.events)} events, reference "
                    f"{len(want.events)}")  # fmt: skip
        if want.lost != got.lost:
            pairs = zip(want.lost or [], got.lost or [], strict=True)
            layer = next(i for i, (a, b) in enumerate(pairs) if a != b)
            return f"operation {index}: layer {layer}: lost blocks differ"
        for device, want_layers in (want.loaded or {}).items():
            got_layers = (got.loaded or {}).get(device)
            if got_layers is None:
                return f"operation {index}: device block {device} not loaded by the engine"
            for layer, (a, b) in enumerate(zip(want_layers, got_layers, strict=True)):
                if a != b:
                    offset = next(i for i in range(len(a)) if a[i] != b[i])
                    return (f"operation {index}: layer {layer}: device block {device}: "
                            f"byte offset {offset}")  # fmt: skip
        if want.extents != got.extents:
            keys = sorted(set(want.extents or {}) | set(got.extents or {}))
            key = next(k for k in keys if (want.extents or {}).get(k) != (got.extents or {}).get(k))
            return (f"operation {index}: extent_stats[{key!r}] is "
                    f"{(got.extents or {}).get(key)}, reference "
                    f"{(want.extents or {}).get(key)}")  # fmt: skip
    return None


def trace_from_lines(lines: Sequence[str]) -> dict[str, Any]:
    """A trace in the activekv-trace format as the gate wrote it: its header with the ops."""
    records = [json.loads(line) for line in lines if line.strip()]
    return {**records[0], "ops": records[1:]}


def read_trace(path: Path) -> dict[str, Any]:
    return trace_from_lines(path.read_text().splitlines())


def compare(path: Path, reference: Implementation, engine: Implementation, device: str) -> dict:
    trace = read_trace(path)
    started = time.monotonic()
    expected = replay(trace, reference, "cpu")
    actual = replay(trace, engine, device)
    return {
        "cell": path.stem,
        "difference": first_difference(expected, actual),
        "operations": len(trace["ops"]),
        "events": sum(len(o.events) for o in expected),
        "seconds": round(time.monotonic() - started, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m release.scripts.parity_replay")
    parser.add_argument("--site", type=Path, required=True, help="the wheel, installed there")
    parser.add_argument("--trace", type=Path, action="append", required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--plant", action="append", default=[],
                        help="a reference fault (the gate's negative controls only)")  # fmt: skip
    args = parser.parse_args(argv)
    engine = engine_implementation(args.site)
    reference = reference_implementation()
    for fault in args.plant:  # each module refuses a name it does not know
        from reference import compression

        owner = compression if fault in compression.KNOWN_FAULTS else reference.module
        if fault not in owner.KNOWN_FAULTS:
            raise SystemExit(f"--plant: expected one of the reference's faults; got {fault!r}")
        owner.FAULTS.add(fault)
    cells = []
    for path in args.trace:
        cell = compare(path, reference, engine, args.device)
        cells.append(cell)
        difference = cell["difference"]
        verdict = "bit-identical" if difference is None else f"differs: {difference}"
        print(f"  {cell['cell']}: {verdict}", flush=True)
    report = {"python": ".".join(map(str, sys.version_info[:3])), "numpy": np.__version__,
              "engine": str(Path(engine.module.__file__)), "cells": cells}  # fmt: skip
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
