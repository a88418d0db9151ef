"""The release summary: artefacts, gates, signed statement, publish and verify, as rich tables.

It reads only the records the steps left under `<out>/`, so it shows what happened, including
the steps that did not run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from release.manifest import Manifest
from release.progress import VERDICT_STYLE, console
from release.report import describe


def _load(out_dir: Path, name: str) -> dict[str, Any] | None:
    path = out_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def install_hint(simple_url: str, project: str) -> str:
    return f"install with: PIP_CONFIG_FILE=/dev/null pip install --index-url {simple_url} {project}"


def _artefacts(build: dict[str, Any]) -> Table:
    table = Table(title="Artefacts", title_justify="left")
    for column in ("wheel", "serves Python", "size", "build", "sha256"):
        table.add_column(column, overflow="fold")
    for wheel in build["wheels"]:
        how = "cached" if wheel["cached"] else f"{wheel['seconds']} s"
        table.add_row(wheel["file"], ", ".join(wheel["serves"]),
                      f"{wheel['size'] / 1e6:.2f} MB", how, wheel["sha256"])  # fmt: skip
    return table


def _gates(out_dir: Path, manifest: Manifest, channel: str) -> Table:
    required = set(manifest.channel(channel).requires)
    table = Table(title=f"Gates (channel {channel})", title_justify="left")
    for column in ("gate", "runner", f"required by {channel}", "verdict", "detail"):
        table.add_column(column, overflow="fold")
    recorded = {path.stem for path in (out_dir / "evidence").glob("*.json")}
    for name in sorted(set(manifest.gates) | recorded):
        gate = manifest.gates.get(name)
        record = _load(out_dir / "evidence", name)
        verdict = record["verdict"] if record else "not-run"
        detail = record["reason"] if record and record["reason"] else ""
        if record is None:
            detail = "no evidence in this run"
        elif name == "policy" and verdict == "pass":
            shown = {w["auditwheel_show"] for w in record["figures"]["wheels"].values()}
            detail = f"auditwheel show: {', '.join(sorted(shown))}; no CUDA library vendored"
        elif name == "parity":
            figures = record["figures"]
            judged = ", ".join(record["artefacts"])
            detail = (f"exact {figures['exact']}, compressed {figures['compressed']} "
                      f"(engine of {judged})") + (f"; {detail}" if detail else "")  # fmt: skip
        elif name == "payload" and verdict == "pass":
            kinds: dict[str, int] = {}
            for entry in record["figures"]["files"]:
                kinds[entry["kind"]] = kinds.get(entry["kind"], 0) + 1
            detail = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
        elif record["figures"]:  # a gate this summary has no words of its own for
            shown = "; ".join(f"{k}: {describe(v)}" for k, v in record["figures"].items())
            detail = shown + (f"; {detail}" if detail else "")
        style = VERDICT_STYLE[verdict]
        runner = gate.runner if gate else "not in the manifest"
        table.add_row(name, runner, "yes" if name in required else "no",
                      f"[{style}]{verdict}[/]", escape(detail))  # fmt: skip
    return table


def print_summary(out_dir: Path, manifest: Manifest, channel: str) -> None:
    console.rule("summary")
    build = _load(out_dir, "build")
    if build:
        console.print(_artefacts(build))
        for skipped in build["skipped"]:
            console.print(f"python {skipped['python']}: no wheel of its own, {skipped['reason']}")
    console.print(_gates(out_dir, manifest, channel))

    sign = _load(out_dir, "sign")
    if sign:
        console.print(
            f"signed statement: {sign['envelope']}\n  sha256 {sign['envelope_sha256']}, "
            f"DSSE over an in-toto v1 Statement (SLSA v1 provenance), key {sign['keyid']}"
        )
        for name, digest in sorted(sign["subjects"].items()):
            console.print(f"  subject {name} sha256 {digest}")
    else:
        console.print("signed statement: not made in this run")

    publish = _load(out_dir, "publish")
    console.print(escape(f"publish: {publish['message']}") if publish else "publish: not run")
    verify = _load(out_dir, "verify")
    if verify:
        for check in verify["checks"]:
            console.print(f"verify: python {check['python']} installed {check['wheel']} "
                          f"from the index; digest matches the statement; imported "
                          f"{', '.join(check['imported'])}")  # fmt: skip
    else:
        console.print("verify: not run")
    if publish:
        console.print(
            "the index lives in the state directory; `nox -s serve` serves it again, "
            f"then {install_hint('http://127.0.0.1:<port>/simple/', manifest.release.name)}"
        )
