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

import contextlib
import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from release.evidence import Evidence
from release.manifest import Manifest
from release.records import GPU_STAGING_RECORD, SignRecord
from release.report import html, markdown
from release.report.loader import (
    OTHER_STATEMENT,
    STALE,
    Folder,
    GateRow,
    Records,
    attestation_folders,
    attestation_groups,
    gate_rows,
    load_records,
    stale_attestations,
)
from release.report.model import Block, Cell, Document, Figure, Section, Table, Text
from release.report.plot import block_size_label, staging_plot
from release.report.verdict import ChannelVerdict, channel_verdict, names
from release.report.words import words
from release.util.atomic import atomic_write
from release.util.paths import REPO_ROOT
from release.util.pins import project_version
from release.wheelset import judged_sdist

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
STAGING_PLOT = "report-gpu-staging.png"
SERVED_PATH_GATE = "served-path"
VERDICT_MARK = {"pass": "✓", "fail": "✗", "not-run": "○", STALE: "≠"}


# --- figures, described generically (other gates add their own) ---


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def built_from(sign: SignRecord) -> str:
    """What the signed statement says the wheels were built from, in one sentence."""
    if sign.source_commit is None:
        return "Built outside a git checkout: the statement names no source commit."
    if not sign.uncommitted:
        return f"Built from commit {sign.source_commit}, with no uncommitted change to its inputs."
    return (f"Built from commit {sign.source_commit} WITH {len(sign.uncommitted)} uncommitted "
            f"change(s) to wheel inputs (sha256 {sign.uncommitted_sha256}: "
            f"{', '.join(sign.uncommitted[:5])}{' …' if len(sign.uncommitted) > 5 else ''}); the "
            "statement says so, and a rebuild from the commit will differ.")  # fmt: skip


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
        for shown in (describe, _brief):  # in full where it is short, else each value in brief
            text = ", ".join(f"{words(k)} {shown(v)}" for k, v in value.items())
            if len(value) <= 6 and len(text) <= 120:
                return text
        wheels = all(k.endswith(".whl") for k in value)
        keys = ", ".join(k.split("-manylinux")[0] if wheels else words(k) for k in list(value)[:6])
        return f"{len(value)} {'wheels' if wheels else 'entries'}: {keys}{', …' * (len(value) > 6)}"
    return str(value)


def _brief(value: Any) -> str:
    """A value in a word or two, inside a summary of an object too long to show in full."""
    if isinstance(value, str) and len(value) > 24:
        if all(c in "0123456789abcdef" for c in value):
            return f"{value[:12]}…"  # a digest
        return f"…/{value.rsplit('/', 1)[1]}" if "/" in value else f"{value[:21]}…"
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        wheels = all(v.endswith(".whl") for v in value)
        return f"{len(value)} {'wheels' if wheels else 'entries'}"
    if isinstance(value, list | dict) and len(describe(value)) > 24:
        return f"{len(value)} entries"
    return describe(value)


def figure_texts(figures: dict[str, Any]) -> tuple[str, ...]:
    """A gate's figures, one line each: "<key in words>: <value in a few words>"."""
    return tuple(f"{words(key)}: {describe(value)}" for key, value in figures.items())


# --- sections ---


# What the sdist serves: any interpreter, built from source by the installer.
SDIST_SERVES = "any (pip builds it from source)"


def _size(size: int) -> str:
    return f"{size / 1e6:.2f} MB ({size:,} bytes)"


# A toolchain key's last word that says what its value is about the tool named before it.
TOOL_FIELDS = {"path": "path or file", "file": "path or file", "sha256": "sha256"}


def _one_or_lines(values: list[str]) -> Cell:
    return Cell(values[0]) if len(values) == 1 else Cell("", "", tuple(values))


def _code_or_dash(values: list[str] | None) -> Cell:
    return Cell(" ".join(values), "code") if values else Cell("—")


def _toolchain(toolchain: dict[str, str]) -> Table:
    """One row per tool: `zig`, `zig_path`, `zig_sha256`, `zig_target` are one tool's version,
    file, digest and other facts (in words)."""
    tools: dict[str, dict[str, list[str]]] = {}
    for key, value in toolchain.items():
        tool, _, field = key.rpartition("_")
        if not tool or (tool not in toolchain and field not in TOOL_FIELDS):
            tool, field = key, ""  # a tool of its own ("cuda_host_compiler", "ccache")
        column = TOOL_FIELDS.get(field, "version")
        other = column == "version" and field not in ("", "version")  # "target x86_64-…"
        said = f"{words(field)} {value}" if other else value
        tools.setdefault(tool, {}).setdefault(column, []).append(said)
    rows = []
    for tool, fields in tools.items():
        rows.append((
            Cell(words(tool), "name"),
            _one_or_lines(fields.get("version", ["—"])),
            _code_or_dash(fields.get("path or file")),
            _code_or_dash(fields.get("sha256")),
        ))  # fmt: skip
    return Table(("tool", "version", "path or file", "sha256"), tuple(rows))


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
    if build.sdist:
        sdist = build.sdist
        rows.append((Cell(sdist.file, "code"), Cell(SDIST_SERVES), Cell(_size(sdist.size)),
                     Cell(f"built in {sdist.seconds} s"), Cell(sdist.sha256, "code")))  # fmt: skip
    section.blocks.append(Table(("file", "serves Python", "size", "build", "sha256"), tuple(rows)))
    if build.toolchain:
        section.blocks += [Text("Toolchain:"), _toolchain(build.toolchain)]
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


def digest_lines(artefacts: dict[str, str], built: dict[str, str]) -> tuple[str, ...]:
    """Each wheel named with its sha256 (short), marked against the build's."""
    lines = []
    for name, digest in sorted(artefacts.items()):
        if built.get(name) == digest:
            mark = "= built"
        elif name in built:
            mark = "≠ built wheel"
        else:
            mark = "not built here"
        lines.append(f"{name.split('-manylinux')[0]}: {digest[:16]}… {mark}")
    return tuple(lines) or ("none",)


def _judged(evidence: Evidence, built: dict[str, str], sdist: dict[str, str]) -> Cell:
    judged = judged_sdist(evidence.figures)
    also: tuple[str, ...] = ()
    if judged:  # the payload gate's: the sdist, beside the wheels
        ((name, digest),) = judged.items()
        mark = "= built" if judged == sdist else "≠ built sdist" if sdist else "not built here"
        also = (f"and the sdist {name}: {digest[:16]}… {mark}",)
    if built and evidence.artefacts == built:
        said = f"all {len(built)} built wheels (sha256 of each matches)"
        return Cell(said) if not also else Cell("", "", (said, *also))
    return Cell("", "code", (*digest_lines(evidence.artefacts, built), *also))


def _gate_row(gate: GateRow, built: dict[str, str], sdist: dict[str, str]) -> tuple[Cell, ...]:
    tone = "fail" if gate.verdict == STALE else gate.verdict
    head = (Cell(gate.name, "name"), Cell(gate.runner),
            Cell(f"{VERDICT_MARK[gate.verdict]} {gate.verdict}", f"{tone} nowrap"))  # fmt: skip
    evidence = gate.evidence
    if gate.verdict == "not-run" or evidence is None:
        # It judged nothing and ran nowhere: only that it did not run, and why.
        return (*head, Cell(gate.reason or "its evidence gives no reason"), Cell("—"), Cell("—"))
    said = (*figure_texts(evidence.figures), *([gate.reason] if gate.reason else ()))
    judged = _judged(evidence, built, sdist)
    return (*head, Cell("", "", said or ("—",)), judged, Cell(_runner(evidence)))


GATE_HEADERS = ("gate", "runner", "verdict", "figures", "judged", "ran on")


def _gates(verdict: ChannelVerdict, records: Records) -> Section:
    channel = verdict.channel
    section = Section(f"Gates (channel {channel})", "gates")
    built, sdist = records.built_digests(), records.built_sdist()
    section.blocks += [
        Text(f"Required by {channel}: its verdict rests on these.", verdict.tone),
        Table(GATE_HEADERS, tuple(_gate_row(gate, built, sdist) for gate in verdict.required)),
    ]
    if verdict.not_required:
        section.blocks += [
            Text(
                f"Not required by {channel}: shown for what they found; they do not decide "
                f"whether {channel} releases."
            ),
            Table(
                GATE_HEADERS, tuple(_gate_row(gate, built, sdist) for gate in verdict.not_required)
            ),
        ]
    return section


def folder_name(path: Path, source_dir: Path) -> str:
    return str(path.relative_to(source_dir)) if path.is_relative_to(source_dir) else str(path)


def _folder_blocks(folder: Folder, channel: str, records: Records, source_dir: Path) -> list[Block]:
    where = folder_name(folder.path, source_dir)
    taken = f"taken by {names(list(folder.channels))}"
    if channel not in folder.channels:
        taken += f", not by {channel} (this report's channel)"
    if not folder.path.is_dir():
        return [Text(f"`{where}` ({taken}): no such folder in this checkout.", "not-run")]
    built = records.built_digests()
    groups = attestation_groups(folder, built)
    stale = sum(len(g.attestations) for g in groups if g.stale)
    count = len(folder.attestations)
    blocks: list[Block] = [
        Text(
            f"`{where}` ({taken}): {count} signed gate attestation(s), read here without "
            "checking their signatures (publishing checks them); one counts only where it "
            "passed on exactly the wheels being released."
        )
    ]
    if stale:
        blocks.append(Text(f"{stale} of {count} name other wheels than this build's: stale, no "
                           "channel takes them for this release.", "fail"))  # fmt: skip
    rows = []
    for group in groups:
        tone = "not-run" if group.stale is None else "fail" if group.stale else "pass"
        mark = "○" if group.stale is None else "≠" if group.stale else "✓"
        rows.append((
            Cell("", "code", digest_lines(group.artefacts, built)),
            Cell("", "", tuple(_attestation_line(c.path, c.evidence) for c in group.attestations
                               if c.evidence)),
            Cell(f"{mark} {group.status}", tone),
        ))  # fmt: skip
    for committed in folder.attestations:
        if committed.evidence is None:
            said = (Cell(f"○ not taken: {OTHER_STATEMENT}", "not-run")
                    if committed.problem == OTHER_STATEMENT
                    else Cell(f"✗ unreadable: {committed.problem}", "fail"))  # fmt: skip
            rows.append((Cell("—"), Cell(committed.path.name, "code"), said))
    if rows:
        blocks.append(Table(("wheels they name", "attestations", "for this build"), tuple(rows)))
    if folder.other_files:
        blocks.append(Text(f"The folder also holds {folder.other_files} file(s) that are not "
                           "signed attestations (unsigned evidence records, measurements, "
                           "logs): no channel takes them."))  # fmt: skip
    return blocks


def _attestation_line(path: Path, evidence: Evidence | None) -> str:
    if evidence is None:
        return path.name
    on = evidence.runner.get("gpu") or evidence.runner.get("kind", "?")
    return f"{path.name}: {evidence.gate} {evidence.verdict} on {on}, {evidence.time[:10]}"


def _committed(channel: str, records: Records, source_dir: Path) -> Section | None:
    if not records.folders:
        return None
    section = Section("Committed gate attestations", "attestations")
    for folder in records.folders:
        section.blocks += _folder_blocks(folder, channel, records, source_dir)
    return section


def _short_cell_name(name: str, dtype: str) -> str:
    parts = name.split("-", 2)
    return parts[2] if len(parts) == 3 and parts[1] == dtype else name


SELECTED_OUT = "not replayed (selected out with --cell)"
NO_REPLAY = "no replay in the evidence"


@dataclass(frozen=True)
class ParityCell:
    """One cell across every wheel the parity evidence judged."""

    verdict: str  # "bit-identical", "differs", "failed" or "not-run"
    difference: str = ""  # the first difference found, named with its wheel
    missing: tuple[tuple[str, str], ...] = ()  # (wheel, why) for each wheel with no result


def _is_cell_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(c, dict) and isinstance(c.get("cell"), str) for c in value
    )


def _replays(evidence: Evidence) -> dict[str, dict[str, Any]]:
    """Each wheel the parity evidence judged (its artefacts, then any other its figures name),
    with its figures; a wheel without them, or with unreadable ones, gets a status saying so."""
    recorded = evidence.figures.get("wheels")
    recorded = recorded if isinstance(recorded, dict) else {}
    replays: dict[str, dict[str, Any]] = {}
    for wheel in dict.fromkeys([*evidence.artefacts, *recorded]):
        judged = recorded.get(wheel)
        if judged is None:
            replays[wheel] = {"status": NO_REPLAY}
        elif not isinstance(judged, dict) or not _is_cell_list(judged.get("cells", [])):
            replays[wheel] = {"status": "unreadable: expected an object with a list of cells"}
        else:
            replays[wheel] = judged
    return replays


def _cell_result(name: str, replays: dict[str, dict[str, Any]]) -> ParityCell:
    """Bit-identical only where every judged wheel replayed the cell and found no difference: a
    wheel whose replay failed, did not run or left the cell out does not count as identical."""
    difference, missing = "", []
    for wheel, judged in replays.items():
        found = next((c for c in judged.get("cells", []) if c["cell"] == name), None)
        if found is None:
            missing.append((wheel, SELECTED_OUT if judged.get("cells") else
                            str(judged.get("status") or NO_REPLAY)))  # fmt: skip
        elif found.get("difference") and not difference:
            difference = f"{wheel}: {found['difference']}"
    if difference:
        verdict = "differs"
    elif any(why.startswith("fail") for _, why in missing):
        verdict = "failed"
    elif missing or not replays:
        verdict = "not-run"
    else:
        verdict = "bit-identical"
    return ParityCell(verdict, difference, tuple(missing))


def _parity_cells(
    replays: dict[str, dict[str, Any]], declared: Iterable[str]
) -> dict[str, ParityCell]:
    """Each declared or replayed cell across the judged wheels (`_replays`)."""
    replayed = (c["cell"] for judged in replays.values() for c in judged.get("cells", []))
    return {name: _cell_result(name, replays) for name in dict.fromkeys([*declared, *replayed])}


def _replay_text(wheel: str, judged: dict[str, Any]) -> Text:
    status = str(judged.get("status", "?"))
    said = (f"exact {judged['exact']}, compressed {judged['compressed']}"
            if "exact" in judged else status)  # fmt: skip
    python = f" (Python {judged['python']})" if "python" in judged else ""
    tone = "" if judged.get("cells") else "fail" if status.startswith("fail") else "not-run"
    return Text(f"Reference against the engine of {wheel}{python}: {said}.", tone)


PARITY_MARK = {"bit-identical": ("pass", "✓"), "differs": ("fail", "✗"), "failed": ("fail", "✗"),
               "not-run": ("not-run", "○")}  # fmt: skip


def _parity(manifest: Manifest, records: Records) -> Section | None:
    gate = manifest.gates.get("parity")
    evidence = records.evidence.get("parity")
    if gate is None or not gate.cells:
        return None
    section = Section("Parity matrix", "parity")
    replays: dict[str, dict[str, Any]] = {}
    results: dict[str, ParityCell] = {}
    if evidence is not None:
        replays = _replays(evidence)
        results = _parity_cells(replays, (c.name for c in gate.cells))
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
                tone, mark = PARITY_MARK[result.verdict] if result else PARITY_MARK["not-run"]
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
        section.blocks += [_replay_text(w, j) for w, j in replays.items()]
    section.blocks.append(Table(("mode / dtype", *dtypes), tuple(rows), grid=True))
    for name, result in results.items():
        if result.difference:
            section.blocks.append(Text(f"{name}: first difference: {result.difference}", "fail"))
    return section


def _parity_not_run(evidence: Evidence, declared: list[str]) -> list[tuple[str, str]]:
    """A line for each wheel that replayed no cell, and for each cell a wheel left out."""
    replays = _replays(evidence)
    if not replays:
        return [("parity cells", "the parity evidence names no wheel")]
    lines = [(f"parity on {wheel}", str(judged.get("status") or NO_REPLAY))
             for wheel, judged in replays.items() if not judged.get("cells")]  # fmt: skip
    for name, result in _parity_cells(replays, declared).items():
        skipped = [wheel for wheel, why in result.missing if why == SELECTED_OUT]
        if name in declared and skipped:
            by = "" if len(skipped) == len(replays) else f" by {', '.join(skipped)}"
            lines.append((f"parity cell {name}", SELECTED_OUT + by))
    return lines


class ShapeError(ValueError):
    """A value of a record that is missing or not of the agreed shape, named by its key."""


def _got(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value)


class _Entry:
    """One object of a measurement record, read through checks that raise ShapeError naming
    the key (`rows[2].h2d_gbps`): such records are shown as they are, so nothing else checks."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise ShapeError(f"{where or '<top level>'}: expected an object; got {_got(data)}")
        self.data: dict[str, Any] = data
        self.where = f"{where}." if where else ""

    def get(self, key: str) -> Any:
        if key not in self.data:
            raise ShapeError(f"{self.where}{key}: missing")
        return self.data[key]

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def text(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise ShapeError(f"{self.where}{key}: expected text; got {_got(value)}")
        return value

    def number(self, key: str) -> float:
        value = self.get(key)
        # bool is an int to Python, and JSON's 1e400 reads as infinity.
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise ShapeError(f"{self.where}{key}: expected a number; got {_got(value)}")
        return value

    def whole(self, key: str, least: int) -> int:
        """A count or a size: a whole number of at least `least` (16384.0 is 16384)."""
        value = self.number(key)
        if value < least or value != int(value):
            raise ShapeError(f"{self.where}{key}: expected a whole number >= {least}; got {value}")
        return int(value)

    def entry(self, key: str) -> _Entry:
        return _Entry(self.get(key), f"{self.where}{key}")

    def entries(self, key: str) -> list[_Entry]:
        """The objects listed under `key`; none where it is absent or null."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise ShapeError(f"{self.where}{key}: expected a list of objects; got {_got(value)}")
        return [_Entry(item, f"{self.where}{key}[{i}]") for i, item in enumerate(value)]


def _ceiling(staging: _Entry) -> dict[str, float]:
    """The copy ceiling, GB/s by direction; empty where the record has none (null: the Python
    staging bench writes that when it was given no --ceiling)."""
    if not staging.has("ceiling_gbps"):
        return {}
    ceiling = staging.entry("ceiling_gbps")
    return {direction: ceiling.number(direction) for direction in ceiling.data}


def _rate_row(row: _Entry) -> dict[str, Any]:
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


def _staging_blocks(staging: _Entry, built: dict[str, str]) -> list[Block]:
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


# What a record of an unexpected shape can raise past the checks (matplotlib on odd figures
# included): the module promises such a record is reported, never raised.
SHAPE_ERRORS = (LookupError, TypeError, ValueError, AttributeError, ArithmeticError)


def _gpu_staging(records: Records) -> Section | None:
    if records.gpu_staging is None:
        return None
    try:
        blocks = _staging_blocks(_Entry(records.gpu_staging, ""), records.built_digests())
    except SHAPE_ERRORS as error:
        said = str(error) if isinstance(error, ShapeError) else f"{type(error).__name__}: {error}"
        records.unreadable.append(f"{GPU_STAGING_RECORD}.json: expected the agreed shape; {said}")
        return None
    return Section("GPU staging", "gpu-staging", blocks)


def _gbps(row: _Entry, key: str) -> Cell:
    return Cell(f"{row.number(key):.1f} GB/s")


def _staging_targets(staging: _Entry) -> list[Block]:
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


def _staging_scenarios(staging: _Entry) -> list[Block]:
    """Whole engine steps under the path rule, per block size and traffic (scattered blocks, or
    requests whose chains come back as runs), where the record has them."""
    rule = [r for r in staging.entries("scenarios") if r.text("path") == "auto"]
    if not rule:
        return []

    def rate(row: _Entry, way: str) -> Cell:
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


def _dispatch(records: Records) -> Section | None:
    evidence = records.evidence.get(SERVED_PATH_GATE)
    if evidence is None or "dispatch_sites" not in evidence.figures:
        return None
    try:
        sites = _Entry(evidence.figures, "figures").entry("dispatch_sites")
        before, after = sites.whole("reference", 0), sites.whole("engine", 0)
    except ShapeError as error:
        records.unreadable.append(
            f"evidence/{SERVED_PATH_GATE}.json: expected the agreed shape; {error}"
        )
        return None
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
        section.blocks.append(Text(built_from(sign), "fail" if sign.uncommitted else ""))
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
        lines += _parity_not_run(parity, [c.name for c in gate.cells])
    if records.gpu_staging is None:
        lines.append(
            ("GPU staging table and plot",
             f"no {GPU_STAGING_RECORD}.json: the staging benchmark runs only on a GPU runner "
             "(`python -m release gpu-gates`), and none ran")
        )  # fmt: skip
    sites = records.evidence.get(SERVED_PATH_GATE)
    if sites is None or "dispatch_sites" not in sites.figures:
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


def _overview(verdict: ChannelVerdict, records: Records) -> list[tuple[str, str, str]]:
    """The cards: the channel's verdict, then its required gates apart from the others, counted
    from the verdicts the gates tables show (a pass that names other wheels is not this run's
    pass, so it has a card of its own)."""
    channel = verdict.channel
    wheels = len(records.build.wheels) if records.build else 0
    required = Counter(gate.verdict for gate in verdict.required)
    others = Counter(gate.verdict for gate in verdict.not_required)
    published, verified = records.publish is not None, records.verify is not None
    cards = [
        (channel, "releasable" if verdict.releasable else "refused", verdict.tone),
        ("wheels", str(wheels), "pass" if wheels else "fail"),
        (f"required by {channel} passed", f"{required['pass']} of {len(verdict.required)}",
         verdict.tone),
    ]  # fmt: skip
    if verdict.not_required:
        cards.append(("not required, passed", f"{others['pass']} of {len(verdict.not_required)}",
                      ""))  # fmt: skip
    if stale := required[STALE] + others[STALE]:
        cards.append(("judged other wheels", str(stale), "fail"))
    if stale := stale_attestations(records):
        cards.append(("stale attestations", str(stale), "fail"))
    cards += [
        ("published", "yes" if published else "no", "pass" if published else "not-run"),
        ("verified", "yes" if verified else "no", "pass" if verified else "not-run"),
    ]
    return cards


def build_document(
    out_dir: Path, manifest: Manifest, channel: str, source_dir: Path = REPO_ROOT
) -> Document:
    """The report of the records under `out_dir`, for `channel`; the committed attestations
    are read from the checkout `source_dir`."""
    records = load_records(out_dir, attestation_folders(manifest, source_dir))
    verdict = channel_verdict(manifest, channel, records)
    sections = [_artefacts(records), _gates(verdict, records)]
    sections += [
        s
        for s in (
            _committed(channel, records, source_dir),
            _parity(manifest, records),
            _gpu_staging(records),
            _dispatch(records),
        )
        if s
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
    overview = _overview(verdict, records)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    headline = [Text(verdict.headline, verdict.tone)]
    return Document(
        f"Release report: {manifest.release.name} {project_version()}",
        f"channel {channel} · manifest {manifest.path.name} · written {stamp} "
        f"from the records in {out_dir}",
        overview,
        sections,
        headline + ([Text(verdict.others)] if verdict.others else []),
    )


def _figures(document: Document) -> Iterable[Figure]:
    for section in document.sections:
        yield from (b for b in section.blocks if isinstance(b, Figure))


def _render(out_dir: Path, manifest: Manifest, channel: str, source_dir: Path) -> dict[str, bytes]:
    """Every file of the report by name, rendered in memory, so that nothing is written until
    all of them are."""
    document = build_document(out_dir, manifest, channel, source_dir)
    files = {figure.file_name: figure.png for figure in _figures(document)}
    files[REPORT_MD] = markdown.render(document).encode()
    files[REPORT_HTML] = html.render(document).encode()
    return files


def write_report(
    out_dir: Path, manifest: Manifest, channel: str, source_dir: Path = REPO_ROOT
) -> list[Path]:
    """Writes report.md and report.html (and the staging plot, when there is one) into
    `out_dir`; returns their paths. Where that fails, no report is left: an earlier run's must
    not pass for this one's. The committed attestations are read from the checkout
    `source_dir`."""
    report = (out_dir / REPORT_MD, out_dir / REPORT_HTML, out_dir / STAGING_PLOT)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        files = _render(out_dir, manifest, channel, source_dir)
        for name, data in files.items():
            atomic_write(out_dir / name, data)
    except BaseException:
        for path in report:
            # The failure being raised says more than one of removing what is left.
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        raise
    if STAGING_PLOT not in files:
        report[2].unlink(missing_ok=True)  # an earlier run's plot must not speak for this one
    figures = [out_dir / name for name in files if name not in (REPORT_MD, REPORT_HTML)]
    return [out_dir / REPORT_MD, out_dir / REPORT_HTML, *figures]
