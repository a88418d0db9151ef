"""Traces of engine operations: the `activekv-trace` format, version 1 (engine/offload/SPEC.md §8),
and a seeded generator that turns a manifest parity cell into one.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release.catalogue import ParityCell
from release.errors import GateError

FORMAT = "activekv-trace"
VERSION = 1
DIRECTIONS = ("load", "store")
_LAYOUT_KEYS = ("num_layers", "block_size", "num_kv_heads", "head_dim", "dtype")
_ENGINE_KEYS = ("mode", "pool_blocks", "num_regions", "region_blocks", "num_device_blocks")


class TraceError(GateError):
    """A trace that does not follow the format; the message names the line and the key."""


@dataclass(frozen=True)
class Fault:
    direction: str
    layer: int


@dataclass(frozen=True)
class Lookup:
    hashes: tuple[int, ...]


@dataclass(frozen=True)
class Step:
    loads: tuple[tuple[int, int], ...]  # (block hash, device block)
    stores: tuple[tuple[int, int], ...]
    faults: tuple[Fault, ...]
    kv_seed: int


@dataclass(frozen=True)
class Trace:
    seed: int
    layout: dict[str, Any]
    engine: dict[str, Any]
    ops: tuple[Lookup | Step, ...] = field(default=())

    def to_lines(self) -> list[str]:
        header = {"format": FORMAT, "version": VERSION, "seed": self.seed,
                  "layout": self.layout, "engine": self.engine}  # fmt: skip
        lines = [json.dumps(header, sort_keys=True)]
        for op in self.ops:
            if isinstance(op, Lookup):
                lines.append(json.dumps({"op": "lookup", "hashes": list(op.hashes)}))
            else:
                lines.append(json.dumps({
                    "op": "step",
                    "loads": [list(pair) for pair in op.loads],
                    "stores": [list(pair) for pair in op.stores],
                    "faults": [{"direction": f.direction, "layer": f.layer} for f in op.faults],
                    "kv_seed": op.kv_seed,
                }))  # fmt: skip
        return lines

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("\n".join(self.to_lines()) + "\n")
        tmp.replace(path)


# ----------------------------------------------------------------------------- reading


def _field(record: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in record:
        raise TraceError(f"{where}: {key}: expected {kind.__name__}; missing")
    value = record[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TraceError(f"{where}: {key}: expected an integer; got {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise TraceError(f"{where}: {key}: expected {kind.__name__}; got {value!r}")
    return value


def _pairs(record: dict[str, Any], key: str, where: str) -> tuple[tuple[int, int], ...]:
    pairs = _field(record, key, list, where)
    result = []
    for index, pair in enumerate(pairs):
        ok = isinstance(pair, list) and len(pair) == 2
        if not ok or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in pair):
            raise TraceError(
                f"{where}: {key}[{index}]: expected [hash, device_block] of non-negative "
                f"integers; got {pair!r}"
            )
        result.append((pair[0], pair[1]))
    return tuple(result)


def _op(record: dict[str, Any], where: str, num_layers: int) -> Lookup | Step:
    op = _field(record, "op", str, where)
    if op == "lookup":
        hashes = _field(record, "hashes", list, where)
        if any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in hashes):
            raise TraceError(f"{where}: hashes: expected non-negative integers; got {hashes!r}")
        return Lookup(tuple(hashes))
    if op != "step":
        raise TraceError(f'{where}: op: expected "lookup" or "step"; got {op!r}')
    faults = []
    for index, fault in enumerate(_field(record, "faults", list, where)):
        at = f"{where}: faults[{index}]"
        if not isinstance(fault, dict):
            raise TraceError(f"{at}: expected a table; got {fault!r}")
        direction = _field(fault, "direction", str, at)
        layer = _field(fault, "layer", int, at)
        if direction not in DIRECTIONS or not 0 <= layer < num_layers:
            raise TraceError(
                f"{at}: expected direction load|store and 0 <= layer < {num_layers}; got {fault!r}"
            )
        faults.append(Fault(direction, layer))
    return Step(
        loads=_pairs(record, "loads", where),
        stores=_pairs(record, "stores", where),
        faults=tuple(faults),
        kv_seed=_field(record, "kv_seed", int, where),
    )


def read_trace(path: Path) -> Trace:
    """Parses and checks a trace; TraceError names the file, the line and the key."""
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise TraceError(f"{path}: expected a readable trace file; {error.strerror}") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise TraceError(f"{path}:{number}: expected a JSON object; {error.msg}") from None
        if not isinstance(record, dict):
            raise TraceError(f"{path}:{number}: expected a JSON object; got {record!r}")
        records.append((number, record))
    if not records:
        raise TraceError(f"{path}: expected a header line; the file is empty")
    number, header = records[0]
    where = f"{path}:{number}"
    if header.get("format") != FORMAT:
        raise TraceError(f"{where}: format: expected {FORMAT!r}; got {header.get('format')!r}")
    if header.get("version") != VERSION:
        raise TraceError(f"{where}: version: expected {VERSION}; got {header.get('version')!r}")
    layout = _field(header, "layout", dict, where)
    engine = _field(header, "engine", dict, where)
    for key in _LAYOUT_KEYS:
        _field(layout, key, str if key == "dtype" else int, f"{where}: layout")
    for key in _ENGINE_KEYS:
        _field(engine, key, str if key == "mode" else int, f"{where}: engine")
    ops = tuple(_op(r, f"{path}:{n}", layout["num_layers"]) for n, r in records[1:])
    return Trace(_field(header, "seed", int, where), layout, engine, ops)


# ----------------------------------------------------------------------------- generating


def generate(cell: ParityCell) -> Trace:
    """A seeded trace for one cell, of the cell's kind (`trace`): "random", one request per step
    that may share a prefix of an earlier one, loads of that prefix and stores of its new blocks;
    or "requests" (`_requests`). The cell's fence faults are spread over the steps."""
    if cell.trace == "requests":
        return _requests(cell)
    rng = random.Random(cell.seed)
    num_device_blocks = cell.num_device_blocks
    prompts: list[list[int]] = []
    fault_steps = sorted(rng.sample(range(cell.steps), min(cell.fence_faults, cell.steps)))
    ops: list[Lookup | Step] = []
    for step_index in range(cell.steps):
        if prompts and rng.random() < 0.7:
            base = rng.choice(prompts)
            shared = base[: rng.randint(1, len(base))]
        else:
            shared = []
        fresh = [rng.getrandbits(64) for _ in range(rng.randint(1, cell.region_blocks))]
        chain = shared + fresh
        prompts.append(chain)
        ops.append(Lookup(tuple(chain)))
        devices = rng.sample(range(num_device_blocks), num_device_blocks)
        loads = shared[: cell.region_blocks]
        stores = [h for h in chain[len(loads) :]][: cell.region_blocks]
        faults = ()
        if step_index in fault_steps:
            # A fault in a step with no transfer of that direction would test nothing.
            direction = "load" if loads and rng.random() < 0.5 else "store"
            faults = (Fault(direction, rng.randrange(cell.num_layers)),)
        ops.append(_step(rng, loads, stores, devices, faults))
    return _trace(cell, num_device_blocks, ops)


def _step(
    rng: random.Random,
    loads: list[int],
    stores: list[int],
    devices: list[int],
    faults: tuple[Fault, ...],
) -> Step:
    """A step whose loads take the first device blocks and stores the next; its KV seed is drawn
    last, so the trace's random sequence is the same whichever generator made the step."""
    return Step(
        loads=tuple(zip(loads, devices, strict=False)),
        stores=tuple(zip(stores, devices[len(loads) :], strict=False)),
        faults=faults,
        kv_seed=rng.getrandbits(32),
    )


def _trace(cell: ParityCell, num_device_blocks: int, ops: list[Lookup | Step]) -> Trace:
    layout = {
        "num_layers": cell.num_layers,
        "block_size": cell.block_size,
        "num_kv_heads": cell.num_kv_heads,
        "head_dim": cell.head_dim,
        "dtype": cell.dtype,
    }
    engine = {
        "mode": cell.mode,
        "pool_blocks": cell.pool_blocks,
        "num_regions": cell.num_regions,
        "region_blocks": cell.region_blocks,
        "num_device_blocks": num_device_blocks,
    }
    return Trace(cell.seed, layout, engine, tuple(ops))


# Request-shaped traces: how long the warm-up's chains are and how many requests a step carries.
_WARMUP_CHAIN = (1, 3)
_WARMUP_REQUESTS = (2, 4)
_REQUESTS_PER_STEP = (1, 3)


def _requests(cell: ParityCell) -> Trace:
    """Steps shaped like vLLM's: each carries a few requests, whose chains of block hashes go
    into one plan_store in request order, and loads of the prefixes they share with earlier
    requests (in the same step, as vLLM loads a matched prefix while it stores the new blocks).
    The first third of the steps is a warm-up of short chains that fills the pool while loads
    refresh scattered blocks of earlier chains, so that the LRU order no longer follows the slots
    and later evictions free scattered slots: the longer chains after it are split over several
    runs (SPEC.md §2, "Extents"). Device blocks are consecutive in half of the steps (direct runs)
    and scattered in the others. Each step moves at most region_blocks blocks each way."""
    rng = random.Random(cell.seed)
    limit = cell.region_blocks
    num_device_blocks = cell.num_device_blocks
    warmup = max(1, cell.steps // 3)
    chains: list[list[int]] = []
    fault_steps = sorted(rng.sample(range(cell.steps), min(cell.fence_faults, cell.steps)))
    ops: list[Lookup | Step] = []
    for step_index in range(cell.steps):
        loads: list[int] = []
        stores: list[int] = []
        earlier = chains[:]  # requests of earlier steps: what this step may share or load
        if step_index < warmup:
            for _ in range(rng.randint(*_WARMUP_REQUESTS)):
                fresh = [rng.getrandbits(64) for _ in range(rng.randint(*_WARMUP_CHAIN))]
                if len(stores) + len(fresh) > limit:
                    break
                chains.append(fresh)
                ops.append(Lookup(tuple(fresh)))
                stores += fresh
            # Refresh a block or two from anywhere in earlier chains: scattered LRU stamps.
            for _ in range(rng.randint(0, 2)):
                if earlier and len(loads) < limit:
                    chain = rng.choice(earlier)
                    loads.append(chain[rng.randrange(len(chain))])
        else:
            for _ in range(rng.randint(*_REQUESTS_PER_STEP)):
                shared: list[int] = []
                if earlier and rng.random() < 0.75:
                    # Half of the time one of the latest requests: still cached, loaded back.
                    base = rng.choice(earlier[-4:] if rng.random() < 0.5 else earlier)
                    shared = base[: rng.randint(1, len(base))]
                fresh = [rng.getrandbits(64) for _ in range(rng.randint(2, max(2, limit // 2)))]
                shared = shared[: limit - len(loads)]
                fresh = fresh[: limit - len(stores)]
                if not shared and not fresh:
                    break
                chain = shared + fresh
                chains.append(chain)
                ops.append(Lookup(tuple(chain)))
                loads += shared
                stores += fresh
        devices = _device_blocks(rng, num_device_blocks, len(loads) + len(stores))
        faults: tuple[Fault, ...] = ()
        if step_index in fault_steps:
            # In the warm-up a failed store: its slots come back as holes of the step's size
            # while the pool still has room, so placement has runs of several sizes to choose
            # from (best fit, not the first run that holds the step).
            load = loads and step_index >= warmup and rng.random() < 0.5
            faults = (Fault("load" if load else "store", rng.randrange(cell.num_layers)),)
        ops.append(_step(rng, loads, stores, devices, faults))
    return _trace(cell, num_device_blocks, ops)


def _device_blocks(rng: random.Random, num_device_blocks: int, count: int) -> list[int]:
    """`count` distinct device blocks: consecutive from a random start, or scattered."""
    if rng.random() < 0.5:
        start = rng.randrange(num_device_blocks - count + 1)
        return list(range(start, start + count))
    return rng.sample(range(num_device_blocks), count)
