"""The release summary: artefacts, gates, signed statement, publish and verify, as rich tables.

It reads only the records the steps left under `<out>/`, so it shows what happened, including
the steps that did not run.
"""

from __future__ import annotations

from collections import Counter

from rich.markup import escape
from rich.table import Table

from release.evidence import SDIST_FIGURE
from release.gpu import figure_lines
from release.records import BuildRecord
from release.report.document import SDIST_SERVES, built_from, describe, folder_name
from release.report.loader import RunView
from release.report.verdict import ChannelVerdict, GateRow
from release.report.words import words
from release.trust.index import install_hint
from release.util.progress import VERDICT_STYLE, console


def _artefacts(build: BuildRecord) -> Table:
    table = Table(title="Artefacts", title_justify="left")
    for column in ("file", "serves Python", "size", "build", "sha256"):
        table.add_column(column, overflow="fold")
    for wheel in build.wheels:
        how = "cached" if wheel.cached else f"{wheel.seconds} s"
        table.add_row(wheel.file, ", ".join(wheel.serves), f"{wheel.size / 1e6:.2f} MB", how,
                      wheel.sha256)  # fmt: skip
    if build.sdist:
        sdist = build.sdist
        table.add_row(sdist.file, SDIST_SERVES, f"{sdist.size / 1e6:.2f} MB", f"{sdist.seconds} s",
                      sdist.sha256)  # fmt: skip
    return table


def _detail(gate: GateRow) -> str:
    """The gate's own words for its evidence: a short line, not every figure."""
    record = gate.evidence
    if record is None or gate.verdict == "not-run":
        return gate.reason or "its evidence gives no reason"  # it did not run, and why
    figures, reason = record.figures, record.reason
    if gate.name == "policy" and gate.verdict == "pass":
        shown = {w["auditwheel_show"] for w in figures["wheels"].values()}
        return f"auditwheel show: {', '.join(sorted(shown))}; no CUDA library vendored"
    if gate.name in ("parity", "gpu-parity") and figures.get("exact"):
        # Per wheel: "<wheel>: 13 of 13 bit-identical; ..." for exact and compressed cells.
        return (f"exact: {figures['exact']}; compressed: {figures['compressed']}"
                + (f"; {reason}" if reason else ""))  # fmt: skip
    if gate.name == "warmup" and gate.verdict == "pass":
        runner = record.runner.get("gpu", "a GPU")
        return f"on {runner}: " + "; ".join(figure_lines(record))
    if gate.name == "payload" and gate.verdict == "pass":
        kinds = Counter(entry["kind"] for entry in figures["files"])
        said = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
        sdist = figures.get(SDIST_FIGURE)
        if isinstance(sdist, dict):
            said += f"; the sdist: {sdist.get('members')} files, exactly those git lists"
        return said
    if figures:  # a gate this summary has no words of its own for
        shown = "; ".join(f"{words(k)}: {describe(v)}" for k, v in figures.items())
        return shown + (f"; {reason}" if reason else "")
    return reason


def _gates(title: str, gates: tuple[GateRow, ...]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("gate", "runner", "verdict", "detail"):
        table.add_column(column, overflow="fold")
    for gate in gates:
        table.add_row(gate.name, gate.runner, f"[{VERDICT_STYLE[gate.verdict]}]{gate.verdict}[/]",
                      escape(_detail(gate)))  # fmt: skip
    return table


def _print_verdict(verdict: ChannelVerdict) -> None:
    style = "bold green" if verdict.releasable else "bold red"
    console.print(escape(verdict.headline), style=style)
    if verdict.others:
        console.print(escape(verdict.others))


def _print_attestations(view: RunView) -> None:
    """Each committed attestation folder in a line, and its attestations by the wheels they
    name: stale ones (other wheels than this build's) flagged."""
    channel = view.channel
    for shown in view.folders:
        folder = shown.folder
        where = folder_name(folder.path, view.source_dir)
        taken = ", ".join(folder.channels) + ("" if channel in folder.channels else
                                              f"; not {channel}")  # fmt: skip
        console.print(escape(f"committed attestations in {where} (taken by {taken}): "
                             f"{len(folder.attestations)} signed, {folder.other_files} other "
                             "file(s) that no channel takes"))  # fmt: skip
        for group in shown.groups:
            files = ", ".join(c.path.name for c in group.attestations)
            wheels = ", ".join(f"{name.split('-manylinux')[0]} {digest[:12]}"
                               for name, digest in sorted(group.artefacts.items()))  # fmt: skip
            style = "red" if group.stale else "green" if group.stale is False else None
            console.print(escape(f"  {group.status}: {files} (name {wheels})"), style=style)
        for committed in folder.attestations:
            if committed.evidence is None:
                console.print(escape(f"  not taken: {committed.problem}"), style="red")


def print_summary(view: RunView) -> None:
    """The summary of one run for its channel, led by its verdict."""
    console.rule("summary")
    manifest, channel, records, verdict = view.manifest, view.channel, view.records, view.verdict
    _print_verdict(verdict)
    for problem in records.unreadable:
        console.print(f"[red]unreadable record[/]: {escape(problem)}")
    build = records.build
    if build:
        console.print(_artefacts(build))
        for skipped in build.skipped:
            console.print(f"python {skipped.python}: no wheel of its own, {skipped.reason}")
    console.print(_gates(f"Gates required by {channel}", verdict.required))
    if verdict.not_required:
        title = f"Other gates (not required by {channel}: they do not decide its verdict)"
        console.print(_gates(title, verdict.not_required))
    _print_attestations(view)

    sign = records.sign
    if sign:
        console.print(
            f"signed statement: {sign.envelope}\n  sha256 {sign.envelope_sha256}, "
            f"DSSE over an in-toto v1 Statement (SLSA v1 provenance), key {sign.keyid}"
        )
        console.print(escape(f"  {built_from(sign)}"), style="yellow" if sign.uncommitted else None)
        for name, digest in sorted(sign.subjects.items()):
            console.print(f"  subject {name} sha256 {digest}")
    else:
        console.print("signed statement: not made in this run")

    publish = records.publish
    console.print(escape(f"publish: {publish.message}") if publish else "publish: not run")
    verify = records.verify
    if verify:
        for check in verify.checks:
            console.print(f"verify: python {check.python} installed {check.wheel} "
                          f"from the index; digest matches the statement; imported "
                          f"{', '.join(check.imported)}")  # fmt: skip
    else:
        console.print("verify: not run")
    if publish and manifest.publish.embedded:
        console.print(
            "the index lives in the state directory; `nox -s serve` serves it again, "
            f"then {install_hint('http://127.0.0.1:<port>/simple/', manifest.release.name)}"
        )
    elif publish:
        console.print(install_hint(publish.index, manifest.release.name))
