"""The trace format (SPEC.md §8): round trip, seeded generation, and malformed traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from release.gates.trace import Lookup, Step, TraceError, generate, read_trace
from release.manifest import load_manifest

REPO = Path(__file__).resolve().parent.parent
CELLS = load_manifest(REPO / "manifests" / "activekv.toml").gates["parity"].cells


def test_the_manifest_declares_enough_cells():
    modes = [cell.mode for cell in CELLS]
    assert modes.count("exact") >= 13
    assert len(modes) - modes.count("exact") >= 12
    assert {cell.dtype for cell in CELLS} == {"fp16", "bf16", "fp32"}
    assert any(cell.fence_faults for cell in CELLS)


@pytest.mark.parametrize("cell", CELLS, ids=lambda cell: cell.name)
def test_generated_traces_respect_the_cell(cell, tmp_path):
    trace = generate(cell)
    steps = [op for op in trace.ops if isinstance(op, Step)]
    assert len(steps) == cell.steps
    assert sum(len(step.faults) for step in steps) == min(cell.fence_faults, cell.steps)
    for step in steps:
        assert len(step.loads) <= cell.region_blocks and len(step.stores) <= cell.region_blocks
        devices = [d for _, d in step.loads + step.stores]
        assert len(set(devices)) == len(devices)
        assert all(0 <= d < trace.engine["num_device_blocks"] for d in devices)
    path = tmp_path / "trace.jsonl"
    trace.write(path)
    assert read_trace(path) == trace


def test_generation_is_deterministic():
    assert generate(CELLS[0]).to_lines() == generate(CELLS[0]).to_lines()
    assert generate(CELLS[0]).to_lines() != generate(CELLS[1]).to_lines()


def test_shared_prefixes_occur():
    trace = generate(CELLS[0])
    lookups = [op.hashes for op in trace.ops if isinstance(op, Lookup)]
    assert any(a[0] == b[0] for i, a in enumerate(lookups) for b in lookups[i + 1 :])


REQUEST_CELLS = [cell for cell in CELLS if cell.trace == "requests"]


def test_the_manifest_declares_request_shaped_cells():
    assert 3 <= len(REQUEST_CELLS) <= 5
    assert {cell.mode for cell in REQUEST_CELLS} >= {"exact", "int8"}
    assert any(cell.fence_faults for cell in REQUEST_CELLS)


@pytest.mark.parametrize("cell", REQUEST_CELLS, ids=lambda cell: cell.name)
def test_request_shaped_traces_share_prefixes_and_load_them_while_storing(cell):
    trace = generate(cell)
    steps = [op for op in trace.ops if isinstance(op, Step)]
    stored_before: set[int] = set()
    several_requests = loads_beside_stores = 0
    lookups = 0
    for op in trace.ops:
        if isinstance(op, Lookup):
            lookups += 1
            continue
        several_requests += lookups > 1
        lookups = 0
        loaded = {h for h, _ in op.loads}
        stored = [h for h, _ in op.stores]
        assert loaded <= stored_before  # loads name blocks earlier steps stored
        assert not loaded & set(stored)
        loads_beside_stores += bool(loaded and stored)
        stored_before |= set(stored)
    assert several_requests >= len(steps) // 3
    assert loads_beside_stores >= len(steps) // 3
    # The warm-up's short chains outnumber the pool before the longer requests begin.
    warmup = steps[: cell.steps // 3]
    assert sum(len(step.stores) for step in warmup) > cell.pool_blocks // 2


def test_request_shaped_generation_is_deterministic_and_leaves_random_cells_alone():
    assert generate(REQUEST_CELLS[0]).to_lines() == generate(REQUEST_CELLS[0]).to_lines()
    random_cell = CELLS[0]
    assert random_cell.trace == "random"
    as_requests = random_cell.model_copy(update={"trace": "requests"})
    assert generate(as_requests).to_lines() != generate(random_cell).to_lines()


HEADER = {
    "format": "activekv-trace",
    "version": 1,
    "seed": 1,
    "layout": {"num_layers": 2, "block_size": 4, "num_kv_heads": 1, "head_dim": 8, "dtype": "bf16"},
    "engine": {
        "mode": "exact",
        "pool_blocks": 4,
        "num_regions": 2,
        "region_blocks": 2,
        "num_device_blocks": 6,
    },
}
STEP = {"op": "step", "loads": [[1, 0]], "stores": [[2, 1]], "faults": [], "kv_seed": 3}


def _header(**changes):
    return {**HEADER, **changes}


MALFORMED = [
    ("not json", ["{", json.dumps(STEP)], ":1: expected a JSON object"),
    ("wrong format", [_header(format="other")], "format: expected 'activekv-trace'"),
    ("wrong version", [_header(version=2)], "version: expected 1"),
    ("no layout", [{k: v for k, v in HEADER.items() if k != "layout"}], "layout: expected dict"),
    (
        "layout dtype",
        [_header(layout={**HEADER["layout"], "dtype": 2})],
        "layout: dtype: expected str",
    ),
    (
        "engine key",
        [_header(engine={k: v for k, v in HEADER["engine"].items() if k != "num_regions"})],
        "engine: num_regions: expected int",
    ),
    ("unknown op", [HEADER, {"op": "evict"}], ':2: op: expected "lookup" or "step"'),
    ("lookup hashes", [HEADER, {"op": "lookup", "hashes": [-1]}], ":2: hashes: expected"),
    ("bad pair", [HEADER, {**STEP, "loads": [[1]]}], ":2: loads[0]: expected [hash, device_block]"),
    ("bool seed", [HEADER, {**STEP, "kv_seed": True}], ":2: kv_seed: expected an integer"),
    (
        "fault layer",
        [HEADER, {**STEP, "faults": [{"direction": "load", "layer": 5}]}],
        ":2: faults[0]: expected direction load|store and 0 <= layer < 2",
    ),
    (
        "fault direction",
        [HEADER, {**STEP, "faults": [{"direction": "up", "layer": 0}]}],
        ":2: faults[0]: expected direction",
    ),
    ("missing stores", [HEADER, {k: v for k, v in STEP.items() if k != "stores"}], "stores"),
]


@pytest.mark.parametrize(
    ("lines", "expected"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_traces_are_rejected_naming_line_and_key(tmp_path, lines, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    with pytest.raises(TraceError) as error:
        read_trace(path)
    assert str(path) in str(error.value)
    assert expected in str(error.value)


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TraceError, match="expected a header line"):
        read_trace(empty)
    with pytest.raises(TraceError, match="expected a readable trace file"):
        read_trace(tmp_path / "missing.jsonl")
