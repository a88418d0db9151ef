"""The report's GPU staging section, from `gpu-staging.json` read through the typed staging
record (release/report/staging_record.py): the bus rates against the copy ceiling, loads and
stores at once, whole engine steps by traffic, int8 against exact, and the plot."""

from __future__ import annotations

from collections.abc import Mapping

from release.records import GPU_STAGING_RECORD
from release.report.checked import SHAPE_ERRORS, ShapeError
from release.report.loader import (
    Records,
)
from release.report.model import Block, Cell, Figure, Section, Table, Text
from release.report.plot import block_size_label, staging_plot
from release.report.staging_record import (
    CPP,
    Rate,
    StagingRecord,
    Step,
    read_staging_record,
    required,
)

STAGING_PLOT = "report-gpu-staging.png"


def _rates(row: Rate, ceiling: Mapping[str, float]) -> tuple[str, ...]:
    """ "H2D 23.0 GB/s (42%)" and the same for D2H: GB/s, and the share of the copy ceiling."""
    rates = []
    for direction, gbps in (("h2d", row.h2d_gbps), ("d2h", row.d2h_gbps)):
        value = float(gbps)
        share = f" ({value / ceiling[direction]:.0%})" if ceiling.get(direction) else ""
        rates.append(f"{direction.upper()} {value:.1f} GB/s{share}")
    return tuple(rates)


def _rates_table(rows: tuple[Rate, ...], ceiling: Mapping[str, float]) -> Table:
    methods = list(dict.fromkeys(row.method for row in rows))
    by_cell = {(row.block_bytes, row.method): row for row in rows}
    table = []
    for size in sorted({size for size, _ in by_cell}):
        cells = [Cell(block_size_label(size))]
        for method in methods:
            row = by_cell.get((size, method))
            cells.append(Cell("", "", _rates(row, ceiling)) if row else Cell("—"))
        table.append(tuple(cells))
    return Table(("block", *methods), tuple(table), grid=True)


def _staging_blocks(staging: StagingRecord, built: dict[str, str]) -> list[Block]:
    """The section's blocks; ShapeError where the record lacks what the section shows."""
    gpu = required(staging.gpu, "gpu")
    driver = required(staging.driver, "driver")
    wheel = required(staging.wheel_sha256, "wheel_sha256")
    ceiling = staging.ceiling_gbps
    if not staging.rates:
        raise ShapeError("rows: expected at least one measurement; got none")
    said = (f"copy ceiling H2D {ceiling.get('h2d', '?')} GB/s, D2H {ceiling.get('d2h', '?')} GB/s"
            if ceiling else "no copy ceiling in the record")  # fmt: skip
    blocks: list[Block] = [Text(f"{gpu}, driver {driver}; wheel sha256 {wheel}; {said}.")]
    if wheel not in built.values():
        blocks.append(Text("These figures are not of this run's wheels: no built wheel has "
                           f"sha256 {wheel}.", "fail"))  # fmt: skip
    blocks.append(_rates_table(staging.rates, ceiling))
    blocks.extend(_staging_targets(staging))
    blocks.append(Figure(staging_plot(staging), STAGING_PLOT, "staging bandwidth by block size"))
    return blocks


def gpu_staging_section(records: Records, built: dict[str, str]) -> Section | None:
    """The staging section of the run's gpu-staging record, its wheels marked against `built`."""
    if records.gpu_staging is None:
        return None
    try:
        staging = read_staging_record(records.gpu_staging, CPP)
        blocks = _staging_blocks(staging, built)
    except SHAPE_ERRORS as error:
        said = str(error) if isinstance(error, ShapeError) else f"{type(error).__name__}: {error}"
        records.unreadable.append(f"{GPU_STAGING_RECORD}.json: expected the agreed shape; {said}")
        return None
    return Section("GPU staging", "gpu-staging", blocks)


def _gbps(value: float) -> Cell:
    return Cell(f"{value:.1f} GB/s")


def _staging_targets(staging: StagingRecord) -> list[Block]:
    """Loads and stores at once, and int8 against exact tokens/s, where the record has them."""
    blocks: list[Block] = []
    if staging.overlapped:
        both = staging.both_ways_ceiling_gbps
        ceiling = "?" if both is None else both
        blocks.append(
            Text(f"Loads and stores at once (contiguous copy both ways: {ceiling} GB/s).")
        )
        rows = tuple(
            (
                Cell(block_size_label(r.block_bytes)),
                Cell(r.bus),
                _gbps(r.engine_both_ways_gbps),
                _gbps(r.kernels_both_ways_gbps),
                # Records of older wheels have no bulk copy kernel.
                Cell("—") if r.bulk_both_ways_gbps is None else _gbps(r.bulk_both_ways_gbps),
                _gbps(r.batches_both_ways_gbps),
            )
            for r in staging.overlapped
        )
        headers = ("block", "engine bus", "engine", "kernels alone", "bulk copy kernel alone",
                   "per-layer batches alone")  # fmt: skip
        blocks.append(Table(headers, rows))
    blocks.extend(_staging_scenarios(staging.steps or ()))
    if staging.int8_vs_exact:
        rows = tuple(
            (
                Cell(block_size_label(r.block_bytes)),
                Cell(r.bus),
                Cell(f"{r.int8_over_exact_load:.2f}x"),
                Cell(f"{r.int8_over_exact_store:.2f}x"),
            )
            for r in staging.int8_vs_exact
        )
        headers = ("block", "int8 bus", "int8 / exact tokens/s, loads", "stores")
        blocks.append(Table(headers, rows))
    return blocks


def _staging_scenarios(rule: tuple[Step, ...]) -> list[Block]:
    """Whole engine steps under the path rule, per block size and traffic (scattered blocks, or
    requests whose chains come back as runs), where the record has them."""
    if not rule:
        return []

    def rate(row: Step, way: str) -> Cell:
        figures = row.way(way)
        return Cell(f"{figures.gbps:.1f} GB/s ({figures.of_ceiling:.0%})")

    rows = tuple(
        (
            Cell(block_size_label(r.block_bytes)),
            Cell(r.scenario),
            rate(r, "load"),
            rate(r, "store"),
            rate(r, "both_ways"),
            Cell(f"{r.load_blocks_per_run:.1f} / {r.store_blocks_per_run:.1f}"),
            Cell(r.bus or ""),
        )
        for r in rule
    )
    headers = ("block", "traffic", "loads", "stores", "both at once", "blocks per run",
               "path")  # fmt: skip
    return [Text("Engine steps by traffic (of this run's ceiling), the path rule's choice."),
            Table(headers, rows)]  # fmt: skip
