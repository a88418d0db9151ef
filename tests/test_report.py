"""The release report (release/report/document.py): report.md and report.html from the records under
`<out>/`, with and without the records other gates add (GPU staging, served path), and a look at
the HTML in a real headless browser (Debian's chromium)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections import Counter
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from release import cli, records
from release.evidence import Evidence, write_evidence
from release.gpu import NO_GPU_RUNNER
from release.manifest import Manifest, load_manifest
from release.report import document
from release.report.document import (
    REPORT_HTML,
    REPORT_MD,
    STAGING_PLOT,
    describe,
    write_report,
)
from release.report.loader import load_run

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "manifests" / "activekv.toml"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "report"
WHEELS = {
    "3.10": "activekv-0.1.0-cp310-cp310-manylinux_2_28_x86_64.whl",
    "3.11": "activekv-0.1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
    "3.12": "activekv-0.1.0-cp312-abi3-manylinux_2_28_x86_64.whl",
}
FAILING_CELL = "int8-bf16-t8-h2d32-l6-pressure"
SKIPPED_CELL = "fp8-fp32-t32-h2d64-l3"
GPU_RUNNER = {"kind": "gpu", "gpu": "fixture GPU", "driver": "0.0-fixture", "host": "fixture"}


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


ARTEFACTS = {name: digest(name) for name in WHEELS.values()}
STAGED_WHEEL = WHEELS["3.12"]  # the wheel tests/fixtures/report/gpu-staging.json names


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(REAL)


def replay(manifest: Manifest, python: str, *, differs: bool) -> dict[str, Any]:
    """One wheel's parity figures: every declared cell but SKIPPED_CELL replayed, FAILING_CELL
    differing where `differs`."""
    cells = [
        {"cell": c.name, "mode": c.mode, "operations": 30, "events": 120, "seconds": 0.5,
         "verdict": "differs" if differs and c.name == FAILING_CELL else "bit-identical",
         "difference": "operation 7: layer 2: device block 3: byte offset 96"
         if differs and c.name == FAILING_CELL else None}
        for c in manifest.gates["parity"].cells if c.name != SKIPPED_CELL
    ]  # fmt: skip
    return {"status": "fail" if differs else "pass", "python": f"{python}.1", "cells": cells,
            "exact": "13 of 13 bit-identical",
            "compressed": f"{10 if differs else 11} of 11 bit-identical"}  # fmt: skip


def parity_evidence(
    manifest: Manifest, wheels: dict[str, dict[str, Any]], reason: str = ""
) -> Evidence:
    """The parity gate's evidence on the three built wheels, with `wheels` as its figures."""
    summary = {key: "; ".join(f"{n}: {f[key]}" for n, f in wheels.items() if key in f)
               for key in ("exact", "compressed")}  # fmt: skip
    return Evidence("parity", "fail", ARTEFACTS, figures={"wheels": wheels, **summary},
                    reason=reason)  # fmt: skip


def write_records(
    out: Path, manifest: Manifest, *, staging: bool, served_path: bool, published: bool
) -> Path:
    """The records of a dev run, written with the pipeline's own writers."""
    records.write(out, records.BuildRecord(
        started=datetime(2026, 12, 3, 2, 0, tzinfo=timezone.utc),
        finished=datetime(2026, 12, 3, 2, 1, tzinfo=timezone.utc),
        source_date_epoch=1796237208,
        toolchain={"zig": "0.17.1", "nvcc": "13.0"},
        wheels=tuple(
            records.BuiltWheelEntry(
                file=name, python=python,
                serves=("3.12", "3.13") if python == "3.12" else (python,), seconds=20.5,
                cached=python == "3.11", size=716_733 + index, sha256=ARTEFACTS[name])
            for index, (python, name) in enumerate(WHEELS.items())
        ),
        skipped=(records.SkippedEntry(
            python="3.13", reason="served by the stable-ABI wheel built with 3.12"),),
    ))  # fmt: skip
    write_evidence(out, Evidence("policy", "pass", ARTEFACTS, figures={
        "declared": "manylinux_2_28_x86_64", "failures": [],
        "wheels": {n: {"auditwheel_show": "manylinux_2_17_x86_64"} for n in ARTEFACTS},
    }))  # fmt: skip
    write_evidence(out, Evidence("payload", "pass", ARTEFACTS, figures={
        "files": [{"kind": "extension"}] * 6 + [{"kind": "stub"}] * 6,
    }))  # fmt: skip
    abi3 = WHEELS["3.12"]
    write_evidence(out, parity_evidence(manifest, {
        name: replay(manifest, python, differs=name == abi3) for python, name in WHEELS.items()
    }, reason=f"{abi3}: {FAILING_CELL}: operation 7: layer 2: device block 3: "
              "byte offset 96"))  # fmt: skip
    write_evidence(out, Evidence("warmup", "not-run", ARTEFACTS, reason=NO_GPU_RUNNER))
    if served_path:
        write_evidence(out, Evidence("served-path", "pass", ARTEFACTS, figures={
            "dispatch_sites": {"reference": 412, "engine": 3}, "steps": 8,
        }))  # fmt: skip
    if staging:
        shutil.copy(FIXTURES / "gpu-staging.json", out / "gpu-staging.json")
        write_evidence(out, Evidence("gpu-staging", "pass", ARTEFACTS, runner=GPU_RUNNER,
                                     figures={"rows": 12}))  # fmt: skip
    if published:
        envelope = out / "provenance" / "activekv-0.1.0.intoto.json"
        records.write(out, records.SignRecord(
            channel="dev", envelope=str(envelope), envelope_sha256=digest("envelope"),
            keyid=digest("key"), public_key=str(out / "provenance" / "dev-signing-key.pub.json"),
            subjects=ARTEFACTS,
        ))  # fmt: skip
        records.write(out, records.PublishRecord(
            channel="dev", index="http://127.0.0.1:8080/simple/",
            message="uploaded 3 file(s) of activekv 0.1.0",
            files=tuple(records.PublishedFile(file=n, sha256=d, outcome="uploaded")
                        for n, d in ARTEFACTS.items()),
            statement=str(envelope), statement_stored=True,
        ))  # fmt: skip
    return out


class Tables(HTMLParser):
    """The tables of an HTML page: for each, its class and rows of (cell class, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[str, list[list[tuple[str, str]]]]] = []
        self._cell: list[str] | None = None
        self._class = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        css = dict(attrs).get("class") or ""
        if tag == "table":
            self.tables.append((css, []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell, self._class = [], css
        elif tag == "li" and self._cell is not None:
            self._cell.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][1][-1].append((self._class, "".join(self._cell).strip()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def tables_of(html_text: str) -> list[tuple[str, list[list[tuple[str, str]]]]]:
    parser = Tables()
    parser.feed(html_text)
    return parser.tables


def table_with(html_text: str, header: str) -> list[list[tuple[str, str]]]:
    for _, rows in tables_of(html_text):
        if rows and rows[0] and rows[0][0][1] == header:
            return rows
    raise AssertionError(f"no table whose first header is {header!r}")


def gate_tables(html_text: str) -> list[dict[str, list[tuple[str, str]]]]:
    """The gates tables (those the channel requires, then the others): gate name to its row of
    (class, text): gate, runner, verdict, figures, judged, ran on."""
    tables = [rows for _, rows in tables_of(html_text) if rows and rows[0][0][1] == "gate"]
    assert [h for _, h in tables[0][0]] == ["gate", "runner", "verdict", "figures", "judged",
                                             "ran on"]  # fmt: skip
    return [{row[0][1]: row for row in rows[1:]} for rows in tables]


def gate_table(html_text: str) -> dict[str, list[tuple[str, str]]]:
    """Every gate's row, required or not."""
    return {name: row for table in gate_tables(html_text) for name, row in table.items()}


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory, manifest: Manifest) -> tuple[str, str, Path]:
    out = write_records(
        tmp_path_factory.mktemp("full"), manifest, staging=True, served_path=True, published=True
    )
    write_report(load_run(out, manifest, "dev"))
    return (out / REPORT_MD).read_text(), (out / REPORT_HTML).read_text(), out


@pytest.fixture
def bare(tmp_path: Path, manifest: Manifest) -> tuple[str, str, Path]:
    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=False)
    write_report(load_run(out, manifest, "dev"))
    return (out / REPORT_MD).read_text(), (out / REPORT_HTML).read_text(), out


def test_artefacts_have_sizes_and_full_digests(full: tuple[str, str, Path]) -> None:
    md, html_text, _ = full
    rows = table_with(html_text, "file")[1:]
    assert [row[0][1] for row in rows] == list(WHEELS.values())
    for row in rows:
        assert row[4][1] == ARTEFACTS[row[0][1]]
        assert "716,73" in row[2][1] and "MB" in row[2][1]
    for name, sha in ARTEFACTS.items():
        assert f"`{sha}`" in md and name in md
    assert rows[1][3][1] == "from the cache"


def test_every_gate_has_its_verdict_figures_and_judged_digests(
    full: tuple[str, str, Path], manifest: Manifest
) -> None:
    _, html_text, _ = full
    required, others = gate_tables(html_text)
    rows = {**required, **others}
    # Every declared gate, and gates with evidence that the manifest does not declare, once.
    assert set(rows) == {*manifest.gates, "served-path", "gpu-staging"}
    assert len(required) + len(others) == len(rows)
    verdicts = {name: (row[2][0].split()[0], row[2][1]) for name, row in rows.items()}
    assert verdicts["policy"] == ("pass", "✓ pass")
    assert verdicts["parity"] == ("fail", "✗ fail")
    assert verdicts["warmup"] == ("not-run", "○ not-run")
    assert "files: 6 extension, 6 stub" in rows["payload"][3][1]
    assert "each of 3: auditwheel show manylinux_2_17_x86_64" in rows["policy"][3][1]
    assert "dispatch sites: engine 3, reference 412" in rows["served-path"][3][1]
    assert rows["warmup"][3][1] == NO_GPU_RUNNER
    assert rows["gpu-staging"][5][1] == "fixture GPU, driver 0.0-fixture"
    assert rows["policy"][4][1] == "all 3 built wheels (sha256 of each matches)"
    assert rows["parity"][4][1] == "all 3 built wheels (sha256 of each matches)"
    # dev requires policy, payload and casters, in the manifest's order; the rest come after.
    assert list(required) == list(manifest.channel("dev").requires)
    assert "parity" in others and "warmup" in others


def test_evidence_of_another_wheel_is_called_out(tmp_path: Path, manifest: Manifest) -> None:
    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=False)
    planted = dict(ARTEFACTS, **{WHEELS["3.10"]: digest("a different build")})
    write_evidence(out, Evidence("payload", "pass", planted))
    write_report(load_run(out, manifest, "dev"))
    rows = gate_table((out / REPORT_HTML).read_text())
    assert "≠ built wheel" in rows["payload"][4][1]
    assert "≠ built wheel" not in rows["policy"][4][1]
    # Its pass is not this run's: the verdict says so, and the channel's blockers count it.
    assert rows["payload"][2][1] == "≠ other-wheels"
    assert "its pass names other wheels; changed since it was judged: " in rows["payload"][3][1]
    assert "payload: other-wheels" in (out / REPORT_MD).read_text()


def overview(md: str) -> dict[str, str]:
    """The overview cards of report.md: label to value."""
    line = next(line for line in md.splitlines() if " · **wheels** " in line)
    return dict(card.removeprefix("**").split("** ", 1) for card in line.split(" · "))


def test_the_overview_counts_the_verdicts_the_gates_table_shows(
    tmp_path: Path, manifest: Manifest
) -> None:
    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=False)
    planted = dict(ARTEFACTS, **{WHEELS["3.10"]: digest("a different build")})
    write_evidence(out, Evidence("payload", "pass", planted))
    write_report(load_run(out, manifest, "dev"))
    required, others = gate_tables((out / REPORT_HTML).read_text())
    shown = [Counter(r[2][1].split()[1] for r in table.values()) for table in (required, others)]
    assert shown[0]["other-wheels"] == 1 and shown[0]["pass"] >= 1
    # The stale pass is not counted as passed: it has its own card, coloured as a failure; the
    # gates dev does not require are counted apart.
    cards = overview((out / REPORT_MD).read_text())
    assert cards["dev"] == "refused"
    assert cards["required by dev passed"] == f"{shown[0]['pass']} of {len(required)}"
    assert cards["not required, passed"] == f"{shown[1]['pass']} of {len(others)}"
    assert cards["judged other wheels"] == "1"
    assert '<div class="card fail"><div class="value">1</div>' in (out / REPORT_HTML).read_text()


def test_parity_matrix_is_a_grid_of_modes_by_dtypes(
    full: tuple[str, str, Path], manifest: Manifest
) -> None:
    md, html_text, _ = full
    grid = table_with(html_text, "mode / dtype")
    css = [css for css, rows in tables_of(html_text) if rows[0][0][1] == "mode / dtype"]
    assert css == ["grid"]
    assert [h for _, h in grid[0]] == ["mode / dtype", "fp16", "bf16", "fp32"]
    assert [row[0][1] for row in grid[1:]] == ["exact", "int8", "fp8_e4m3"]
    cells = {(row[0][1], dtype): row[i + 1] for row in grid[1:]
             for i, dtype in enumerate(("fp16", "bf16", "fp32"))}  # fmt: skip
    # Every declared cell is in the cell of its (mode, dtype), once.
    for cell in manifest.gates["parity"].cells:
        entries = cells[(cell.mode, cell.dtype)][1].split("\n")
        assert sum(e.strip().endswith(cell.name.split("-", 2)[2]) for e in entries) == 1
    assert cells[("exact", "bf16")] == (
        "pass",
        "✓ t16-h8d64-l4\n✓ t1-h1d8-l1\n✓ t32-h2d128-l2\n✓ t16-h8d64-l4-pressure\n"
        "✓ t16-h8d64-l4-faults\n✓ t16-h2d64-l2-all-quarantined\n✓ t16-h2d64-l2-requests-fragmented",
    )
    assert cells[("int8", "bf16")][0] == "fail"
    assert "✗ t8-h2d32-l6-pressure" in cells[("int8", "bf16")][1]
    assert cells[("fp8_e4m3", "fp32")][0] == "not-run"
    assert "○ t32-h2d64-l3" in cells[("fp8_e4m3", "fp32")][1]
    assert f"{FAILING_CELL}: first difference: {WHEELS['3.12']}: operation 7: layer 2" in md
    assert "| mode / dtype | fp16 | bf16 | fp32 |" in md


@pytest.mark.parametrize(
    ("status", "tone", "mark"),
    [("fail: pip install: no matching distribution", "fail", "✗"),
     ("not run: no Python 3.10 on this runner", "not-run", "○")],
)  # fmt: skip
def test_a_wheel_that_never_replayed_leaves_no_cell_bit_identical(
    tmp_path: Path, manifest: Manifest, status: str, tone: str, mark: str
) -> None:
    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=False)
    # The abi3 wheel replayed every cell identically; 3.10's replay never ran a cell, and 3.11
    # left nothing in the evidence at all.
    abi3, cp310, cp311 = WHEELS["3.12"], WHEELS["3.10"], WHEELS["3.11"]
    write_evidence(out, parity_evidence(manifest, {
        abi3: replay(manifest, "3.12", differs=False), cp310: {"status": status},
    }, reason=f"{cp310}: {status}"))  # fmt: skip
    write_report(load_run(out, manifest, "dev"))
    md, html_text = (out / REPORT_MD).read_text(), (out / REPORT_HTML).read_text()
    grid = table_with(html_text, "mode / dtype")[1:]
    entries = [line for row in grid for css, text in row[1:] for line in text.split("\n")]
    assert entries and not any(line.startswith("✓") for line in entries)
    assert all(css == tone for row in grid for css, text in row[1:] if text != "no cell")
    assert f"{mark} t16-h8d64-l4" in grid[0][2][1]  # exact, bf16
    why = {row[0][1]: row[1][1] for row in table_with(html_text, "what")[1:]}
    assert why[f"parity on {cp310}"] == status
    assert why[f"parity on {cp311}"] == "no replay in the evidence"
    selected_out = f"not replayed (selected out with --cell) by {abi3}"
    assert why[f"parity cell {SKIPPED_CELL}"] == selected_out
    assert f"Reference against the engine of {cp310}: {status}." in md


def test_gpu_staging_table_and_plot_when_present(full: tuple[str, str, Path]) -> None:
    md, html_text, out = full
    table = table_with(html_text, "block")
    methods = ["per-block cudaMemcpyAsync", "cudaMemcpyBatchAsync", "engine"]
    assert [h for _, h in table[0]] == ["block", *methods]
    assert [row[0][1] for row in table[1:]] == ["16 KiB", "64 KiB", "256 KiB", "1 MiB"]
    assert table[1][2][1] == "H2D 23.0 GB/s (42%)\nD2H 22.0 GB/s (40%)"
    assert table[4][3][1] == "H2D 51.0 GB/s (93%)\nD2H 52.0 GB/s (95%)"
    png = (out / STAGING_PLOT).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    assert "data:image/png;base64," in html_text
    assert f"![staging bandwidth by block size]({STAGING_PLOT})" in md
    assert "GPU staging table and plot" not in md


def test_gpu_staging_overlap_and_int8_tables(full: tuple[str, str, Path]) -> None:
    md, html_text, _ = full
    assert "Loads and stores at once (contiguous copy both ways: 101.0 GB/s)." in md
    cells = [[text for _, text in row] for _, rows in tables_of(html_text) for row in rows]
    bulk_row = ["16 KiB", "bulk copy kernel", "86.0 GB/s", "61.0 GB/s", "87.5 GB/s", "18.0 GB/s"]
    assert bulk_row in cells
    # A row without the bulk copy kernel's figure (records of older wheels) shows a dash.
    assert ["1 MiB", "copy engines", "94.0 GB/s", "62.0 GB/s", "—", "95.5 GB/s"] in cells
    assert ["16 KiB", "kernels", "1.83x", "1.81x"] in cells
    # The path rule's rows by traffic; the forced-path rows stay in the record only.
    assert "Engine steps by traffic (of this run's ceiling), the path rule's choice." in md
    requests = ["16 KiB", "requests", "53.6 GB/s (97%)", "53.0 GB/s (96%)", "83.6 GB/s (82%)",
                "11.1 / 101.4", "runs-batched"]  # fmt: skip
    assert requests in cells
    assert ["16 KiB", "random"] == next(row[:2] for row in cells if row[1:2] == ["random"])
    assert not any("65.5 GB/s" in text for row in cells for text in row)


def test_staging_figures_of_another_wheel_are_called_out(
    tmp_path: Path, manifest: Manifest
) -> None:
    out = write_records(tmp_path, manifest, staging=True, served_path=False, published=False)
    ours = json.loads((out / "gpu-staging.json").read_text())
    assert ours["wheel_sha256"] == ARTEFACTS[STAGED_WHEEL]
    write_report(load_run(out, manifest, "dev"))
    assert "not of this run's wheels" not in (out / REPORT_MD).read_text()
    (out / "gpu-staging.json").write_text(json.dumps({**ours, "wheel_sha256": digest("old")}))
    write_report(load_run(out, manifest, "dev"))
    assert f"no built wheel has sha256 {digest('old')}" in (out / REPORT_MD).read_text()


def staging_record(**changes: Any) -> dict[str, Any]:
    """The fixture's staging record, with `changes` to its keys (None removes one)."""
    record = json.loads((FIXTURES / "gpu-staging.json").read_text())
    record.update(changes)
    return record


def bad_row(**changes: Any) -> list[Any]:
    rows = staging_record()["rows"]
    return [{**rows[0], **changes}, *rows[1:]]


@pytest.mark.parametrize(
    ("changes", "said"),
    [({"ceiling_gbps": [55.0]}, "ceiling_gbps: expected an object; got a list"),
     ({"ceiling_gbps": {"h2d": "fast"}}, 'ceiling_gbps.h2d: expected a number; got "fast"'),
     ({"rows": "none"}, "rows: expected a list of objects; got \"none\""),
     ({"rows": []}, "rows: expected at least one measurement; got none"),
     ({"rows": [None]}, "rows[0]: expected an object; got null"),
     ({"rows": bad_row(h2d_gbps=None)}, "rows[0].h2d_gbps: expected a number; got null"),
     ({"rows": bad_row(block_bytes=0)}, "rows[0].block_bytes: expected a whole number >= 1"),
     ({"rows": bad_row(method=7)}, "rows[0].method: expected text; got 7"),
     ({"gpu": None}, "gpu: expected text; got null"),
     ({"overlapped": {"a": 1}}, "overlapped: expected a list of objects; got an object"),
     ({"overlapped": [{"block_bytes": 16384, "bus": "kernels"}]},
      "overlapped[0].engine_both_ways_gbps: missing"),
     ({"scenarios": ["auto"]}, 'scenarios[0]: expected an object; got "auto"'),
     ({"int8_vs_exact": [None]}, "int8_vs_exact[0]: expected an object; got null")],
)  # fmt: skip
def test_a_malformed_staging_record_is_reported_naming_its_key(
    tmp_path: Path, manifest: Manifest, changes: dict[str, Any], said: str
) -> None:
    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=False)
    (out / "gpu-staging.json").write_text(json.dumps(staging_record(**changes)))
    write_report(load_run(out, manifest, "dev"))
    md = (out / REPORT_MD).read_text()
    assert f"gpu-staging.json: expected the agreed shape; {said}" in md
    assert "## GPU staging" not in md and not (out / STAGING_PLOT).exists()


def test_an_infinite_block_size_is_reported_not_raised(tmp_path: Path, manifest: Manifest) -> None:
    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=False)
    text = json.dumps(staging_record(int8_vs_exact=[{"block_bytes": 12345}]))
    (out / "gpu-staging.json").write_text(text.replace("12345", "1e400"))  # JSON reads it as inf
    write_report(load_run(out, manifest, "dev"))
    said = "int8_vs_exact[0].block_bytes: expected a number; got Infinity"
    assert said in (out / REPORT_MD).read_text()


def test_a_staging_record_without_a_ceiling_is_shown_without_shares(
    tmp_path: Path, manifest: Manifest
) -> None:
    # What the Python staging bench writes when it is given no --ceiling.
    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=False)
    (out / "gpu-staging.json").write_text(json.dumps(staging_record(ceiling_gbps=None)))
    write_report(load_run(out, manifest, "dev"))
    md, html_text = (out / REPORT_MD).read_text(), (out / REPORT_HTML).read_text()
    assert "no copy ceiling in the record." in md and "unreadable" not in md
    assert table_with(html_text, "block")[1][2][1] == "H2D 23.0 GB/s\nD2H 22.0 GB/s"
    assert (out / STAGING_PLOT).read_bytes().startswith(b"\x89PNG")


def test_dispatch_sites_before_and_after(full: tuple[str, str, Path]) -> None:
    md, html_text, _ = full
    rows = table_with(html_text, "served path")[1:]
    assert rows[0][1][1] == "412" and rows[1][1] == ("pass", "3")
    assert rows[2][1][1] == "412 → 3 (-99%)"
    assert "## Dispatch sites, before → after" in md


@pytest.mark.parametrize(
    ("sites", "said"),
    [({"reference": "many", "engine": 3},
      'dispatch_sites.reference: expected a number; got "many"'),
     ({"reference": 412, "engine": 2.5}, "dispatch_sites.engine: expected a whole number >= 0"),
     ({"reference": 412}, "dispatch_sites.engine: missing"),
     (412, "dispatch_sites: expected an object; got 412")],
)  # fmt: skip
def test_malformed_dispatch_sites_are_reported_not_raised(
    tmp_path: Path, manifest: Manifest, sites: Any, said: str
) -> None:
    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=False)
    write_evidence(out, Evidence("served-path", "pass", ARTEFACTS,
                                 figures={"dispatch_sites": sites}))  # fmt: skip
    write_report(load_run(out, manifest, "dev"))
    md = (out / REPORT_MD).read_text()
    assert f"evidence/served-path.json: expected the agreed shape; figures.{said}" in md
    assert "## Dispatch sites" not in md


def test_absent_records_are_listed_as_not_run_with_reasons(bare: tuple[str, str, Path]) -> None:
    md, html_text, out = bare
    why = {row[0][1]: row[1][1] for row in table_with(html_text, "what")[1:]}
    assert "gpu-staging.json" in why["GPU staging table and plot"]
    assert "served-path" in why["dispatch sites before → after"]
    assert why["gate warmup"] == NO_GPU_RUNNER
    assert why["wheel for Python 3.13"] == "served by the stable-ABI wheel built with 3.12"
    assert why[f"parity cell {SKIPPED_CELL}"].startswith("not replayed")
    # Nothing was signed: one reason (the channel's blockers) for all three steps.
    assert why["sign"] == why["publish"] == why["verify"]
    assert not (out / STAGING_PLOT).exists()
    assert "## GPU staging" not in md and "## Dispatch sites" not in md


def test_a_step_after_the_last_one_that_ran_says_so(full: tuple[str, str, Path]) -> None:
    _, html_text, _ = full
    why = {row[0][1]: row[1][1] for row in table_with(html_text, "what")[1:]}
    assert why["verify"] == "publish ran; the run stopped or failed before verify"
    assert "sign" not in why and "publish" not in why


def test_publish_blockers_name_the_failing_required_gates(
    tmp_path: Path, manifest: Manifest
) -> None:
    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=False)
    write_report(load_run(out, manifest, "stable"))
    why = {r[0][1]: r[1][1] for r in table_with((out / REPORT_HTML).read_text(), "what")[1:]}
    assert "parity: fail" in why["publish"] and "warmup: not-run" in why["publish"]
    assert "policy:" not in why["publish"]


def test_an_unreadable_record_is_reported_not_raised(tmp_path: Path, manifest: Manifest) -> None:
    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=False)
    (out / "evidence" / "payload.json").write_text("{ not json")
    (out / "gpu-staging.json").write_text(json.dumps({"gpu": "x"}))
    write_report(load_run(out, manifest, "dev"))
    md = (out / REPORT_MD).read_text()
    assert "payload.json: evidence record: expected JSON" in md
    assert "gpu-staging.json: expected the agreed shape" in md


def test_a_report_that_fails_leaves_no_earlier_one_in_place(
    tmp_path: Path, manifest: Manifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = write_records(tmp_path, manifest, staging=True, served_path=False, published=False)
    write_report(load_run(out, manifest, "dev"))
    assert (out / REPORT_MD).exists() and (out / STAGING_PLOT).exists()

    def broken(document: Any) -> str:
        raise RuntimeError("the renderer broke")

    # The Markdown renders, the HTML does not: neither file may be left looking current.
    monkeypatch.setattr(document.html, "render", broken)
    with pytest.raises(RuntimeError, match="the renderer broke"):
        write_report(load_run(out, manifest, "dev"))
    left = {p.name for p in out.iterdir()}
    assert not left & {REPORT_MD, REPORT_HTML, STAGING_PLOT}
    assert not [name for name in left if name.endswith(".tmp")]


def test_describe_summarises_any_figures() -> None:
    assert describe({"reference": 3, "engine": 1}) == "reference 3, engine 1"
    assert describe([{"verdict": "ok"}, {"verdict": "ok"}, {"verdict": "bad"}]) == "1 bad, 2 ok"
    assert describe(list(range(10))) == "10 values from 0 to 9"
    assert describe([[1], [2], [3], [4], [5], [6], [7]]) == "7 entries"
    assert describe({"reference": [9, 9], "engine": [1, 1]}) == "reference [9, 9], engine [1, 1]"
    assert describe({"a": {"x": 1}, "b": {"x": 1}}) == "each of 2: x 1"
    assert describe({f"k{i}": i for i in range(7)}) == "7 entries: k0, k1, k2, k3, k4, k5, …"
    assert describe(None) == "—" and describe([]) == "none"


def test_cli_report_writes_both_files(tmp_path: Path, manifest: Manifest) -> None:
    out = write_records(tmp_path / "out", manifest, staging=False, served_path=True,
                        published=True)  # fmt: skip
    assert cli.main(["report", "--out", str(out)]) == 0
    assert "channel dev" in (out / REPORT_MD).read_text()
    assert (out / REPORT_HTML).read_text().startswith("<!DOCTYPE html>")


def test_the_report_shows_the_channel_the_records_were_made_for(
    tmp_path: Path, manifest: Manifest
) -> None:
    out = write_records(tmp_path / "out", manifest, staging=False, served_path=False,
                        published=True)  # fmt: skip
    sign = json.loads((out / "sign.json").read_text())
    (out / "sign.json").write_text(json.dumps({**sign, "channel": "stable"}))
    (out / "publish.json").unlink()
    assert cli.main(["report", "--out", str(out)]) == 0
    html_text = (out / REPORT_HTML).read_text()
    assert "Gates (channel stable)" in html_text
    assert "warmup" in gate_tables(html_text)[0]  # stable requires the GPU warm-up gate


# --- a real browser ---


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(html_path: Path, png: Path, size: str) -> Path:
    browser = chromium()
    if browser is None:
        pytest.skip("Debian's chromium is not installed here (apt-get install -y chromium)")
    result = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={size}", f"--screenshot={png}", html_path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return png


def page_problems(png: Path, size: tuple[int, int]) -> list[str]:
    """Why a screenshot does not show a rendered report; empty when it does."""
    from matplotlib import image

    pixels = image.imread(png)
    problems = []
    if pixels.shape[:2] != (size[1], size[0]):
        problems.append(f"size {pixels.shape[1]}x{pixels.shape[0]}, expected {size[0]}x{size[1]}")
    colours = {tuple(p) for p in pixels[::7, ::7, :3].reshape(-1, 3).round(2).tolist()}
    if len(colours) <= 50:
        problems.append(f"{len(colours)} colours: the page is (nearly) one colour")
    # The verdict colours are on the page: green (pass) and red (fail) cells.
    rgb = pixels[..., :3]
    green = ((rgb[..., 1] > 0.9) & (rgb[..., 0] < 0.9) & (rgb[..., 2] < 0.9)).sum()
    red = ((rgb[..., 0] > 0.95) & (rgb[..., 1] < 0.93) & (rgb[..., 2] < 0.93)).sum()
    if green < 1000 or red < 1000:
        problems.append(f"{green} green and {red} red pixels: no pass and fail cells")
    return problems


@pytest.mark.integration  # headless chromium
def test_report_renders_in_a_headless_browser(full: tuple[str, str, Path]) -> None:
    _, _, out = full
    png = screenshot(out / REPORT_HTML, out / "screenshot.png", "1400,2600")
    assert png.stat().st_size > 50_000
    assert page_problems(png, (1400, 2600)) == []
    if keep := os.environ.get("ACTIVEKV_REPORT_SCREENSHOT"):
        shutil.copy(png, keep)  # for a person to look at


@pytest.mark.integration  # headless chromium
def test_a_blank_page_fails_the_picture_check(tmp_path: Path) -> None:
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body style='background:#f6f8fa'></body></html>")
    png = screenshot(blank, tmp_path / "blank.png", "800,600")
    problems = page_problems(png, (800, 600))
    assert any("one colour" in p for p in problems) and any("no pass" in p for p in problems)


def test_the_terminal_summary_shows_the_same_gates_in_short(
    tmp_path: Path, manifest: Manifest
) -> None:
    from release.report.terminal import print_summary
    from release.util.progress import console

    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=True)
    (out / "verify.json").write_text("{not json")
    with console.capture() as captured:
        print_summary(load_run(out, manifest, "stable"))
    text = captured.get()
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if line.count("│") > 4}
    assert "auditwheel show: manylinux_2_17_x86_64; no CUDA library vendored" in lines["policy"]
    assert "6 extension, 6 stub" in lines["payload"]
    assert "13 of 13 bit-identical" in lines["parity"] and "fail" in lines["parity"]
    assert "not-run" in lines["warmup"] and NO_GPU_RUNNER[:30] in lines["warmup"]
    # declared, required by stable, never run: shown as such, in the table of required gates
    assert "no evidence in this run" in lines["served-path"]
    assert text.index("Gates required by stable") < text.index("│ served-path")
    assert "unreadable record" in text and "verify.json" in text
    assert "publish: uploaded 3 file(s) of activekv 0.1.0" in text


def test_markdown_escapes_html_from_records_and_keeps_code_literal() -> None:
    from release.report.markdown import render
    from release.report.model import Cell, Document, Section, Table, Text

    planted = '<img src=x onerror="alert(1)">'
    document = Document(
        "Report", "run", [("wheels", planted, "")],
        [Section("Gates", "gates", [
            Text(f"reason: {planted}"),
            Table(("wheel", "message"), ((Cell(f"a`b{planted}", "code"), Cell(planted)),)),
        ])],
    )  # fmt: skip
    markdown = render(document)
    assert 'reason: &lt;img src=x onerror="alert(1)">' in markdown
    assert '| &lt;img src=x onerror="alert(1)"> |' in markdown
    # In a code span the text is shown literally: not escaped, fenced past its own backtick.
    assert f"`` a`b{planted} ``" in markdown
    assert markdown.count("<img") == 1  # only inside the code span
