"""The release report: `<out>/report.md` and `<out>/report.html`, written from the records the
steps left under `<out>/` (build.json, evidence/*.json, gpu-staging.json, sign.json,
publish.json, verify.json) and nothing else.

Both files render one document (sections of text, tables, a grid and a figure), so they always
say the same. The HTML is self-contained: inline CSS, the GPU staging plot as a data URI; the
plot is also written beside the Markdown as `report-gpu-staging.png`. A record that is missing
becomes a line of "Not run, and why"; a record that cannot be read is reported there too, never
raised, so the report of a failed run is still written.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from release.evidence import Evidence
from release.manifest import Manifest
from release.records import GPU_STAGING_RECORD
from release.report import html, markdown
from release.report.loader import STALE, Records, gate_rows, load_records
from release.report.model import Cell, Document, Figure, Section, Table, Text
from release.report.plot import block_size_label, staging_plot
from release.util.atomic import atomic_write
from release.util.pins import project_version

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
STAGING_PLOT = "report-gpu-staging.png"
SERVED_PATH_GATE = "served-path"
VERDICT_MARK = {"pass": "✓", "fail": "✗", "not-run": "○", STALE: "≠"}


# --- figures, described generically (other gates add their own) ---


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def describe(value: Any) -> str:
    """A figure's value in a few words: scalars as they are, collections summarised."""
    if _scalar(value):
        return "—" if value is None or value == "" else str(value)
    if isinstance(value, list):
        if not value:
            return "none"
        if all(_scalar(v) for v in value) and len(value) <= 6:
            return "[" + ", ".join(str(v) for v in value) + "]"
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            return f"{len(value)} values from {min(value)} to {max(value)}"
        if all(isinstance(v, dict) for v in value):
            for key in ("verdict", "kind", "outcome"):
                if all(key in v for v in value):
                    counts = Counter(str(v[key]) for v in value)
                    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        return f"{len(value)} entries"
    if isinstance(value, dict):
        if not value:
            return "none"
        distinct = {json.dumps(v, sort_keys=True) for v in value.values()}
        if len(value) > 1 and len(distinct) == 1 and not _scalar(next(iter(value.values()))):
            return f"each of {len(value)}: {describe(next(iter(value.values())))}"
        text = ", ".join(f"{k} {describe(v)}" for k, v in value.items())
        return text if len(value) <= 6 and len(text) <= 120 else f"{len(value)} entries"
    return str(value)


def _figure_text(figures: dict[str, Any]) -> tuple[str, ...]:
    return tuple(f"{key}: {describe(value)}" for key, value in figures.items())


# --- sections ---


def _size(size: int) -> str:
    return f"{size / 1e6:.2f} MB ({size:,} bytes)"


def _artefacts(records: Records) -> Section:
    section = Section("Artefacts", "artefacts")
    build = records.build
    if build is None:
        section.blocks.append(Text("No build record (build.json): no wheel was built.", "fail"))
        return section
    rows = []
    for wheel in build.wheels:
        how = "from the cache" if wheel.cached else f"built in {wheel.seconds} s"
        rows.append(
            (
                Cell(wheel.file, "code"),
                Cell(", ".join(wheel.serves)),
                Cell(_size(wheel.size)),
                Cell(how),
                Cell(wheel.sha256, "code"),
            )
        )
    section.blocks.append(Table(("wheel", "serves Python", "size", "build", "sha256"), tuple(rows)))
    if build.toolchain:
        section.blocks.append(
            Text("Toolchain: " + ", ".join(f"{k} {v}" for k, v in build.toolchain.items()))
        )
    epoch = build.source_date_epoch
    when = datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    section.blocks.append(Text(f"SOURCE_DATE_EPOCH {epoch} ({when})."))
    return section


def _runner(evidence: Evidence) -> str:
    runner = evidence.runner or {}
    if runner.get("gpu"):
        driver = f", driver {runner['driver']}" if runner.get("driver") else ""
        return f"{runner['gpu']}{driver}"
    return f"{runner.get('kind', '?')}: {runner.get('cpu', runner.get('host', '?'))}"


def _judged(evidence: Evidence, built: dict[str, str]) -> Cell:
    if built and evidence.artefacts == built:
        return Cell(f"all {len(built)} built wheels (sha256 of each matches)")
    lines = []
    for name, digest in sorted(evidence.artefacts.items()):
        if built.get(name) == digest:
            mark = "= built"
        elif name in built:
            mark = "≠ built wheel"
        else:
            mark = "not built here"
        lines.append(f"{name.split('-manylinux')[0]}: {digest[:16]}… {mark}")
    return Cell("", "code", tuple(lines) or ("none",))


def _gates(manifest: Manifest, channel: str, records: Records) -> Section:
    section = Section(f"Gates (channel {channel})", "gates")
    built = records.built_digests()
    rows = []
    for gate in gate_rows(manifest, channel, records):
        evidence = gate.evidence
        figures = _figure_text(evidence.figures) if evidence else ()
        tone = "fail" if gate.verdict == STALE else gate.verdict
        rows.append(
            (
                Cell(gate.name, "name"),
                Cell(gate.runner),
                Cell("yes" if gate.required else "no"),
                Cell(f"{VERDICT_MARK[gate.verdict]} {gate.verdict}", f"{tone} nowrap"),
                Cell("", "", (*figures, *([gate.reason] if gate.reason else ())) or ("—",)),
                _judged(evidence, built) if evidence else Cell("—"),
                Cell(_runner(evidence) if evidence else "—"),
            )
        )
    headers = ("gate", "runner", f"required by {channel}", "verdict", "figures", "judged", "ran on")
    section.blocks.append(Table(headers, tuple(rows)))
    return section


def _short_cell_name(name: str, dtype: str) -> str:
    parts = name.split("-", 2)
    return parts[2] if len(parts) == 3 and parts[1] == dtype else name


def _parity_cells(evidence: Evidence | None) -> dict[str, dict[str, Any]]:
    """Each replayed cell across the judged wheels: bit-identical only where every wheel's engine
    was; the first difference found, named with its wheel."""
    cells: dict[str, dict[str, Any]] = {}
    for name, judged in (evidence.figures.get("wheels", {}) if evidence else {}).items():
        for cell in judged.get("cells", []):
            merged = cells.setdefault(cell["cell"], {"cell": cell["cell"],
                                                     "verdict": "bit-identical"})  # fmt: skip
            if cell.get("difference") and "difference" not in merged:
                merged.update(verdict="differs", difference=f"{name}: {cell['difference']}")
    return cells


def _parity(manifest: Manifest, records: Records) -> Section | None:
    gate = manifest.gates.get("parity")
    evidence = records.evidence.get("parity")
    if gate is None or not gate.cells:
        return None
    section = Section("Parity matrix", "parity")
    results = _parity_cells(evidence)
    modes = list(dict.fromkeys(c.mode for c in gate.cells))
    dtypes = list(dict.fromkeys(c.dtype for c in gate.cells))
    rows = []
    for mode in modes:
        row = [Cell(mode)]
        for dtype in dtypes:
            entries: list[str] = []
            tones: list[str] = []
            for cell in (c for c in gate.cells if c.mode == mode and c.dtype == dtype):
                result = results.get(cell.name)
                if result is None:
                    tone, mark = "not-run", "○"
                elif result.get("verdict") == "bit-identical":
                    tone, mark = "pass", "✓"
                else:
                    tone, mark = "fail", "✗"
                tones.append(tone)
                entries.append(f"{mark} {_short_cell_name(cell.name, dtype)}")
            tone = "fail" if "fail" in tones else "not-run" if "not-run" in tones else "pass"
            row.append(
                Cell("", tone if entries else "", tuple(entries) or ("no cell",), tuple(tones))
            )
        rows.append(tuple(row))
    if evidence is None:
        section.blocks.append(Text("The parity gate left no evidence in this run.", "not-run"))
    else:
        for name, judged in evidence.figures.get("wheels", {}).items():
            said = (f"exact {judged['exact']}, compressed {judged['compressed']}"
                    if "exact" in judged else judged.get("status", "?"))  # fmt: skip
            python = f" (Python {judged['python']})" if "python" in judged else ""
            section.blocks.append(Text(f"Reference against the engine of {name}{python}: {said}."))
    section.blocks.append(Table(("mode / dtype", *dtypes), tuple(rows), grid=True))
    for result in results.values():
        if result.get("difference"):
            section.blocks.append(
                Text(f"{result['cell']}: first difference: {result['difference']}", "fail")
            )
    return section


def _rates(row: dict[str, Any], ceiling: dict[str, float]) -> tuple[str, ...]:
    """ "H2D 23.0 GB/s (42%)" and the same for D2H: GB/s, and the share of the copy ceiling."""
    rates = []
    for direction in ("h2d", "d2h"):
        value = float(row[f"{direction}_gbps"])
        share = f" ({value / ceiling[direction]:.0%})" if ceiling.get(direction) else ""
        rates.append(f"{direction.upper()} {value:.1f} GB/s{share}")
    return tuple(rates)


def _gpu_staging(records: Records) -> Section | None:
    staging = records.gpu_staging
    if staging is None:
        return None
    section = Section("GPU staging", "gpu-staging")
    try:
        ceiling = staging.get("ceiling_gbps", {})
        section.blocks.append(
            Text(
                f"{staging['gpu']}, driver {staging['driver']}; wheel sha256 "
                f"{staging['wheel_sha256']}; copy ceiling H2D {ceiling.get('h2d', '?')} GB/s, "
                f"D2H {ceiling.get('d2h', '?')} GB/s."
            )
        )
        built = records.built_digests()
        if staging["wheel_sha256"] not in built.values():
            section.blocks.append(
                Text(
                    "These figures are not of this run's wheels: no built wheel has sha256 "
                    f"{staging['wheel_sha256']}.",
                    "fail",
                )
            )
        methods = list(dict.fromkeys(str(row["method"]) for row in staging["rows"]))
        by_cell = {(int(r["block_bytes"]), str(r["method"])): r for r in staging["rows"]}
        rows = []
        for size in sorted({size for size, _ in by_cell}):
            cells = [Cell(block_size_label(size))]
            for method in methods:
                row = by_cell.get((size, method))
                cells.append(Cell("", "", _rates(row, ceiling)) if row else Cell("—"))
            rows.append(tuple(cells))
        section.blocks.append(Table(("block", *methods), tuple(rows), grid=True))
        section.blocks.extend(_staging_targets(staging))
        section.blocks.append(
            Figure(staging_plot(staging), STAGING_PLOT, "staging bandwidth by block size")
        )
    except (KeyError, TypeError, ValueError) as error:
        records.unreadable.append(
            f"{GPU_STAGING_RECORD}.json: expected the agreed shape; missing or bad {error}"
        )
        return None
    return section


def _staging_targets(staging: dict[str, Any]) -> list[Text | Table]:
    """Loads and stores at once, and int8 against exact tokens/s, where the record has them."""
    blocks: list[Text | Table] = []
    overlapped = staging.get("overlapped", [])
    if overlapped:
        ceiling = staging.get("both_ways_ceiling_gbps", "?")
        blocks.append(
            Text(f"Loads and stores at once (contiguous copy both ways: {ceiling} GB/s).")
        )
        rows = tuple(
            (
                Cell(block_size_label(int(r["block_bytes"]))),
                Cell(str(r["bus"])),
                Cell(f"{float(r['engine_both_ways_gbps']):.1f} GB/s"),
                Cell(f"{float(r['kernels_both_ways_gbps']):.1f} GB/s"),
                # Records of older wheels have no bulk copy kernel.
                Cell(f"{float(r['bulk_both_ways_gbps']):.1f} GB/s")
                if "bulk_both_ways_gbps" in r
                else Cell("—"),
                Cell(f"{float(r['batches_both_ways_gbps']):.1f} GB/s"),
            )
            for r in overlapped
        )
        headers = ("block", "engine bus", "engine", "kernels alone", "bulk copy kernel alone",
                   "per-layer batches alone")  # fmt: skip
        blocks.append(Table(headers, rows))
    blocks.extend(_staging_scenarios(staging))
    compressed = staging.get("int8_vs_exact", [])
    if compressed:
        rows = tuple(
            (
                Cell(block_size_label(int(r["block_bytes"]))),
                Cell(str(r["bus"])),
                Cell(f"{float(r['int8_over_exact_load']):.2f}x"),
                Cell(f"{float(r['int8_over_exact_store']):.2f}x"),
            )
            for r in compressed
        )
        headers = ("block", "int8 bus", "int8 / exact tokens/s, loads", "stores")
        blocks.append(Table(headers, rows))
    return blocks


def _staging_scenarios(staging: dict[str, Any]) -> list[Text | Table]:
    """Whole engine steps under the path rule, per block size and traffic (scattered blocks, or
    requests whose chains come back as runs), where the record has them."""
    rule = [r for r in staging.get("scenarios", []) if r["path"] == "auto"]
    if not rule:
        return []

    def rate(row: dict[str, Any], way: str) -> Cell:
        return Cell(f"{float(row[f'{way}_gbps']):.1f} GB/s ({float(row[f'{way}_of_ceiling']):.0%})")

    rows = tuple(
        (
            Cell(block_size_label(int(r["block_bytes"]))),
            Cell(str(r["scenario"])),
            rate(r, "load"),
            rate(r, "store"),
            rate(r, "both_ways"),
            Cell(f"{float(r['load_blocks_per_run']):.1f} / {float(r['store_blocks_per_run']):.1f}"),
            Cell(str(r["bus"])),
        )
        for r in rule
    )
    headers = ("block", "traffic", "loads", "stores", "both at once", "blocks per run",
               "path")  # fmt: skip
    return [Text("Engine steps by traffic (of this run's ceiling), the path rule's choice."),
            Table(headers, rows)]  # fmt: skip


def _dispatch(records: Records) -> Section | None:
    evidence = records.evidence.get(SERVED_PATH_GATE)
    sites = evidence.figures.get("dispatch_sites") if evidence else None
    if not isinstance(sites, dict) or not {"reference", "engine"} <= set(sites):
        return None
    before, after = int(sites["reference"]), int(sites["engine"])
    section = Section("Dispatch sites, before → after", "dispatch")
    change = f"{(after - before) / before:+.0%}" if before else "—"
    section.blocks.append(
        Table(
            ("served path", "first-party Python dispatch sites per step"),
            (
                (Cell("before: Python reference"), Cell(str(before))),
                (
                    Cell("after: engine of the wheel"),
                    Cell(str(after), "pass" if after < before else "fail"),
                ),
                (Cell("change"), Cell(f"{before} → {after} ({change})")),
            ),
        )
    )
    return section


def _publishing(records: Records) -> Section:
    section = Section("Signed, published, verified", "publish")
    sign, publish, verify = records.sign, records.publish, records.verify
    if sign:
        section.blocks.append(
            Text(
                f"Statement {sign.envelope}: sha256 {sign.envelope_sha256}, "
                f"DSSE over an in-toto v1 Statement (SLSA v1 provenance), key {sign.keyid}."
            )
        )
    if publish:
        section.blocks.append(Text(f"Publish to {publish.index}: {publish.message}"))
        rows = tuple(
            (Cell(f.file, "code"), Cell(f.outcome), Cell(f.sha256, "code")) for f in publish.files
        )
        if rows:
            section.blocks.append(Table(("file", "outcome", "sha256"), rows))
    if verify:
        rows = tuple(
            (
                Cell(c.python),
                Cell(c.wheel, "code"),
                Cell(
                    "✓ matches the statement" if c.digest_ok else "✗ differs",
                    "pass" if c.digest_ok else "fail",
                ),
                Cell(", ".join(c.imported)),
            )
            for c in verify.checks
        )
        section.blocks.append(Text(f"Installed from {verify.index} into fresh venvs:"))
        section.blocks.append(Table(("python", "wheel installed", "digest", "imported"), rows))
    if not (sign or publish or verify):
        section.blocks.append(
            Text("Nothing was signed, published or verified in this run.", "not-run")
        )
    return section


def not_run(manifest: Manifest, channel: str, records: Records) -> list[tuple[str, str]]:
    """(what, why) for everything this run did not do."""
    lines: list[tuple[str, str]] = []
    for skipped in records.build.skipped if records.build else ():
        lines.append((f"wheel for Python {skipped.python}", skipped.reason))
    for name in sorted(set(manifest.gates) | set(records.evidence)):
        evidence = records.evidence.get(name)
        if evidence is None:
            lines.append((f"gate {name}", "no evidence in this run"))
        elif evidence.verdict == "not-run":
            lines.append((f"gate {name}", evidence.reason or "its evidence gives no reason"))
    gate = manifest.gates.get("parity")
    parity = records.evidence.get("parity")
    if gate and gate.cells and parity is not None:
        replayed = set(_parity_cells(parity))
        for cell in gate.cells:
            if cell.name not in replayed:
                lines.append(
                    (f"parity cell {cell.name}", "not replayed (selected out with --cell)")
                )
    if records.gpu_staging is None:
        lines.append(
            ("GPU staging table and plot",
             f"no {GPU_STAGING_RECORD}.json: the staging benchmark runs only on a GPU runner "
             "(`python -m release gpu-gates`), and none ran")
        )  # fmt: skip
    sites = records.evidence.get(SERVED_PATH_GATE)
    if sites is None or not isinstance(sites.figures.get("dispatch_sites"), dict):
        lines.append(
            ("dispatch sites before → after", f"no {SERVED_PATH_GATE} evidence with dispatch_sites")
        )
    blockers = _publish_blockers(manifest, channel, records)
    before = None
    for step in ("sign", "publish", "verify"):
        if getattr(records, step) is not None:
            before = step
        elif before is not None:
            lines.append((step, f"{before} ran; the run stopped or failed before {step}"))
        else:
            lines.append((step, blockers or "the run stopped before this step"))
    for problem in records.unreadable:
        lines.append(("a record", f"unreadable: {problem}"))
    return lines


def _publish_blockers(manifest: Manifest, channel: str, records: Records) -> str:
    """Why the channel refuses to publish, from the evidence; empty when nothing blocks it."""
    requires = manifest.channel(channel).requires
    rows = {row.name: row for row in gate_rows(manifest, channel, records)}
    blockers = []
    for gate in requires:
        row = rows.get(gate)
        verdict = row.verdict if row and row.evidence else "no evidence"
        if verdict != "pass":
            blockers.append(f"{gate}: {verdict}")
    if not blockers:
        return ""
    return f"channel {channel} requires {', '.join(requires)} to pass; " + "; ".join(blockers)


def build_document(out_dir: Path, manifest: Manifest, channel: str) -> Document:
    records = load_records(out_dir)
    sections = [_artefacts(records), _gates(manifest, channel, records)]
    sections += [
        s for s in (_parity(manifest, records), _gpu_staging(records), _dispatch(records)) if s
    ]
    sections.append(_publishing(records))
    missing = Section("Not run, and why", "not-run")
    lines = not_run(manifest, channel, records)
    missing.blocks.append(
        Table(("what", "why"), tuple((Cell(what), Cell(why, "not-run")) for what, why in lines))
        if lines
        else Text("Everything ran.", "pass")
    )
    sections.append(missing)
    verdicts = Counter(e.verdict for e in records.evidence.values())
    published = records.publish is not None
    wheels = len(records.build.wheels) if records.build else 0
    overview = [
        ("wheels", str(wheels), "pass" if wheels else "fail"),
        (
            "gates passed",
            f"{verdicts['pass']} of {len(set(manifest.gates) | set(records.evidence))}",
            "pass" if verdicts["pass"] else "",
        ),
        ("failed", str(verdicts["fail"]), "fail" if verdicts["fail"] else ""),
        (
            "not run",
            str(
                len(set(manifest.gates) | set(records.evidence))
                - verdicts["pass"]
                - verdicts["fail"]
            ),
            "not-run",
        ),
        ("published", "yes" if published else "no", "pass" if published else "not-run"),
        ("verified", "yes" if records.verify else "no", "pass" if records.verify else "not-run"),
    ]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return Document(
        f"Release report: {manifest.release.name} {project_version()}",
        f"channel {channel} · manifest {manifest.path.name} · written {stamp} "
        f"from the records in {out_dir}",
        overview,
        sections,
    )


def _figures(document: Document) -> Iterable[Figure]:
    for section in document.sections:
        yield from (b for b in section.blocks if isinstance(b, Figure))


def write_report(out_dir: Path, manifest: Manifest, channel: str) -> list[Path]:
    """Writes report.md and report.html (and the staging plot, when there is one) into
    `out_dir`; returns their paths."""
    document = build_document(out_dir, manifest, channel)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    plot = out_dir / STAGING_PLOT
    figures = list(_figures(document))
    for figure in figures:
        atomic_write(out_dir / figure.file_name, figure.png)
        written.append(out_dir / figure.file_name)
    if not figures:
        plot.unlink(missing_ok=True)  # an earlier run's plot must not speak for this one
    atomic_write(out_dir / REPORT_MD, markdown.render(document).encode())
    atomic_write(out_dir / REPORT_HTML, html.render(document).encode())
    return [out_dir / REPORT_MD, out_dir / REPORT_HTML, *written]
