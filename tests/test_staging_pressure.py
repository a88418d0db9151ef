"""The staging benches' eviction-pressure scenario and their mix-adjusted ceiling, on the CPU
route (the same engine the CUDA route runs, its bookkeeping bit for bit): what the scenario's steps
hold, how its pool turns over, the ceiling's arithmetic and where a step's time is put."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from release.scripts.staging_bench_py import (
    LAYERS,
    SPLIT,
    Rig,
    measure_together,
    mix_ceiling_seconds,
    split_phases,
)

BLOCKS = 32  # per step
SLOTS = 128  # the pool: four steps of blocks
CEILING = {"load": 50.0, "store": 40.0, "both_ways": 70.0}  # GB/s


def _rig(module: ModuleType) -> Rig:
    layout = module.KvBlockLayout(LAYERS, 1, 1, 8, module.KvDtype.fp16)
    probe = module.Engine(layout, "exact", 1 << 20, 4, BLOCKS, 2 * BLOCKS, device="cpu")
    slot = probe.slot_bytes
    del probe
    engine = module.Engine(layout, "exact", SLOTS * slot, 4, BLOCKS, 2 * BLOCKS, device="cpu")
    kv = [np.zeros((2, 2 * BLOCKS, 1, 1, 8), np.uint16) for _ in range(LAYERS)]
    engine.register_kv_caches(kv)
    rig = Rig(engine, kv, BLOCKS, slot, LAYERS, False, module.EVENT_KINDS)
    for _ in range(SLOTS // BLOCKS + 1):
        rig.random_step(False, True)  # a full pool, as make_rig leaves it
    return rig


def test_pressure_steps_are_full_heavy_with_stores_and_evict_as_much(engine_module) -> None:
    rig = _rig(engine_module)
    rig.begin("pressure")
    steps, evicted = [], []
    for _ in range(12):
        before = len(rig.stored) + 0
        step = rig.pressure_step(True, True)
        steps.append(step)
        # The pool stays full: what the step committed, its evictions made room for.
        evicted.append(before + step.stored - len(rig.stored))
    loaded = sum(s.loaded for s in steps)
    stored = sum(s.stored for s in steps)
    assert all(s.loaded + s.stored == BLOCKS for s in steps), [(s.loaded, s.stored) for s in steps]
    # Hit ratios of 0.2-0.5 (fewer where a prefix was evicted): heavy with stores.
    assert 0.05 * stored < loaded < stored
    assert sum(evicted) >= 0.9 * stored
    # The pool turns over every few steps.
    assert stored / len(steps) >= SLOTS / 8
    assert all(s.load_runs >= 1 for s in steps if s.loaded)


def test_pressure_loads_alone_read_committed_prefixes_and_record_no_request(engine_module) -> None:
    rig = _rig(engine_module)
    rig.begin("pressure")
    for _ in range(5):
        requests = len(rig.requests)
        hashes = {h for request in rig.requests for h in request}
        committed = set(rig.stored)
        step = rig.pressure_step(True, False)
        assert step.stored == 0 and 0 < step.loaded <= BLOCKS
        assert len(rig.requests) == requests  # loads alone record no request
        # What it loaded (every planned load hit: looked up just before) was an earlier request's.
        assert hashes & committed
    # A step of both records its requests: their chains are a loaded prefix, then new blocks.
    newest = rig.next_hash
    rig.pressure_step(True, True)
    assert rig.requests and all(h < rig.next_hash for h in rig.requests[-1])
    assert any(h >= newest for h in rig.requests[-1])


def test_the_mix_ceiling_is_the_longest_of_its_three_times() -> None:
    gb = 1e9
    # Loads only: the H2D ceiling.
    assert mix_ceiling_seconds(5 * gb, 0, CEILING) == pytest.approx(5 / 50)
    # Balanced: both ways at once bounds it (2 GB / 70 > 1 GB / 40).
    assert mix_ceiling_seconds(gb, gb, CEILING) == pytest.approx(2 / 70)
    # Heavy with stores: the D2H ceiling bounds it (0.9 / 40 > 1.0 / 70).
    assert mix_ceiling_seconds(0.1 * gb, 0.9 * gb, CEILING) == pytest.approx(0.9 / 40)
    assert mix_ceiling_seconds(0, 0, CEILING) == 0


def test_rows_are_judged_against_their_steps_mix_ceiling(engine_module) -> None:
    rig = _rig(engine_module)
    rig.ceiling = CEILING
    figures = measure_together({"exact": rig}, 2, "pressure", lambda n, e: pytest.fail(str(e)))
    row = figures["exact"]
    # A CPU copy is far slower than these ceilings: a small fraction, never above 1.
    assert 0 < row["both_ways_of_mix_ceiling"] < 1
    share = row["both_ways_load_share"]
    assert 0 < share < 0.5
    byte = 1e9 * share, 1e9 * (1 - share)
    assert row["both_ways_mix_ceiling_gbps"] == pytest.approx(
        1 / mix_ceiling_seconds(*byte, CEILING), rel=0.25
    )
    assert set(rig.split_ms) == {"load", "store", "both"}
    for way, parts in rig.split_ms.items():
        assert tuple(parts) == SPLIT, way
        assert all(v is None or v >= 0 for k, v in parts.items() if k != "issue"), parts
    # Without a ceiling there is nothing to judge against.
    rig.ceiling = {}
    assert (
        "both_ways_of_mix_ceiling"
        not in measure_together({"exact": rig}, 1, "random", lambda n, e: pytest.fail(str(e)))[
            "exact"
        ]
    )


def test_an_unknown_scenario_is_refused_by_name(engine_module) -> None:
    with pytest.raises(ValueError, match=r"scenario: expected one of .*'pressure'.*; got 'hot'"):
        _rig(engine_module).begin("hot")


PHASES = {"plan": 0.001, "build_step": 0.002, "start_load": 0.003, "wait_for_layer_load": 0.010,
          "save_kv_layer": 0.006, "wait_for_save": 0.004, "events": 0.0005}  # fmt: skip


def test_the_split_takes_the_engines_clock_where_it_has_one() -> None:
    ns = {"allocation": 2_000_000, "eviction": 500_000, "commit": 1_000_000}
    split = split_phases(PHASES, 0.0025, [0.0001] * 31, ns)
    assert split["eviction"] == pytest.approx(0.0005)
    assert split["allocation"] == pytest.approx(0.0015)  # without the eviction
    assert split["issue"] == pytest.approx(0.003 + 0.006 - 0.002)
    assert split["wait"] == pytest.approx(0.010 + 0.004 - 0.001)
    assert split["commit"] == pytest.approx(0.001)
    assert split["plans"] == 0.001 and split["events"] == 0.0005


def test_without_the_engines_clock_allocation_is_the_first_saves_surplus() -> None:
    split = split_phases(PHASES, 0.0025, [0.0001] * 30 + [0.9], None)
    assert split["allocation"] == pytest.approx(0.0024)  # over the median, not the mean
    assert split["eviction"] is None and split["commit"] is None
    assert split["issue"] == pytest.approx(0.003 + 0.006 - 0.0024)
    assert split["wait"] == pytest.approx(0.014)
