"""The GPU staging record, typed: `gpu-staging.json` (the C++ bench's, `python -m release
gpu-staging`) or `staging-py.json` (the Python API's, release/scripts/staging_bench_py.py), and
its one reader, which checks every value it takes through release/report/checked.py (ShapeError
naming the key: `scenarios[2].load_gbps`). The report's staging section and the README's
staging evidence both read a record through it.

A part the record does not have is None or empty: which parts a view needs is the view's to say
(`required`); a part that is there is of the agreed shape, or the reader raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from release.report.checked import Checked, ShapeError

CPP, PYTHON = "C++", "Python"  # the bench that wrote a record
# Where each bench keeps its whole-step rows ("rows" of the C++ bench are its bus rates).
STEPS_KEY = {CPP: "scenarios", PYTHON: "rows"}
RULE = "auto"  # the path rule's rows: the forced-path ones stay in the record only

T = TypeVar("T")


@dataclass(frozen=True)
class Rate:
    """One baseline's bus rates at one block size (the C++ bench's `rows`)."""

    block_bytes: int
    method: str
    h2d_gbps: float
    d2h_gbps: float


@dataclass(frozen=True)
class Overlap:
    """Loads and stores at once at one block size, GB/s (`overlapped`)."""

    block_bytes: int
    bus: str
    engine_both_ways_gbps: float
    kernels_both_ways_gbps: float
    bulk_both_ways_gbps: float | None  # records of older wheels have no bulk copy kernel
    batches_both_ways_gbps: float


@dataclass(frozen=True)
class Way:
    """One way of a whole engine step: `<way>_gbps` and `<way>_of_ceiling`."""

    gbps: float
    of_ceiling: float | None  # the share of the copy ceiling; the Python bench's only with one


@dataclass(frozen=True)
class Step:
    """Whole engine steps under the path rule at one block size and traffic."""

    block_bytes: int
    scenario: str  # the traffic: "random" blocks, or "requests" whose chains come back as runs
    load: Way
    store: Way
    both_ways: Way
    load_blocks_per_run: float
    store_blocks_per_run: float
    bus: str | None  # the path the rule chose; the C++ bench's only

    def way(self, name: str) -> Way:
        """`load`, `store` or `both_ways`."""
        ways = {"load": self.load, "store": self.store, "both_ways": self.both_ways}
        return ways[name]


@dataclass(frozen=True)
class Int8:
    """int8 over exact tokens/s at one block size, by the bus it took (`int8_vs_exact`)."""

    block_bytes: int
    bus: str
    int8_over_exact_load: float
    int8_over_exact_store: float


@dataclass(frozen=True)
class ScenarioInt8:
    """int8 over exact tokens/s at one block size and traffic (`int8_vs_exact_by_scenario`)."""

    block_bytes: int
    scenario: str
    int8_over_exact_load: float
    int8_over_exact_store: float


@dataclass(frozen=True)
class StagingRecord:
    """A GPU staging record of either bench (`bench`), as far as the report and the README read
    it; a part it does not have is None, or empty where a list or the ceiling is absent."""

    bench: str  # CPP or PYTHON
    gpu: str | None
    driver: str | None
    wheel_sha256: str | None
    # The copy ceiling, GB/s by direction (C++: h2d, d2h; Python: load, store, both_ways); empty
    # where the record has none (the Python bench writes null when it was given no --ceiling).
    ceiling_gbps: Mapping[str, float]
    rates: tuple[Rate, ...]  # the C++ bench's only
    both_ways_ceiling_gbps: float | None  # a contiguous copy both ways at once
    overlapped: tuple[Overlap, ...]
    steps: tuple[Step, ...] | None  # the path rule's; None where there is no STEPS_KEY list
    int8_vs_exact: tuple[Int8, ...]
    int8_vs_exact_by_scenario: tuple[ScenarioInt8, ...] | None  # None: no such list


def required(value: T | None, key: str) -> T:
    """`value`, which a view of the record needs; ShapeError naming `key` where it is None."""
    if value is None:
        raise ShapeError(f"{key}: missing")
    return value


def read_staging_record(data: Any, bench: str) -> StagingRecord:
    """The record `bench` (CPP or PYTHON) wrote, as JSON loads it; ShapeError naming the key of
    the first value that is not of the agreed shape."""
    record = Checked(data, "")
    gpu, driver, wheel_sha256 = (_text(record, k) for k in ("gpu", "driver", "wheel_sha256"))
    ceiling_gbps: dict[str, float] = {}
    if record.has("ceiling_gbps"):
        ceiling = record.entry("ceiling_gbps")
        ceiling_gbps = {direction: ceiling.number(direction) for direction in ceiling.data}
    rates = tuple(_rate(r) for r in record.entries("rows")) if bench == CPP else ()
    key = "both_ways_ceiling_gbps"
    both_ways_ceiling = record.number(key) if record.has(key) else None
    overlapped = tuple(_overlap(r) for r in record.entries("overlapped"))
    steps_key = STEPS_KEY[bench]
    steps = None
    if steps_key in record.data:
        rule = [r for r in record.entries(steps_key) if r.text("path") == RULE]
        steps = tuple(_step(r, bench) for r in rule)
    int8 = tuple(
        Int8(r.whole("block_bytes", 1), r.text("bus"), r.number("int8_over_exact_load"),
             r.number("int8_over_exact_store"))
        for r in record.entries("int8_vs_exact")
    )  # fmt: skip
    by_scenario = None
    if "int8_vs_exact_by_scenario" in record.data:
        by_scenario = tuple(
            ScenarioInt8(r.whole("block_bytes", 1), r.text("scenario"),
                         r.number("int8_over_exact_load"), r.number("int8_over_exact_store"))
            for r in record.entries("int8_vs_exact_by_scenario")
        )  # fmt: skip
    return StagingRecord(
        bench=bench, gpu=gpu, driver=driver, wheel_sha256=wheel_sha256, ceiling_gbps=ceiling_gbps,
        rates=rates, both_ways_ceiling_gbps=both_ways_ceiling, overlapped=overlapped, steps=steps,
        int8_vs_exact=int8, int8_vs_exact_by_scenario=by_scenario,
    )  # fmt: skip


def _text(record: Checked, key: str) -> str | None:
    """Text where the record has `key` (a null there is not text), else None."""
    return record.text(key) if key in record.data else None


def _rate(row: Checked) -> Rate:
    return Rate(row.whole("block_bytes", 1), row.text("method"), row.number("h2d_gbps"),
                row.number("d2h_gbps"))  # fmt: skip


def _overlap(row: Checked) -> Overlap:
    return Overlap(
        block_bytes=row.whole("block_bytes", 1),
        bus=row.text("bus"),
        engine_both_ways_gbps=row.number("engine_both_ways_gbps"),
        kernels_both_ways_gbps=row.number("kernels_both_ways_gbps"),
        bulk_both_ways_gbps=(
            row.number("bulk_both_ways_gbps") if row.has("bulk_both_ways_gbps") else None
        ),
        batches_both_ways_gbps=row.number("batches_both_ways_gbps"),
    )


def _step(row: Checked, bench: str) -> Step:
    """A whole-step row: the C++ bench writes every figure; the Python bench no bus, and the
    shares of the ceiling only when it was given one."""

    def way(name: str) -> Way:
        gbps, share = row.number(f"{name}_gbps"), f"{name}_of_ceiling"
        of_ceiling = row.number(share) if bench == CPP or row.has(share) else None
        return Way(gbps, of_ceiling)

    block_bytes, scenario = row.whole("block_bytes", 1), row.text("scenario")
    load, store, both_ways = way("load"), way("store"), way("both_ways")
    loads, stores = row.number("load_blocks_per_run"), row.number("store_blocks_per_run")
    bus = row.text("bus") if bench == CPP or row.has("bus") else None
    return Step(block_bytes, scenario, load, store, both_ways, loads, stores, bus)
