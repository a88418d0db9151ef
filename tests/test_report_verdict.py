"""The report and the summary lead with the channel's verdict on the gates that channel requires;
a gate that did not run says only that and why; the committed gate attestations are listed by
the wheels they name, stale ones flagged; code spans render as code in the HTML as a Markdown
viewer renders them; the toolchain is a table; figures' keys are words. The HTML is read back
from a real headless browser (Debian's chromium) where the check is about what a person sees."""

from __future__ import annotations

import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from securesystemslib.signer import CryptoSigner
from test_report import (
    ARTEFACTS,
    REAL,
    WHEELS,
    chromium,
    digest,
    gate_tables,
    table_with,
    write_records,
)

from release import records
from release.evidence import Evidence, write_evidence
from release.gpu import NO_GPU_RUNNER
from release.manifest import Manifest, load_manifest
from release.report.document import REPORT_HTML, REPORT_MD, describe, write_report
from release.report.loader import load_run
from release.report.terminal import print_summary
from release.trust.attestation import attest
from release.util.progress import console

GPU = {"kind": "gpu", "gpu": "fixture GPU", "driver": "0.0-fixture", "host": "fixture"}


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(REAL)


def dev_run(out: Path, manifest: Manifest) -> Path:
    """A dev run whose required gates (policy, payload, casters) all passed."""
    write_records(out, manifest, staging=False, served_path=False, published=False)
    write_evidence(out, Evidence("casters", "pass", ARTEFACTS, figures={"wheels": {}}))
    return out


def stable_run(out: Path, manifest: Manifest) -> Path:
    """A stable run on a machine without a GPU: the GPU gates did not run, served-path failed."""
    dev_run(out, manifest)
    write_evidence(out, Evidence("served-path", "fail", ARTEFACTS, reason="step 3: differs"))
    write_evidence(out, Evidence("gpu-parity", "not-run", ARTEFACTS, reason=NO_GPU_RUNNER))
    return out


def report(out: Path, manifest: Manifest, channel: str, source: Path | None = None) -> str:
    if source is None:
        write_report(load_run(out, manifest, channel))
    else:
        write_report(load_run(out, manifest, channel, source))
    return (out / REPORT_MD).read_text()


def summary(out: Path, manifest: Manifest, channel: str, source: Path | None = None) -> str:
    with console.capture() as captured:
        if source is None:
            print_summary(load_run(out, manifest, channel))
        else:
            print_summary(load_run(out, manifest, channel, source))
    return captured.get()


def dom(html_path: Path) -> str:
    """The page as the browser built it (`--dump-dom`)."""
    browser = chromium()
    if browser is None:
        pytest.skip("Debian's chromium is not installed here (apt-get install -y chromium)")
    result = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
         html_path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


class Page(HTMLParser):
    """The text of a page by element: the paragraphs' (class, text) in order, the text of each
    <code>, and the text outside <code> (scripts and styles left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.paragraphs: list[tuple[str, str]] = []
        self.code: list[str] = []
        self.outside_code: list[str] = []
        self.tags: list[str] = []
        self._p: list[str] | None = None
        self._code: list[str] | None = None
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag in ("style", "script", "title"):
            self._skip += 1
        elif tag == "p":
            self._p = []
            self.paragraphs.append((dict(attrs).get("class") or "", ""))
        elif tag == "code":
            self._code = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "script", "title"):
            self._skip -= 1
        elif tag == "p" and self._p is not None:
            self.paragraphs[-1] = (self.paragraphs[-1][0], "".join(self._p))
            self._p = None
        elif tag == "code" and self._code is not None:
            self.code.append("".join(self._code))
            self._code = None

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._p is not None:
            self._p.append(data)
        if self._code is not None:
            self._code.append(data)
        else:
            self.outside_code.append(data)


def page(html_text: str) -> Page:
    parsed = Page()
    parsed.feed(html_text)
    return parsed


# --- 1. the verdict first ---


def test_a_releasable_channel_is_the_reports_first_line(tmp_path: Path, manifest: Manifest) -> None:
    out = dev_run(tmp_path, manifest)
    md = report(out, manifest, "dev")
    headline = ("dev: releasable — every gate dev requires (policy, payload, casters) passed on "
                "all 3 wheels")  # fmt: skip
    # The first thing after the title and its subtitle, in bold; then the other gates, as such.
    lines = [line for line in md.splitlines() if line]
    assert lines[2] == f"**{headline}**"
    assert lines[3].startswith("Not required by dev, so not part of its verdict: ")
    assert "parity failed" in lines[3] and f"warmup did not run ({NO_GPU_RUNNER[9:]})" in lines[3]
    assert "4 of 7 gates passed" not in md and "gates passed" not in md
    cards = lines[4]
    assert cards.startswith("**dev** releasable · **wheels** 3 · **required by dev passed** 3 of 3")


@pytest.mark.integration  # headless chromium
def test_the_browser_shows_the_verdict_before_anything_else(
    tmp_path: Path, manifest: Manifest
) -> None:
    out = stable_run(tmp_path, manifest)
    report(out, manifest, "stable")
    shown = page(dom(out / REPORT_HTML))
    (subtitle, _), (css, headline) = shown.paragraphs[:2]
    assert subtitle == "subtitle" and css == "verdict fail"
    assert headline == (
        "stable: refused — warmup and gpu-parity did not run (no GPU runner); "
        "parity and served-path failed; policy, payload and casters passed"
    )
    # stable requires every gate this run has evidence of: no line of others
    assert not any(text.startswith("Not required by") for _, text in shown.paragraphs)
    # The gates stable requires come first, in their own table; nothing else is in it.
    required, *_ = gate_tables((out / REPORT_HTML).read_text())
    assert list(required) == list(manifest.channel("stable").requires)


def test_the_gates_a_channel_does_not_require_are_shown_as_such(
    tmp_path: Path, manifest: Manifest
) -> None:
    out = dev_run(tmp_path, manifest)
    md = report(out, manifest, "dev")
    required, others = gate_tables((out / REPORT_HTML).read_text())
    assert list(required) == ["policy", "payload", "casters"]
    assert {"parity", "warmup", "gpu-parity", "served-path"} <= set(others)
    text = (
        "Not required by dev: shown for what they found; they do not decide whether dev releases."
    )
    assert md.index("Required by dev: its verdict rests on these.") < md.index(text)


def test_the_summary_leads_with_the_same_verdict(tmp_path: Path, manifest: Manifest) -> None:
    out = stable_run(tmp_path, manifest)
    report(out, manifest, "stable")
    text = summary(out, manifest, "stable")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    assert "summary" in lines[0]
    headline = [line for line in (out / REPORT_MD).read_text().splitlines() if line][2]
    assert " ".join(lines[1:]).startswith(headline.strip("*"))  # rich wraps it at the width
    assert text.index("stable: refused — warmup and gpu-parity did not run (no GPU runner)") < (
        text.index("Artefacts")
    )
    dev = summary(dev_run(tmp_path / "dev", manifest), manifest, "dev")
    assert "dev: releasable — every gate dev requires (policy, payload, casters) passed" in dev
    assert dev.index("Gates required by dev") < dev.index("Other gates (not required by dev")


def test_without_a_build_no_channel_is_releasable(tmp_path: Path, manifest: Manifest) -> None:
    out = dev_run(tmp_path, manifest)
    (out / "build.json").unlink()
    md = report(out, manifest, "dev")
    assert "**dev: refused — no wheel was built (no build record)" in md


def test_a_required_gate_that_judged_other_wheels_refuses_the_channel(
    tmp_path: Path, manifest: Manifest
) -> None:
    out = dev_run(tmp_path, manifest)
    write_evidence(out, Evidence("casters", "pass", {**ARTEFACTS, WHEELS["3.10"]: digest("old")}))
    md = report(out, manifest, "dev")
    assert (
        "**dev: refused — casters judged other wheels than this build's; policy and payload " in md
    )


# --- 2. a gate that did not run ---


def test_a_gate_that_did_not_run_says_only_that_and_why(tmp_path: Path, manifest: Manifest) -> None:
    # warmup's evidence names the built wheels and the CPU runner it was written on: the gate
    # still judged nothing and ran nowhere.
    out = stable_run(tmp_path, manifest)
    report(out, manifest, "stable")
    rows = gate_tables((out / REPORT_HTML).read_text())[0]
    for gate in ("warmup", "gpu-parity"):
        assert [text for _, text in rows[gate][2:]] == ["○ not-run", NO_GPU_RUNNER, "—", "—"]
    assert rows["policy"][4][1] == "all 3 built wheels (sha256 of each matches)"
    lines = {line.split("│")[1].strip(): line for line in summary(out, manifest, "stable")
             .splitlines() if line.count("│") > 4}  # fmt: skip
    assert lines["warmup"].split("│")[4].strip() == NO_GPU_RUNNER


# --- 3. committed attestations ---


def attested(folder: Path, name: str, gate: str, artefacts: dict[str, str], signer) -> Path:
    """A gate attestation signed by `signer`, committed into `folder` as `name`."""
    evidence = Evidence(gate, "pass", artefacts, figures={"n": 1}, runner=GPU,
                        time="2026-12-04T19:55:11+00:00")  # fmt: skip
    made = attest(evidence, signer, folder.parent / "made")
    folder.mkdir(parents=True, exist_ok=True)
    return made.rename(folder / name)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout whose stable attestation folder (tests/gpu/evidence) holds: warmup and
    gpu-parity of an older build, warmup of this build, one altered file and two logs."""
    source = tmp_path / "checkout"
    folder = source / "tests" / "gpu" / "evidence"
    signer = CryptoSigner.generate_ed25519()
    old = {name: digest(f"old {name}") for name in WHEELS.values()}
    attested(folder, "warmup-old.intoto.json", "warmup", old, signer)
    attested(folder, "gpu-parity-old.intoto.json", "gpu-parity", old, signer)
    attested(folder, "warmup-new.intoto.json", "warmup", ARTEFACTS, signer)
    (folder / "broken.intoto.json").write_text("{ not json")
    for log in ("gpu-gates-old.log", "gpu-tests-old.log"):
        (folder / log).write_text("log\n")
    return source


def test_committed_attestations_are_listed_by_the_wheels_they_name(
    tmp_path: Path, manifest: Manifest, checkout: Path
) -> None:
    out = stable_run(tmp_path / "out", manifest)
    md = report(out, manifest, "stable", checkout)
    html_text = (out / REPORT_HTML).read_text()
    assert "## Committed gate attestations" in md
    assert "`tests/gpu/evidence` (taken by stable): 4 signed gate attestation(s)" in md
    assert "2 of 4 name other wheels than this build's: stale" in md
    groups = table_with(html_text, "wheels they name")[1:]
    # This build's group first, then the stale one (both of its files in one row), then the
    # altered file, named with why.
    assert [row[2] for row in groups] == [
        ("pass", "✓ this build's"),
        ("fail", "≠ stale: names other wheels than this build's"),
        ("fail", groups[2][2][1]),
    ]
    assert groups[0][1][1] == "warmup-new.intoto.json: warmup pass on fixture GPU, 2026-12-04"
    assert groups[1][1][1].split("\n") == [
        "gpu-parity-old.intoto.json: gpu-parity pass on fixture GPU, 2026-12-04",
        "warmup-old.intoto.json: warmup pass on fixture GPU, 2026-12-04",
    ]
    assert all("≠ built wheel" in line for line in groups[1][0][1].split("\n"))
    assert groups[2][1][1] == "broken.intoto.json" and "unreadable" in groups[2][2][1]
    assert "also holds 2 file(s) that are not signed attestations" in md
    assert "**stale attestations** 2" in md


def test_a_committed_pass_on_these_wheels_stands_for_the_gate(
    tmp_path: Path, manifest: Manifest, checkout: Path
) -> None:
    # warmup did not run here, but its committed attestation passed on exactly these wheels:
    # publishing takes it (once its signature verifies), so the report says so.
    out = stable_run(tmp_path / "out", manifest)
    report(out, manifest, "stable", checkout)
    rows = gate_tables((out / REPORT_HTML).read_text())[0]
    assert rows["warmup"][2][1] == "✓ pass"
    assert (
        "attested by the committed warmup-new.intoto.json (this run: not-run"
        in rows["warmup"][3][1]
    )
    assert rows["warmup"][5][1] == "fixture GPU, driver 0.0-fixture"
    assert rows["gpu-parity"][2][1] == "○ not-run"  # only a stale one: not taken


def test_the_summary_flags_the_stale_attestations(
    tmp_path: Path, manifest: Manifest, checkout: Path
) -> None:
    out = stable_run(tmp_path / "out", manifest)
    text = summary(out, manifest, "stable", checkout)
    assert (
        "committed attestations in tests/gpu/evidence (taken by stable): 4 signed, 2 other" in text
    )
    stale = next(line for line in text.splitlines() if line.strip().startswith("stale:"))
    assert "gpu-parity-old.intoto.json, warmup-old.intoto.json" in stale
    assert any("this build's: warmup-new.intoto.json" in line for line in text.splitlines())


def test_the_real_committed_attestations_are_flagged_as_stale(
    tmp_path: Path, manifest: Manifest
) -> None:
    # The checkout's own folder: the fixture's wheels are none of those it names.
    folder = REAL.parents[1] / "tests" / "gpu" / "evidence"
    signed = sorted(p.name for p in folder.glob("*.intoto.json"))
    others = [p for p in folder.iterdir() if p.is_file() and not p.name.endswith(".intoto.json")]
    assert signed
    out = stable_run(tmp_path, manifest)
    md = report(out, manifest, "dev")  # dev takes none of them; they are listed still
    assert "`tests/gpu/evidence` (taken by stable, not by dev (this report's channel))" in md
    assert f"{len(signed)} of {len(signed)} name other wheels than this build's: stale" in md
    assert f"also holds {len(others)} file(s) that are not signed attestations" in md
    listed = table_with((out / REPORT_HTML).read_text(), "wheels they name")[1:]
    assert sorted(line.split(":")[0] for row in listed for line in row[1][1].split("\n")) == signed


# --- 4. code spans, the toolchain, keys as words ---

PLANTED = (
    "rebuild with `python -m release build` (see `a<b>` and ``x ` y``); not *bold*, "
    "_nor_ ~~struck~~, [a link](http://example.invalid) or <b>html</b> &amp; a\\`b`"
)


def markdown_viewer(md: str) -> str:
    """report.md as a Markdown viewer renders it (CommonMark with GFM tables and strikethrough)."""
    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(md)


def test_code_spans_are_code_in_the_html_as_in_a_markdown_viewer(
    tmp_path: Path, manifest: Manifest
) -> None:
    out = dev_run(tmp_path, manifest)
    write_evidence(out, Evidence("served-path", "fail", ARTEFACTS, reason=PLANTED))
    md = report(out, manifest, "dev")
    ours, viewer = page((out / REPORT_HTML).read_text()), page(markdown_viewer(md))
    for code in ("python -m release build", "a<b>", "x ` y", "python -m release gpu-gates"):
        assert code in ours.code
    # Every code span the viewer shows is code on the page too (cells that are code as a
    # whole, wheel names and digests, are monospace cells there: td.code).
    code_cells = {text for _, rows in tables_of_html(out) for row in rows
                  for css, text in row if css == "code"}  # fmt: skip
    assert [c for c in viewer.code if c not in ours.code and c not in code_cells] == []
    assert sorted(ours.code) == sorted(c for c in viewer.code if c not in code_cells)
    # The rest of the planted text is shown literally by both: no markup of its own.
    assert not {"em", "strong", "del", "a", "b"} & set(viewer.tags[viewer.tags.index("h2") :])
    # A backslash in a record is a backslash: `b` after it is a code span, as on the page.
    literal = ("; not *bold*, _nor_ ~~struck~~, [a link](http://example.invalid) or <b>html</b> "
               "&amp; a\\")  # fmt: skip
    assert literal in "".join(ours.outside_code) and literal in "".join(viewer.outside_code)
    assert "b" in ours.code and "b" in viewer.code


def tables_of_html(out: Path) -> list[tuple[str, list[list[tuple[str, str]]]]]:
    from test_report import tables_of

    return tables_of((out / REPORT_HTML).read_text())


@pytest.mark.integration  # headless chromium
def test_the_browser_shows_no_backtick_of_markup(tmp_path: Path, manifest: Manifest) -> None:
    out = write_records(tmp_path, manifest, staging=False, served_path=False, published=False)
    report(out, manifest, "dev")  # its not-run list names `python -m release gpu-gates`
    shown = page(dom(out / REPORT_HTML))
    assert "python -m release gpu-gates" in shown.code
    assert [t for t in shown.outside_code if "`" in t] == []


TOOLCHAIN = {
    "zig": "0.17.1", "zig_target": "x86_64-linux-gnu.2.28", "nvcc": "13.0",
    "nvcc_version": "13.0.88", "cuda_host_compiler": "g++ (Debian 12.2.0-14+deb12u1) 12.2.0",
    "ccache": "not used", "zig_path": "/opt/zig/zig", "zig_sha256": digest("zig"),
    "nvcc_path": "/usr/local/cuda-13.0/bin/nvcc", "nvcc_sha256": digest("nvcc"),
    "cudart_static_path": "/usr/local/cuda-13.0/lib/libcudart_static.a",
    "cudart_static_sha256": digest("cudart"), "cuda_host_compiler_path": "/usr/bin/g++-12",
    "cuda_host_compiler_sha256": digest("g++"), "nanobind": "3.1.0",
    "nanobind_file": "nanobind-3.1.0-py3-none-any.whl", "nanobind_sha256": digest("nanobind"),
}  # fmt: skip


def test_the_toolchain_is_a_table_of_tools(tmp_path: Path, manifest: Manifest) -> None:
    out = dev_run(tmp_path, manifest)
    build = records.read(out, records.BuildRecord)
    records.write(out, build.model_copy(update={"toolchain": TOOLCHAIN}))
    md = report(out, manifest, "dev")
    rows = {row[0][1]: [text for _, text in row[1:]]
            for row in table_with((out / REPORT_HTML).read_text(), "tool")[1:]}  # fmt: skip
    assert rows["zig"] == ["0.17.1\ntarget x86_64-linux-gnu.2.28", "/opt/zig/zig", digest("zig")]
    assert rows["nvcc"][0] == "13.0\n13.0.88"
    assert rows["CUDA host compiler"] == ["g++ (Debian 12.2.0-14+deb12u1) 12.2.0",
                                          "/usr/bin/g++-12", digest("g++")]  # fmt: skip
    assert rows["libcudart_static.a"] == ["—", "/usr/local/cuda-13.0/lib/libcudart_static.a",
                                          digest("cudart")]  # fmt: skip
    assert rows["nanobind"][1] == "nanobind-3.1.0-py3-none-any.whl"
    assert rows["ccache"] == ["not used", "—", "—"]
    assert len(rows) == 6 and "zig_path" not in md and "Toolchain: zig" not in md


SHIM = "activekv/vllm/connector_shim.py"


def test_figures_keys_are_words(tmp_path: Path, manifest: Manifest) -> None:
    out = dev_run(tmp_path, manifest)
    figures = {"dispatch_sites": {"reference": 412, "engine": 3},
               "shared_file": {"path": SHIM, "sha256": digest("shim"),
                               "carried_by": sorted(ARTEFACTS)},
               "frames_per_step": {"reference": [9, 9], "engine": [1, 1]},
               "hooks_per_step": [1, 1], "loads_verified": 8, "new_figure_gbps": 1.5}  # fmt: skip
    write_evidence(out, Evidence("served-path", "pass", ARTEFACTS, figures=figures))
    md = report(out, manifest, "dev")
    said = gate_tables((out / REPORT_HTML).read_text())[1]["served-path"][3][1].split("\n")
    shim = f"carried by 3 wheels, path …/connector_shim.py, sha256 {digest('shim')[:12]}…"
    assert said == [  # the record keeps its keys sorted
        "dispatch sites: engine 3, reference 412",
        "Python frames per step: engine [1, 1], reference [9, 9]",
        "hooks per step: [1, 1]",
        "loads verified: 8",
        "new figure (GB/s): 1.5",
        f"shared file: {shim}",
    ]
    assert not re.search(r"\b[a-z]+_[a-z]+(?:_[a-z]+)*:", md)  # no snake_case key, anywhere
    assert "entries" not in " ".join(said)
    parity = gate_tables((out / REPORT_HTML).read_text())[1]["parity"][3][1]
    assert "wheels: 3 wheels: activekv-0.1.0-cp310-cp310, activekv-0.1.0-cp311-cp311, " in parity
    text = summary(out, manifest, "dev")
    assert "│ dispatch sites: engine 3, reference 412; Python frames per step:" in text


def test_words_for_keys() -> None:
    from release.report.words import words

    assert words("decode_step_p99_us") == "decode step p99 (µs)"
    assert words("some_new_key_gbps") == "some new key (GB/s)"
    assert words("gpu_driver") == "GPU driver"
    # Names are not keys: a platform tag, a wheel, a cell, a plain word stay as they are.
    for name in ("manylinux_2_28_x86_64", "activekv-0.1.0-cp312-abi3.whl", "int8-bf16-t8", "rows"):
        assert words(name) == name
    assert describe({"auditwheel_show": "x"}) == "auditwheel show x"
    keys = {f"key_{c}": "v" * 40 for c in "abcdefgh"}
    assert describe(keys) == "8 entries: key a, key b, key c, key d, key e, key f, …"


def test_markdown_escapes_markup_only() -> None:
    """The escaping is for markup in records' text; words, figures and names stay as they are."""
    from release.report.markdown import inline

    assert inline("16 KiB: 53.6 GB/s (97%) [1, 2] a_b manylinux_2_28") == (
        "16 KiB: 53.6 GB/s (97%) [1, 2] a_b manylinux_2_28"
    )
    assert (
        inline("*x* _y_ ~z~ [l](u) `c|d`", cell=True) == "\\*x\\* \\_y\\_ \\~z\\~ [l\\](u) `c\\|d`"
    )
