"""The report's parity section: the matrix of modes by dtypes, each cell the replay's outcome per
wheel, from the parity gates' evidence."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from release.evidence import Evidence
from release.manifest import Manifest
from release.report.loader import (
    Records,
)
from release.report.model import Cell, Section, Table, Text


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


def parity_section(manifest: Manifest, records: Records) -> Section | None:
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


def parity_not_run(evidence: Evidence, declared: list[str]) -> list[tuple[str, str]]:
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
