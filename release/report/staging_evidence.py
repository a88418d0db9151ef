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

from release.report.checked import Checked, ShapeError
from release.report.markdown import table_lines
from release.report.model import Cell, Table
from release.report.plot import block_size_label

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
    """The rule's rows (path "auto") of both records, by (block bytes, scenario), read through
    the report's checks (release/report/checked.py): ShapeError names the key of a bad value."""

    def __init__(self, cpp: dict[str, Any], python: dict[str, Any]) -> None:
        self.cpp, cpp_int8 = _read(cpp, CPP_ROWS)
        self.python, python_int8 = _read(python, PYTHON_ROWS)
        self.int8 = {"C++": cpp_int8, "Python": python_int8}
        blocks = {block for block, _ in self.cpp} | {block for block, _ in self.python}
        self.blocks = sorted(blocks)

    def figures(self, block: int, way: str) -> dict[str, float]:
        """Request-shaped figures of `way` at `block`, by record; a record without the row is
        left out (and judged missing by `judge`)."""
        if way == "int8":
            return {
                f"{name} {direction}": row.number(f"int8_over_exact_{direction}")
                for name, rows in self.int8.items()
                if (row := rows.get((block, "requests")))
                for direction in ("load", "store")
            }
        return {
            name: row.number(f"{way}_gbps")
            for name, rows in (("C++", self.cpp), ("Python", self.python))
            if (row := rows.get((block, "requests")))
        }


def _key(row: Checked) -> tuple[int, str]:
    return row.whole("block_bytes", 1), row.text("scenario")


Rows = dict[tuple[int, str], Checked]
CPP_ROWS, PYTHON_ROWS = "scenarios", "rows"  # where each record keeps its whole-step rows


def _read(record: Any, rows_key: str) -> tuple[Rows, Rows]:
    """A record's rule rows and its int8 rows; ShapeError naming the key of a bad value."""
    checked = Checked(record, "")
    rows = {_key(r): r for r in checked.listed(rows_key) if r.text("path") == "auto"}
    return rows, {_key(r): r for r in checked.listed("int8_vs_exact_by_scenario")}


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
            int8 = [records.int8[name].get((block, scenario)) for name in ("C++", "Python")]
            rows.append(
                (
                    Cell(block_size_label(block)),
                    Cell(scenario),
                    Cell(
                        f"{cpp.number('load_blocks_per_run'):.1f} / "
                        f"{cpp.number('store_blocks_per_run'):.1f}"
                    ),
                    Cell(cpp.text("bus")),
                    *(
                        Cell(f"{cpp.number(f'{w}_gbps'):.1f} / {python.number(f'{w}_gbps'):.1f}")
                        for w in WAYS
                    ),
                    Cell("; ".join(_ratios(r) for r in int8)),
                )
            )
    headers = ("block", "traffic", "blocks per run (loads / stores)", "path", "loads", "stores",
               "both at once", "int8 / exact tokens/s, loads / stores (C++; Python)")  # fmt: skip
    return Table(headers, tuple(rows))


def _ratios(row: Checked | None) -> str:
    if row is None:
        return "—"
    return f"{row.number('int8_over_exact_load'):.2f} / {row.number('int8_over_exact_store'):.2f}"


def load(cpp_path: Path, python_path: Path) -> StagingRecords:
    """Both records, or a ValueError naming the file and what it lacks."""
    loaded = []
    for path in (cpp_path, python_path):
        try:
            loaded.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: expected a JSON staging record; {error}") from error
    for path, record, rows_key in zip(
        (cpp_path, python_path), loaded, (CPP_ROWS, PYTHON_ROWS), strict=True
    ):
        try:
            _read(record, rows_key)
        except ShapeError as error:
            raise ValueError(
                f"{path}: {error} (expected a staging record with {rows_key} and "
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
