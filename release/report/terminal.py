"""The release summary: artefacts, gates, signed statement, publish and verify, as rich tables.

It reads only the records the steps left under `<out>/`, so it shows what happened, including
the steps that did not run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from release.gates.warmup import figure_lines
from release.manifest import Manifest
from release.records import BuildRecord
from release.report.document import built_from, describe
from release.report.loader import GateRow, Records, gate_rows, load_records
from release.trust.index import install_hint
from release.util.progress import VERDICT_STYLE, console


def _artefacts(build: BuildRecord) -> Table:
    table = Table(title="Artefacts", title_justify="left")
    for column in ("wheel", "serves Python", "size", "build", "sha256"):
        table.add_column(column, overflow="fold")
    for wheel in build.wheels:
        how = "cached" if wheel.cached else f"{wheel.seconds} s"
        table.add_row(wheel.file, ", ".join(wheel.serves), f"{wheel.size / 1e6:.2f} MB", how,
                      wheel.sha256)  # fmt: skip
    return table


def _detail(gate: GateRow) -> str:
    """The gate's own words for its evidence: a short line, not every figure."""
    record = gate.evidence
    if record is None:
        return gate.reason
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
        return ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    if figures:  # a gate this summary has no words of its own for
        shown = "; ".join(f"{k}: {describe(v)}" for k, v in figures.items())
        return shown + (f"; {reason}" if reason else "")
    return reason


def _gates(records: Records, manifest: Manifest, channel: str) -> Table:
    table = Table(title=f"Gates (channel {channel})", title_justify="left")
    for column in ("gate", "runner", f"required by {channel}", "verdict", "detail"):
        table.add_column(column, overflow="fold")
    for gate in gate_rows(manifest, channel, records):
        table.add_row(gate.name, gate.runner, "yes" if gate.required else "no",
                      f"[{VERDICT_STYLE[gate.verdict]}]{gate.verdict}[/]",
                      escape(_detail(gate)))  # fmt: skip
    return table


def print_summary(out_dir: Path, manifest: Manifest, channel: str) -> None:
    console.rule("summary")
    records = load_records(out_dir)
    for problem in records.unreadable:
        console.print(f"[red]unreadable record[/]: {escape(problem)}")
    build = records.build
    if build:
        console.print(_artefacts(build))
        for skipped in build.skipped:
            console.print(f"python {skipped.python}: no wheel of its own, {skipped.reason}")
    console.print(_gates(records, manifest, channel))

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
