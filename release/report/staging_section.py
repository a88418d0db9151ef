"""The report's GPU staging section, from `gpu-staging.json` read through release/report/checked.py:
the bus rates against the copy ceiling, loads and stores at once, whole engine steps by traffic,
int8 against exact, and the plot."""

from __future__ import annotations

from typing import Any

from release.records import GPU_STAGING_RECORD
from release.report.checked import SHAPE_ERRORS, Checked, ShapeError
from release.report.loader import (
    Records,
)
from release.report.model import Block, Cell, Figure, Section, Table, Text
from release.report.plot import block_size_label, staging_plot

STAGING_PLOT = "report-gpu-staging.png"


def _ceiling(staging: Checked) -> dict[str, float]:
    """The copy ceiling, GB/s by direction; empty where the record has none (null: the Python
    staging bench writes that when it was given no --ceiling)."""
    if not staging.has("ceiling_gbps"):
        return {}
    ceiling = staging.entry("ceiling_gbps")
    return {direction: ceiling.number(direction) for direction in ceiling.data}


def _rate_row(row: Checked) -> dict[str, Any]:
    return {"block_bytes": row.whole("block_bytes", 1), "method": row.text("method"),
            "h2d_gbps": row.number("h2d_gbps"), "d2h_gbps": row.number("d2h_gbps")}  # fmt: skip


def _rates(row: dict[str, Any], ceiling: dict[str, float]) -> tuple[str, ...]:
    """ "H2D 23.0 GB/s (42%)" and the same for D2H: GB/s, and the share of the copy ceiling."""
    rates = []
    for direction in ("h2d", "d2h"):
        value = float(row[f"{direction}_gbps"])
        share = f" ({value / ceiling[direction]:.0%})" if ceiling.get(direction) else ""
        rates.append(f"{direction.upper()} {value:.1f} GB/s{share}")
    return tuple(rates)


def _rates_table(rows: list[dict[str, Any]], ceiling: dict[str, float]) -> Table:
    methods = list(dict.fromkeys(row["method"] for row in rows))
    by_cell = {(row["block_bytes"], row["method"]): row for row in rows}
    table = []
    for size in sorted({size for size, _ in by_cell}):
        cells = [Cell(block_size_label(size))]
        for method in methods:
            row = by_cell.get((size, method))
            cells.append(Cell("", "", _rates(row, ceiling)) if row else Cell("—"))
        table.append(tuple(cells))
    return Table(("block", *methods), tuple(table), grid=True)


def _staging_blocks(staging: Checked, built: dict[str, str]) -> list[Block]:
    """The section's blocks; ShapeError where the record is not of the agreed shape."""
    gpu, driver, wheel = (staging.text(k) for k in ("gpu", "driver", "wheel_sha256"))
    ceiling = _ceiling(staging)
    rows = [_rate_row(row) for row in staging.entries("rows")]
    if not rows:
        raise ShapeError("rows: expected at least one measurement; got none")
    said = (f"copy ceiling H2D {ceiling.get('h2d', '?')} GB/s, D2H {ceiling.get('d2h', '?')} GB/s"
            if ceiling else "no copy ceiling in the record")  # fmt: skip
    blocks: list[Block] = [Text(f"{gpu}, driver {driver}; wheel sha256 {wheel}; {said}.")]
    if wheel not in built.values():
        blocks.append(Text("These figures are not of this run's wheels: no built wheel has "
                           f"sha256 {wheel}.", "fail"))  # fmt: skip
    blocks.append(_rates_table(rows, ceiling))
    blocks.extend(_staging_targets(staging))
    # The plot gets the values checked here, never the record's raw ones.
    checked = {**staging.data, "ceiling_gbps": ceiling, "rows": rows}
    blocks.append(Figure(staging_plot(checked), STAGING_PLOT, "staging bandwidth by block size"))
    return blocks


def gpu_staging_section(records: Records) -> Section | None:
    if records.gpu_staging is None:
        return None
    try:
        blocks = _staging_blocks(Checked(records.gpu_staging, ""), records.built_digests())
    except SHAPE_ERRORS as error:
        said = str(error) if isinstance(error, ShapeError) else f"{type(error).__name__}: {error}"
        records.unreadable.append(f"{GPU_STAGING_RECORD}.json: expected the agreed shape; {said}")
        return None
    return Section("GPU staging", "gpu-staging", blocks)


def _gbps(row: Checked, key: str) -> Cell:
    return Cell(f"{row.number(key):.1f} GB/s")


def _staging_targets(staging: Checked) -> list[Block]:
    """Loads and stores at once, and int8 against exact tokens/s, where the record has them."""
    blocks: list[Block] = []
    overlapped = staging.entries("overlapped")
    if overlapped:
        key = "both_ways_ceiling_gbps"
        ceiling = staging.number(key) if staging.has(key) else "?"
        blocks.append(
            Text(f"Loads and stores at once (contiguous copy both ways: {ceiling} GB/s).")
        )
        rows = tuple(
            (
                Cell(block_size_label(r.whole("block_bytes", 1))),
                Cell(r.text("bus")),
                _gbps(r, "engine_both_ways_gbps"),
                _gbps(r, "kernels_both_ways_gbps"),
                # Records of older wheels have no bulk copy kernel.
                _gbps(r, "bulk_both_ways_gbps") if r.has("bulk_both_ways_gbps") else Cell("—"),
                _gbps(r, "batches_both_ways_gbps"),
            )
            for r in overlapped
        )
        headers = ("block", "engine bus", "engine", "kernels alone", "bulk copy kernel alone",
                   "per-layer batches alone")  # fmt: skip
        blocks.append(Table(headers, rows))
    blocks.extend(_staging_scenarios(staging))
    compressed = staging.entries("int8_vs_exact")
    if compressed:
        rows = tuple(
            (
                Cell(block_size_label(r.whole("block_bytes", 1))),
                Cell(r.text("bus")),
                Cell(f"{r.number('int8_over_exact_load'):.2f}x"),
                Cell(f"{r.number('int8_over_exact_store'):.2f}x"),
            )
            for r in compressed
        )
        headers = ("block", "int8 bus", "int8 / exact tokens/s, loads", "stores")
        blocks.append(Table(headers, rows))
    return blocks


def _staging_scenarios(staging: Checked) -> list[Block]:
    """Whole engine steps under the path rule, per block size and traffic (scattered blocks, or
    requests whose chains come back as runs), where the record has them."""
    rule = [r for r in staging.entries("scenarios") if r.text("path") == "auto"]
    if not rule:
        return []

    def rate(row: Checked, way: str) -> Cell:
        return Cell(f"{row.number(f'{way}_gbps'):.1f} GB/s ({row.number(f'{way}_of_ceiling'):.0%})")

    rows = tuple(
        (
            Cell(block_size_label(r.whole("block_bytes", 1))),
            Cell(r.text("scenario")),
            rate(r, "load"),
            rate(r, "store"),
            rate(r, "both_ways"),
            Cell(f"{r.number('load_blocks_per_run'):.1f} / {r.number('store_blocks_per_run'):.1f}"),
            Cell(r.text("bus")),
        )
        for r in rule
    )
    headers = ("block", "traffic", "loads", "stores", "both at once", "blocks per run",
               "path")  # fmt: skip
    return [Text("Engine steps by traffic (of this run's ceiling), the path rule's choice."),
            Table(headers, rows)]  # fmt: skip
