"""The parity gate: replay each manifest cell's trace through the Python reference and through the
engine of the built wheel; every returned byte and every event must be identical.

One driver runs both implementations through the same API (engine/offload/SPEC.md §7), so what
differs is only the implementation. A difference is reported at its first position: operation
index, layer and byte offset, or the first differing event.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from release.errors import GateError
from release.evidence import Evidence, runner_identity, write_evidence
from release.gates.contract import GateInputs, Judges, Runner
from release.gates.trace import Lookup, Step, Trace, generate
from release.manifest import Manifest
from release.util.private_site import install_private
from release.util.progress import console, tracked
from release.wheelset import Wheel

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


def reference_implementation(reload: bool = False) -> Implementation:
    """The oracle in reference/ (never shipped), imported from this checkout beside `release`."""
    module = importlib.import_module("reference.engine")
    if reload:
        module = importlib.reload(module)
    return Implementation("reference", module, lambda layout: SimpleNamespace(**layout))


def engine_implementation(site: Path) -> Implementation:
    """The engine as the wheel installed under `site` ships it."""
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    module = importlib.import_module("activekv._engine")
    origin = Path(module.__file__).resolve()
    if site.resolve() not in origin.parents:
        raise GateError(
            f"activekv._engine was imported from {origin}, not from the wheel at {site}"
        )

    def make_layout(layout: dict[str, Any]) -> Any:
        return module.KvBlockLayout(
            layout["num_layers"], layout["block_size"], layout["num_kv_heads"],
            layout["head_dim"], getattr(module.KvDtype, layout["dtype"]),
        )  # fmt: skip

    return Implementation("engine", module, make_layout)


def install_wheel(wheel: Path, site: Path) -> Path:
    """Installs the wheel under test into a private folder (never into this environment)."""
    return install_private(Path(sys.executable), wheel, site)


def _word_dtype(dtype: str) -> type[np.unsignedinteger[Any]]:
    return np.uint32 if dtype == "fp32" else np.uint16


def _fill(layers: list[np.ndarray], kv_seed: int) -> None:
    rng = np.random.Generator(np.random.PCG64(kv_seed))
    for layer in layers:
        bits = layer.dtype.itemsize * 8
        layer[...] = rng.integers(0, 2**bits, layer.shape, dtype=layer.dtype)


class HostKv:
    """The device KV of the CPU route: numpy arrays of raw words, one per layer."""

    def __init__(self, shape: tuple[int, ...], word: type, num_layers: int) -> None:
        self.layers = [np.zeros(shape, dtype=word) for _ in range(num_layers)]
        self.arrays: list[Any] = self.layers
        self.stream = 0

    def fill(self, kv_seed: int) -> None:
        _fill(self.layers, kv_seed)

    def read(self) -> list[np.ndarray]:
        return self.layers


class CudaKv(HostKv):
    """The device KV of the CUDA route: torch tensors on the GPU (torch only drives the test; the
    wheel never links it), filled from and read back into the same host words."""

    def __init__(self, shape: tuple[int, ...], word: type, num_layers: int) -> None:
        super().__init__(shape, word, num_layers)
        try:
            import torch
        except ImportError as error:
            raise GateError("parity --device cuda: expected torch with CUDA to hold the device "
                            f"KV; {error}") from error  # fmt: skip
        self._torch = torch
        signed = torch.int32 if word is np.uint32 else torch.int16
        unsigned = torch.uint32 if word is np.uint32 else torch.uint16
        self._signed = np.int32 if word is np.uint32 else np.int16
        self.tensors = [torch.zeros(shape, dtype=signed, device="cuda") for _ in self.layers]
        self.arrays = [tensor.view(unsigned) for tensor in self.tensors]
        self.stream = torch.cuda.current_stream().cuda_stream

    def fill(self, kv_seed: int) -> None:
        super().fill(kv_seed)
        for tensor, layer in zip(self.tensors, self.layers, strict=True):
            tensor.copy_(self._torch.from_numpy(layer.view(self._signed)))
        self._torch.cuda.synchronize()

    def read(self) -> list[np.ndarray]:
        pairs = zip(self.tensors, self.layers, strict=True)
        return [tensor.cpu().numpy().view(layer.dtype) for tensor, layer in pairs]


def replay(trace: Trace, implementation: Implementation, device: str = "cpu") -> list[OpOutcome]:
    """Runs every operation of `trace`; what each returned, in order."""
    layout_spec, spec = trace.layout, trace.engine
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
    kv_type = CudaKv if device == "cuda" else HostKv
    kv = kv_type(shape, _word_dtype(layout_spec["dtype"]), layout_spec["num_layers"])
    engine.register_kv_caches(kv.arrays)
    outcomes: list[OpOutcome] = []
    for op in trace.ops:
        if isinstance(op, Lookup):
            found = engine.lookup(list(op.hashes))
            outcomes.append(OpOutcome(list(engine.events()), lookup=found))
            continue
        outcomes.append(_replay_step(engine, op, kv))
    return outcomes


def _replay_step(engine: Any, step: Step, kv: HostKv) -> OpOutcome:
    kv.fill(step.kv_seed)
    if step.loads:
        engine.plan_load([h for h, _ in step.loads], [d for _, d in step.loads])
    if step.stores:
        engine.plan_store([h for h, _ in step.stores], [d for _, d in step.stores])
    engine.build_step()
    for fault in step.faults:
        engine.inject_fence_fault(fault.direction, fault.layer)
    engine.start_load()
    lost = []
    for layer in range(len(kv.layers)):
        lost.append(sorted(engine.wait_for_layer_load(layer)))
        if kv.stream:
            engine.save_kv_layer(layer, stream=kv.stream)
        else:
            engine.save_kv_layer(layer)
    engine.wait_for_save()
    events = [tuple(event) for event in engine.events()]
    loaded_hashes = {value for kind, value in events if kind == "loaded"}
    layers = kv.read()
    loaded = {
        device: [layer[:, device].tobytes() for layer in layers]
        for block_hash, device in step.loads
        if block_hash in loaded_hashes
    }
    return OpOutcome(events, lost=lost, loaded=loaded)


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
    return None


@dataclass(frozen=True)
class CellResult:
    cell: str
    mode: str
    operations: int
    events: int
    difference: str | None
    seconds: float

    @property
    def verdict(self) -> str:
        return "bit-identical" if self.difference is None else "differs"


def compare_cell(
    trace: Trace, reference: Implementation, engine: Implementation, device: str = "cpu"
) -> tuple[str | None, int]:
    expected = replay(trace, reference)
    actual = replay(trace, engine, device)
    return first_difference(expected, actual), sum(len(o.events) for o in expected)


def run_parity_gate(
    manifest: Manifest,
    wheel: Wheel,
    out_dir: Path,
    *,
    cells: Sequence[str] = (),
    site: Path | None = None,
    device: str = "cpu",
) -> Evidence:
    """Replays the manifest's cells against the engine of `wheel` (installed under `site`, or
    into `<out>/parity/site` here); writes the parity evidence. With device "cuda" the engine
    runs its CUDA route on this machine's GPU, on the same cells plus the GPU cells, and the
    evidence (gate "gpu-parity") names the GPU and the driver."""
    gate = manifest.gates.get("parity")
    if gate is None or not gate.cells:
        raise GateError(f"{manifest.path}: gates.parity.cells: expected parity cells")
    declared = list(gate.cells) + (list(gate.gpu_cells or ()) if device == "cuda" else [])
    chosen = [c for c in declared if not cells or c.name in cells]
    unknown = sorted(set(cells) - {c.name for c in declared})
    if unknown:
        raise GateError(f"--cell: expected cells of {manifest.path} gates.parity; got {unknown}")
    engine = engine_implementation(site or install_wheel(wheel.path, out_dir / "parity" / "site"))
    reference = reference_implementation()
    traces_dir = out_dir / "parity" / "traces"
    traces_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for cell in tracked(chosen, "parity cells", lambda c: c.name):
        trace = generate(cell)
        trace.write(traces_dir / f"{cell.name}.jsonl")
        started = time.monotonic()
        with console.status(f"parity: {cell.name}"):
            difference, events = compare_cell(trace, reference, engine, device)
        result = CellResult(cell.name, cell.mode, len(trace.ops), events, difference,
                            time.monotonic() - started)  # fmt: skip
        console.print(f"  {cell.name}: {result.verdict}"
                      + (f" — {difference}" if difference else ""))  # fmt: skip
        results.append(result)
    failures = [r for r in results if r.difference]
    if device == "cuda":
        from release.gates.warmup import gpu_identity

        runner = gpu_identity()
    else:
        runner = runner_identity()
    evidence = Evidence(
        gate="gpu-parity" if device == "cuda" else "parity",
        runner=runner,
        verdict="fail" if failures else "pass",
        artefacts={wheel.name: wheel.sha256},
        figures={
            "cells": [
                {
                    "cell": r.cell,
                    "mode": r.mode,
                    "verdict": r.verdict,
                    "first_difference": r.difference,
                    "operations": r.operations,
                    "events": r.events,
                    "seconds": round(r.seconds, 2),
                }
                for r in results
            ],
            "exact": _count(results, exact=True),
            "compressed": _count(results, exact=False),
        },
        reason="; ".join(f"{r.cell}: {r.difference}" for r in failures),
        tools={"numpy": np.__version__},
    )
    write_evidence(out_dir, evidence)
    return evidence


def _count(results: list[CellResult], *, exact: bool) -> str:
    group = [r for r in results if (r.mode == "exact") == exact]
    same = sum(r.difference is None for r in group)
    return f"{same} of {len(group)} bit-identical"


class ParityGate:
    name = "parity"
    runner: Runner = "cpu"
    judges = Judges.RUNNING_INTERPRETER_WHEEL
    shared_file = None

    def run(self, inputs: GateInputs) -> Evidence:
        wheel = inputs.wheels.for_running_interpreter()
        options = inputs.options
        console.print(
            f"parity: engine of {wheel.name} ({options.device} route) against the Python reference"
        )
        return run_parity_gate(
            inputs.manifest, wheel, inputs.out_dir, cells=options.cells, device=options.device
        )


GATE = ParityGate()
