"""The README's staging table and the CUDA route's throughput targets, from one GPU run's two
records: the C++ bench's (`python -m release gpu-staging`, gpu-staging.json) and the Python
API's (`python -m release.scripts.staging_bench_py`, staging-py.json).

Every figure of the table comes from the records, so the README cannot drift from its evidence
(tests/test_readme.py renders the records it names and compares). The targets are judged on the
request-shaped rows of both records; each comes back met or not with the figures that decided it.

    python -m release.report.staging_evidence GPU_STAGING_JSON STAGING_PY_JSON
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.report.checked import ShapeError
from release.report.markdown import table_lines
from release.report.model import Cell, Table
from release.report.plot import block_size_label
from release.report.staging_record import (
    CPP,
    PYTHON,
    STEPS_KEY,
    ScenarioInt8,
    Step,
    read_staging_record,
    required,
)

SCENARIOS = ("requests", "random")  # the table's order: the targets' traffic, then the worst case
WAYS = ("load", "store", "both_ways")
KIB = 1024


@dataclass(frozen=True)
class Target:
    """A floor on request-shaped rows: `ways` of blocks from `min_block` to `max_block` bytes."""

    text: str
    ways: tuple[str, ...]  # GB/s: "load", "store", "both_ways"; x exact: "int8" (loads and stores)
    floor: float
    min_block: int
    max_block: int | None = None


# The targets on the H200 (whole engine steps, request-shaped traffic).
TARGETS = (
    Target("loads and stores at once, ≥ 85 GB/s from 64 KiB", ("both_ways",), 85.0, 64 * KIB),
    Target("loads and stores at once, ≥ 75 GB/s at 16 KiB", ("both_ways",), 75.0, 16 * KIB,
           16 * KIB),
    Target("each way, ≥ 52 GB/s from 64 KiB", ("load", "store"), 52.0, 64 * KIB),
    Target("each way, ≥ 50 GB/s at 16 KiB", ("load", "store"), 50.0, 16 * KIB, 16 * KIB),
    Target("int8 ≥ 1.8x exact tokens/s, loads and stores, every block size", ("int8",), 1.8, 0),
)  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    target: Target
    met: bool
    misses: tuple[str, ...]  # "<block> <record> <way> <figure>" of each figure under the floor


class StagingRecords:
    """The rule's rows (path "auto") of both records, by (block bytes, scenario), read as typed
    staging records (release/report/staging_record.py): ShapeError names the key of a bad value."""

    def __init__(self, cpp: dict[str, Any], python: dict[str, Any]) -> None:
        self.cpp, cpp_int8 = _read(cpp, CPP)
        self.python, python_int8 = _read(python, PYTHON)
        self.int8 = {CPP: cpp_int8, PYTHON: python_int8}
        blocks = {block for block, _ in self.cpp} | {block for block, _ in self.python}
        self.blocks = sorted(blocks)

    def figures(self, block: int, way: str) -> dict[str, float]:
        """Request-shaped figures of `way` at `block`, by record; a record without the row is
        left out (and judged missing by `judge`)."""
        if way == "int8":
            ratios: dict[str, float] = {}
            for name, rows in self.int8.items():
                if row := rows.get((block, "requests")):
                    ratios[f"{name} load"] = row.int8_over_exact_load
                    ratios[f"{name} store"] = row.int8_over_exact_store
            return ratios
        return {
            name: row.way(way).gbps
            for name, rows in ((CPP, self.cpp), (PYTHON, self.python))
            if (row := rows.get((block, "requests")))
        }


Steps = dict[tuple[int, str], Step]  # by (block bytes, scenario)
Ratios = dict[tuple[int, str], ScenarioInt8]


def _read(data: Any, bench: str) -> tuple[Steps, Ratios]:
    """The rule rows and the int8 rows of the record `bench` wrote (typed, through the one
    reader); ShapeError naming the key of a bad value, or of either list where it lacks it."""
    record = read_staging_record(data, bench)
    steps = required(record.steps, STEPS_KEY[bench])
    ratios = required(record.int8_vs_exact_by_scenario, "int8_vs_exact_by_scenario")
    rule = {(r.block_bytes, r.scenario): r for r in steps}
    return rule, {(r.block_bytes, r.scenario): r for r in ratios}


def judge(records: StagingRecords) -> list[Verdict]:
    """Each target against every block size it covers, in both records; a missing row misses."""
    verdicts = []
    for target in TARGETS:
        misses = []
        covered = [
            block for block in records.blocks
            if block >= target.min_block and (target.max_block is None or block <= target.max_block)
        ]  # fmt: skip
        for block in covered:
            for way in target.ways:
                figures = records.figures(block, way)
                expected = 4 if way == "int8" else 2  # two records (and two directions for int8)
                if len(figures) < expected:
                    misses.append(f"{block_size_label(block)} {way}: a record has no row")
                misses += [
                    f"{block_size_label(block)} {name} {way} {value:.2f}"
                    for name, value in figures.items()
                    if value < target.floor
                ]
        if not covered:
            misses.append("no block size of the records is covered")
        verdicts.append(Verdict(target, not misses, tuple(misses)))
    return verdicts


def staging_table(records: StagingRecords) -> Table:
    """One row per block size and traffic: C++ / Python for each figure; blocks per run and the
    path as the C++ bench saw them (the Python record's runs are alike but not the same steps)."""
    rows = []
    for scenario in SCENARIOS:
        for block in records.blocks:
            cpp, python = records.cpp.get((block, scenario)), records.python.get((block, scenario))
            if cpp is None or python is None:
                continue
            int8 = [records.int8[name].get((block, scenario)) for name in (CPP, PYTHON)]
            rows.append(
                (
                    Cell(block_size_label(block)),
                    Cell(scenario),
                    Cell(f"{cpp.load_blocks_per_run:.1f} / {cpp.store_blocks_per_run:.1f}"),
                    Cell(cpp.bus or ""),
                    *(Cell(f"{cpp.way(w).gbps:.1f} / {python.way(w).gbps:.1f}") for w in WAYS),
                    Cell("; ".join(_ratios(r) for r in int8)),
                )
            )
    headers = ("block", "traffic", "blocks per run (loads / stores)", "path", "loads", "stores",
               "both at once", "int8 / exact tokens/s, loads / stores (C++; Python)")  # fmt: skip
    return Table(headers, tuple(rows))


def _ratios(row: ScenarioInt8 | None) -> str:
    if row is None:
        return "—"
    return f"{row.int8_over_exact_load:.2f} / {row.int8_over_exact_store:.2f}"


def load(cpp_path: Path, python_path: Path) -> StagingRecords:
    """Both records, or a ValueError naming the file and what it lacks."""
    loaded = []
    for path in (cpp_path, python_path):
        try:
            loaded.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: expected a JSON staging record; {error}") from error
    for path, record, bench in zip((cpp_path, python_path), loaded, (CPP, PYTHON), strict=True):
        try:
            _read(record, bench)
        except ShapeError as error:
            raise ValueError(
                f"{path}: {error} (expected a staging record with {STEPS_KEY[bench]} and "
                "int8_vs_exact_by_scenario)"
            ) from error
    return StagingRecords(*loaded)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gpu_staging", type=Path, help="the C++ bench's gpu-staging.json")
    parser.add_argument("staging_py", type=Path, help="the Python bench's staging-py.json")
    args = parser.parse_args(argv)
    try:
        records = load(args.gpu_staging, args.staging_py)
    except ValueError as error:
        parser.error(str(error))
    print("\n".join(table_lines(staging_table(records))))
    print()
    verdicts = judge(records)
    for verdict in verdicts:
        said = "met" if verdict.met else "NOT MET: " + ", ".join(verdict.misses)
        print(f"* {verdict.target.text}: {said}")
    return 0 if all(v.met for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
