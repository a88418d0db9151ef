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

import base64
import html
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from release.atomic import atomic_write
from release.errors import ReleaseError
from release.evidence import Evidence, read_evidence
from release.manifest import Manifest
from release.pins import project_version
from release.records import GPU_STAGING_RECORD

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
STAGING_PLOT = "report-gpu-staging.png"
SERVED_PATH_GATE = "served-path"
VERDICT_MARK = {"pass": "✓", "fail": "✗", "not-run": "○"}


# --- the document: what both renderers draw ---


@dataclass(frozen=True)
class Cell:
    text: str
    tone: str = ""  # "pass", "fail", "not-run" colour a cell; "code" sets it in monospace
    lines: tuple[str, ...] = ()  # several entries in one cell (the parity grid)
    line_tones: tuple[str, ...] = ()  # a tone per entry of `lines`, where they differ


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    grid: bool = False  # a matrix: the first column names the row


@dataclass(frozen=True)
class Text:
    text: str
    tone: str = ""


@dataclass(frozen=True)
class Figure:
    png: bytes
    file_name: str
    alt: str


Block = Table | Text | Figure


@dataclass
class Section:
    title: str
    anchor: str
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Document:
    title: str
    subtitle: str
    overview: list[tuple[str, str, str]]  # (label, value, tone)
    sections: list[Section]


# --- the records ---


@dataclass
class Records:
    build: dict[str, Any] | None = None
    evidence: dict[str, Evidence] = field(default_factory=dict)
    gpu_staging: dict[str, Any] | None = None
    sign: dict[str, Any] | None = None
    publish: dict[str, Any] | None = None
    verify: dict[str, Any] | None = None
    unreadable: list[str] = field(default_factory=list)  # problems, as lines


def _load_json(path: Path, records: Records) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        records.unreadable.append(f"{path}: expected a JSON record; {error}")
        return None
    if not isinstance(data, dict):
        records.unreadable.append(f"{path}: expected a JSON object; got {type(data).__name__}")
        return None
    return data


def load_records(out_dir: Path) -> Records:
    records = Records()
    records.build = _load_json(out_dir / "build.json", records)
    records.gpu_staging = _load_json(out_dir / f"{GPU_STAGING_RECORD}.json", records)
    records.sign = _load_json(out_dir / "sign.json", records)
    records.publish = _load_json(out_dir / "publish.json", records)
    records.verify = _load_json(out_dir / "verify.json", records)
    for path in sorted((out_dir / "evidence").glob("*.json")):
        try:
            evidence = read_evidence(out_dir, path.stem)
        except ReleaseError as error:
            records.unreadable.append(str(error))
            continue
        if evidence is not None:
            records.evidence[evidence.gate] = evidence
    return records


def recorded_channel(out_dir: Path, manifest: Manifest) -> str:
    """The channel the records of `out_dir` were made for, else the manifest's default."""
    for name in ("publish", "sign"):
        path = out_dir / f"{name}.json"
        try:
            channel = json.loads(path.read_text()).get("channel")
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        if isinstance(channel, str) and channel in manifest.release.channels:
            return channel
    return manifest.release.default_channel


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


def _artefact_digests(records: Records) -> dict[str, str]:
    if records.build is None:
        return {}
    return {w["file"]: w["sha256"] for w in records.build.get("wheels", [])}


def _artefacts(records: Records) -> Section:
    section = Section("Artefacts", "artefacts")
    build = records.build
    if build is None:
        section.blocks.append(Text("No build record (build.json): no wheel was built.", "fail"))
        return section
    rows = []
    for wheel in build.get("wheels", []):
        how = "from the cache" if wheel.get("cached") else f"built in {wheel.get('seconds')} s"
        rows.append(
            (
                Cell(wheel["file"], "code"),
                Cell(", ".join(wheel.get("serves", []))),
                Cell(_size(int(wheel["size"]))),
                Cell(how),
                Cell(wheel["sha256"], "code"),
            )
        )
    section.blocks.append(Table(("wheel", "serves Python", "size", "build", "sha256"), tuple(rows)))
    toolchain = build.get("toolchain") or {}
    if toolchain:
        section.blocks.append(
            Text("Toolchain: " + ", ".join(f"{k} {v}" for k, v in toolchain.items()))
        )
    if "source_date_epoch" in build:
        epoch = int(build["source_date_epoch"])
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


@dataclass(frozen=True)
class GateRow:
    """One gate as the summary and the report show it: declared, recorded, or both."""

    name: str
    runner: str  # the manifest's runner, or "not in the manifest"
    required: bool  # by the channel
    verdict: str  # the evidence's, or "not-run"
    reason: str  # the evidence's, or why there is none
    evidence: Evidence | None


def gate_rows(manifest: Manifest, channel: str, evidence: dict[str, Evidence]) -> list[GateRow]:
    """Every gate of the manifest and every gate with evidence, by name."""
    required = set(manifest.channel(channel).requires)
    rows = []
    for name in sorted(set(manifest.gates) | set(evidence)):
        declared = manifest.gates.get(name)
        recorded = evidence.get(name)
        rows.append(
            GateRow(
                name=name,
                runner=declared.runner if declared else "not in the manifest",
                required=name in required,
                verdict=recorded.verdict if recorded else "not-run",
                reason=recorded.reason if recorded else "no evidence in this run",
                evidence=recorded,
            )
        )
    return rows


def _gates(manifest: Manifest, channel: str, records: Records) -> Section:
    section = Section(f"Gates (channel {channel})", "gates")
    built = _artefact_digests(records)
    rows = []
    for gate in gate_rows(manifest, channel, records.evidence):
        evidence = gate.evidence
        figures = _figure_text(evidence.figures) if evidence else ()
        rows.append(
            (
                Cell(gate.name, "name"),
                Cell(gate.runner),
                Cell("yes" if gate.required else "no"),
                Cell(f"{VERDICT_MARK[gate.verdict]} {gate.verdict}", f"{gate.verdict} nowrap"),
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


def _parity(manifest: Manifest, records: Records) -> Section | None:
    gate = manifest.gates.get("parity")
    evidence = records.evidence.get("parity")
    if gate is None or not gate.cells:
        return None
    section = Section("Parity matrix", "parity")
    results = {c["cell"]: c for c in (evidence.figures.get("cells", []) if evidence else [])}
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
        judged = ", ".join(evidence.artefacts)
        section.blocks.append(
            Text(
                f"Reference against the engine of {judged}: exact "
                f"{evidence.figures.get('exact', '?')}, compressed "
                f"{evidence.figures.get('compressed', '?')}."
            )
        )
    section.blocks.append(Table(("mode / dtype", *dtypes), tuple(rows), grid=True))
    for result in results.values():
        if result.get("first_difference"):
            section.blocks.append(
                Text(f"{result['cell']}: first difference: {result['first_difference']}", "fail")
            )
    return section


def _block_size(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def staging_plot(staging: dict[str, Any]) -> bytes:
    """GB/s against block size, one line per method and direction, ceilings dotted (PNG)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(9, 5.2), dpi=110)
    methods = list(dict.fromkeys(row["method"] for row in staging["rows"]))
    colours = pyplot.get_cmap("tab10").colors
    for index, method in enumerate(methods):
        rows = sorted(
            (r for r in staging["rows"] if r["method"] == method), key=lambda r: r["block_bytes"]
        )
        sizes = [r["block_bytes"] for r in rows]
        colour = colours[index % len(colours)]
        axes.plot(sizes, [r["h2d_gbps"] for r in rows], "o-", color=colour, label=f"{method} H2D")
        axes.plot(
            sizes,
            [r["d2h_gbps"] for r in rows],
            "s--",
            color=colour,
            label=f"{method} D2H",
            alpha=0.8,
        )
    ceilings: dict[float, list[str]] = {}
    for direction, value in staging.get("ceiling_gbps", {}).items():
        ceilings.setdefault(float(value), []).append(direction.upper())
    for value, directions in ceilings.items():
        axes.axhline(value, color="grey", linestyle=":", linewidth=1)
        axes.annotate(
            f"{'/'.join(directions)} copy ceiling {value:g} GB/s",
            (0.01, value),
            xycoords=("axes fraction", "data"),
            textcoords="offset points",
            xytext=(0, 3),
            fontsize=8,
            color="dimgrey",
        )
    sizes = sorted({r["block_bytes"] for r in staging["rows"]})
    axes.set_xscale("log", base=2)
    axes.set_xticks(sizes, [_block_size(s) for s in sizes])
    axes.set_xlabel("block size")
    axes.set_ylabel("GB/s")
    highest = max([*ceilings, *(max(r["h2d_gbps"], r["d2h_gbps"]) for r in staging["rows"])])
    axes.set_ylim(0, highest * 1.12)
    axes.set_title(f"Staging bandwidth on {staging.get('gpu', '?')}", fontsize=11)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=len(methods))
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    pyplot.close(figure)
    return buffer.getvalue()


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
        built = _artefact_digests(records)
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
            cells = [Cell(_block_size(size))]
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
                Cell(_block_size(int(r["block_bytes"]))),
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
    compressed = staging.get("int8_vs_exact", [])
    if compressed:
        rows = tuple(
            (
                Cell(_block_size(int(r["block_bytes"]))),
                Cell(str(r["bus"])),
                Cell(f"{float(r['int8_over_exact_load']):.2f}x"),
                Cell(f"{float(r['int8_over_exact_store']):.2f}x"),
            )
            for r in compressed
        )
        headers = ("block", "int8 bus", "int8 / exact tokens/s, loads", "stores")
        blocks.append(Table(headers, rows))
    return blocks


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
                f"Statement {sign.get('envelope')}: sha256 {sign.get('envelope_sha256')}, "
                f"DSSE over an in-toto v1 Statement (SLSA v1 provenance), key {sign.get('keyid')}."
            )
        )
    if publish:
        section.blocks.append(Text(f"Publish to {publish.get('index')}: {publish.get('message')}"))
        rows = tuple(
            (Cell(f["file"], "code"), Cell(f["outcome"]), Cell(f["sha256"], "code"))
            for f in publish.get("files", [])
        )
        if rows:
            section.blocks.append(Table(("file", "outcome", "sha256"), rows))
    if verify:
        rows = tuple(
            (
                Cell(str(c["python"])),
                Cell(c["wheel"], "code"),
                Cell(
                    "✓ matches the statement" if c.get("digest_ok") else "✗ differs",
                    "pass" if c.get("digest_ok") else "fail",
                ),
                Cell(", ".join(c.get("imported", []))),
            )
            for c in verify.get("checks", [])
        )
        section.blocks.append(Text(f"Installed from {verify.get('index')} into fresh venvs:"))
        section.blocks.append(Table(("python", "wheel installed", "digest", "imported"), rows))
    if not (sign or publish or verify):
        section.blocks.append(
            Text("Nothing was signed, published or verified in this run.", "not-run")
        )
    return section


def not_run(manifest: Manifest, channel: str, records: Records) -> list[tuple[str, str]]:
    """(what, why) for everything this run did not do."""
    lines: list[tuple[str, str]] = []
    for skipped in (records.build or {}).get("skipped", []):
        lines.append((f"wheel for Python {skipped['python']}", skipped["reason"]))
    for name in sorted(set(manifest.gates) | set(records.evidence)):
        evidence = records.evidence.get(name)
        if evidence is None:
            lines.append((f"gate {name}", "no evidence in this run"))
        elif evidence.verdict == "not-run":
            lines.append((f"gate {name}", evidence.reason or "its evidence gives no reason"))
    gate = manifest.gates.get("parity")
    parity = records.evidence.get("parity")
    if gate and gate.cells and parity is not None:
        replayed = {c.get("cell") for c in parity.figures.get("cells", [])}
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
    blockers = []
    for gate in requires:
        evidence = records.evidence.get(gate)
        verdict = evidence.verdict if evidence else "no evidence"
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
    wheels = len((records.build or {}).get("wheels", []))
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


# --- Markdown ---


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_cell(cell: Cell) -> str:
    parts = [cell.text] if cell.text else []
    parts += list(cell.lines)
    text = "<br>".join(_md_escape(p) for p in parts)
    return f"`{text}`" if cell.tone == "code" and not cell.lines and text else text


def _markdown(document: Document) -> str:
    out = [f"# {document.title}", "", f"_{document.subtitle}_", ""]
    out.append(" · ".join(f"**{label}** {value}" for label, value, _ in document.overview))
    out.append("")
    for section in document.sections:
        out += [f"## {section.title}", ""]
        for block in section.blocks:
            if isinstance(block, Text):
                out += [block.text, ""]
            elif isinstance(block, Figure):
                out += [f"![{block.alt}]({block.file_name})", ""]
            else:
                out.append("| " + " | ".join(_md_escape(h) for h in block.headers) + " |")
                out.append("|" + "---|" * len(block.headers))
                out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
                out.append("")
    return "\n".join(out)


# --- HTML ---

_CSS = """
:root { --pass: #1a7f37; --pass-bg: #dafbe1; --fail: #cf222e; --fail-bg: #ffebe9;
  --skip: #9a6700; --skip-bg: #fff8c5; --line: #d0d7de; --muted: #57606a; }
* { box-sizing: border-box; }
body { font: 14px/1.5 -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif;
  color: #1f2328; margin: 0; background: #f6f8fa; }
main { max-width: 1280px; margin: 0 auto; padding: 24px 32px 48px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 32px 0 10px; padding-bottom: 6px;
  border-bottom: 1px solid var(--line); }
.subtitle { color: var(--muted); margin: 0 0 16px; }
.overview { display: flex; gap: 12px; flex-wrap: wrap; margin: 8px 0 8px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 8px 16px;
  min-width: 120px; }
.card .value { font-size: 22px; font-weight: 600; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase;
  letter-spacing: .04em; }
.card.pass .value { color: var(--pass); } .card.fail .value { color: var(--fail); }
.card.not-run .value { color: var(--skip); }
nav { margin: 8px 0 0; font-size: 13px; } nav a { margin-right: 14px; color: #0969da; }
table { border-collapse: collapse; width: 100%; background: #fff; margin: 6px 0 10px;
  border: 1px solid var(--line); }
th, td { border: 1px solid var(--line); padding: 6px 10px; text-align: left; vertical-align: top; }
th { background: #eaeef2; font-weight: 600; font-size: 13px; }
td.code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace;
  font-size: 12px; overflow-wrap: anywhere; }
td.name { white-space: nowrap; font-weight: 600; } td.nowrap { white-space: nowrap; }
td.pass { background: var(--pass-bg); color: var(--pass); }
td.fail { background: var(--fail-bg); color: var(--fail); }
td.not-run { background: var(--skip-bg); color: var(--skip); }
td ul { margin: 0; padding-left: 16px; } td li { margin: 1px 0; }
table.grid td { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12px; }
table.grid td:first-child { font-family: inherit; font-weight: 600; background: #eaeef2;
  color: inherit; }
table.grid ul { list-style: none; padding-left: 0; }
table.grid td.pass, table.grid td.fail, table.grid td.not-run { color: #1f2328; }
li.pass { color: var(--pass); } li.fail { color: var(--fail); font-weight: 600; }
li.not-run { color: var(--skip); font-weight: 600; }
p.pass { color: var(--pass); } p.fail { color: var(--fail); } p.not-run { color: var(--skip); }
figure { margin: 8px 0; background: #fff; border: 1px solid var(--line); padding: 8px; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: var(--muted); font-size: 12px; text-align: center; }
"""


def _html_cell(cell: Cell, header: bool = False) -> str:
    tag = "th" if header else "td"
    css = f' class="{cell.tone}"' if cell.tone else ""
    body = html.escape(cell.text)
    if cell.lines:
        tones = cell.line_tones or ("",) * len(cell.lines)
        items = "".join(
            f'<li class="{tone}">{html.escape(line)}</li>'
            if tone
            else f"<li>{html.escape(line)}</li>"
            for line, tone in zip(cell.lines, tones, strict=True)
        )
        body += f"<ul>{items}</ul>"
    return f"<{tag}{css}>{body}</{tag}>"


def _html(document: Document) -> str:
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(document.title)}</title>",
        f"<style>{_CSS}</style></head><body><main>",
        f"<h1>{html.escape(document.title)}</h1>",
        f'<p class="subtitle">{html.escape(document.subtitle)}</p>',
        '<div class="overview">',
    ]
    for label, value, tone in document.overview:
        out.append(
            f'<div class="card {tone}"><div class="value">{html.escape(value)}</div>'
            f'<div class="label">{html.escape(label)}</div></div>'
        )
    out.append("</div><nav>")
    out += [f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for s in document.sections]
    out.append("</nav>")
    for section in document.sections:
        out.append(f'<section id="{section.anchor}"><h2>{html.escape(section.title)}</h2>')
        for block in section.blocks:
            if isinstance(block, Text):
                css = f' class="{block.tone}"' if block.tone else ""
                out.append(f"<p{css}>{html.escape(block.text)}</p>")
            elif isinstance(block, Figure):
                data = base64.b64encode(block.png).decode("ascii")
                alt = html.escape(block.alt)
                out.append(
                    f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{alt}</figcaption></figure>"
                )
            else:
                css = ' class="grid"' if block.grid else ""
                out.append(f"<table{css}><thead><tr>")
                out += [_html_cell(Cell(h), header=True) for h in block.headers]
                out.append("</tr></thead><tbody>")
                for row in block.rows:
                    out.append("<tr>" + "".join(_html_cell(c) for c in row) + "</tr>")
                out.append("</tbody></table>")
        out.append("</section>")
    out.append("</main></body></html>")
    return "\n".join(out) + "\n"


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
    atomic_write(out_dir / REPORT_MD, _markdown(document).encode())
    atomic_write(out_dir / REPORT_HTML, _html(document).encode())
    return [out_dir / REPORT_MD, out_dir / REPORT_HTML, *written]
