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
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from release.evidence import Evidence
from release.records import GPU_STAGING_RECORD, SignRecord
from release.report import html, markdown
from release.report.checked import Checked, ShapeError
from release.report.loader import OTHER_STATEMENT, FolderView, Records, RunView
from release.report.model import Block, Cell, Document, Figure, Section, Table, Text
from release.report.parity_section import parity_not_run, parity_section
from release.report.staging_section import STAGING_PLOT, gpu_staging_section
from release.report.verdict import STALE, GateRow, names
from release.report.words import words
from release.util.atomic import atomic_write
from release.util.pins import project_version

REPORT_MD = "report.md"


REPORT_HTML = "report.html"


SERVED_PATH_GATE = "served-path"


VERDICT_MARK = {"pass": "✓", "fail": "✗", "not-run": "○", STALE: "≠"}


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
    judged = evidence.judged_sdist
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


def _gates(view: RunView) -> Section:
    channel, verdict, built, sdist = view.channel, view.verdict, view.built, view.sdist
    section = Section(f"Gates (channel {channel})", "gates")
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


def _folder_blocks(view: RunView, shown: FolderView) -> list[Block]:
    folder, channel, built = shown.folder, view.channel, view.built
    where = folder_name(folder.path, view.source_dir)
    taken = f"taken by {names(list(folder.channels))}"
    if channel not in folder.channels:
        taken += f", not by {channel} (this report's channel)"
    if not folder.path.is_dir():
        return [Text(f"`{where}` ({taken}): no such folder in this checkout.", "not-run")]
    stale, count = shown.stale, len(folder.attestations)
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
    for group in shown.groups:
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


def _committed(view: RunView) -> Section | None:
    if not view.folders:
        return None
    section = Section("Committed gate attestations", "attestations")
    for folder in view.folders:
        section.blocks += _folder_blocks(view, folder)
    return section


def _dispatch(records: Records) -> Section | None:
    evidence = records.evidence.get(SERVED_PATH_GATE)
    if evidence is None or "dispatch_sites" not in evidence.figures:
        return None
    try:
        sites = Checked(evidence.figures, "figures").entry("dispatch_sites")
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


def not_run(view: RunView) -> list[tuple[str, str]]:
    """(what, why) for everything this run did not do."""
    manifest, records = view.manifest, view.records
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
        lines += parity_not_run(parity, [c.name for c in gate.cells])
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
    blockers = _publish_blockers(view)
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


def _publish_blockers(view: RunView) -> str:
    """Why the channel refuses to publish, from the evidence; empty when nothing blocks it."""
    channel = view.channel
    requires = view.manifest.channel(channel).requires
    rows = {row.name: row for row in view.rows}
    blockers = []
    for gate in requires:
        row = rows.get(gate)
        verdict = row.verdict if row and row.evidence else "no evidence"
        if verdict != "pass":
            blockers.append(f"{gate}: {verdict}")
    if not blockers:
        return ""
    return f"channel {channel} requires {', '.join(requires)} to pass; " + "; ".join(blockers)


def _overview(view: RunView) -> list[tuple[str, str, str]]:
    """The cards: the channel's verdict, then its required gates apart from the others, counted
    from the verdicts the gates tables show (a pass that names other wheels is not this run's
    pass, so it has a card of its own)."""
    channel, verdict, records = view.channel, view.verdict, view.records
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
    if stale := view.stale:
        cards.append(("stale attestations", str(stale), "fail"))
    cards += [
        ("published", "yes" if published else "no", "pass" if published else "not-run"),
        ("verified", "yes" if verified else "no", "pass" if verified else "not-run"),
    ]
    return cards


def build_document(view: RunView) -> Document:
    """The report of one run for its channel (release/report/loader.py's view)."""
    manifest, channel, records, verdict = view.manifest, view.channel, view.records, view.verdict
    sections = [_artefacts(records), _gates(view)]
    sections += [
        s
        for s in (
            _committed(view),
            parity_section(manifest, records),
            gpu_staging_section(records, view.built),
            _dispatch(records),
        )
        if s
    ]
    sections.append(_publishing(records))
    missing = Section("Not run, and why", "not-run")
    lines = not_run(view)
    missing.blocks.append(
        Table(("what", "why"), tuple((Cell(what), Cell(why, "not-run")) for what, why in lines))
        if lines
        else Text("Everything ran.", "pass")
    )
    sections.append(missing)
    overview = _overview(view)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    headline = [Text(verdict.headline, verdict.tone)]
    return Document(
        f"Release report: {manifest.release.name} {project_version()}",
        f"channel {channel} · manifest {manifest.path.name} · written {stamp} "
        f"from the records in {view.out_dir}",
        overview,
        sections,
        headline + ([Text(verdict.others)] if verdict.others else []),
    )


def _figures(document: Document) -> Iterable[Figure]:
    for section in document.sections:
        yield from (b for b in section.blocks if isinstance(b, Figure))


def _render(view: RunView) -> dict[str, bytes]:
    """Every file of the report by name, rendered in memory, so that nothing is written until
    all of them are."""
    document = build_document(view)
    files = {figure.file_name: figure.png for figure in _figures(document)}
    files[REPORT_MD] = markdown.render(document).encode()
    files[REPORT_HTML] = html.render(document).encode()
    return files


def write_report(view: RunView) -> list[Path]:
    """Writes report.md and report.html (and the staging plot, when there is one) into the
    run's `out_dir`; returns their paths. Where that fails, no report is left: an earlier run's
    must not pass for this one's."""
    out_dir = view.out_dir
    report = (out_dir / REPORT_MD, out_dir / REPORT_HTML, out_dir / STAGING_PLOT)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        files = _render(view)
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
