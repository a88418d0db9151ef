"""The manifest variants and generated workflows the CI tests share (test_ci_workflow,
test_ci_steps, test_ci_replay, test_ci_refusals): each variant is the committed manifest's text
with changes planted in a copy of its folder. The base is the manifest with stable out of the
workflow (`dev_only`); STABLE puts it back with keyids, so the tests do not depend on which keys
the committed manifest pins. tests/conftest.py registers the fixtures."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from release import ci_workflow
from release.manifest import Manifest, load_manifest

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "manifests" / "activekv.toml"


def unpinned(text: str) -> str:
    """The manifest's text without its [release.channels.stable.pinned] table (as before
    `keygen --channel stable DIR --pin`)."""
    pinned = re.compile(r"\[release\.channels\.stable\.pinned\]\n(?:[^\n]+\n)+\n")
    assert len(pinned.findall(text)) == 1, "the manifest's stable pins"
    return pinned.sub("", text)


def dev_only(text: str) -> str:
    """The manifest's text with stable out of the workflow and its keys not pinned."""
    released = 'channels = ["dev", "stable"]\ntag_channel = "stable"\n'
    assert text.count(released) == 1, "the manifest's ci.channels"
    return unpinned(text.replace(released, 'channels = ["dev"]\n'))


def variant_text(*changes: tuple[str, str], text: str | None = None) -> str:
    """The dev-only manifest's text (or `text`) with each (old, new) replaced; each old occurs
    once."""
    text = dev_only(REAL.read_text()) if text is None else text
    for old, new in changes:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def write_variant(tmp_path: Path, text: str) -> Path:
    """A copy of the manifest folder (its public key files too) holding `text`."""
    path = tmp_path / "manifests" / "activekv.toml"
    if not path.parent.exists():
        shutil.copytree(REAL.parent, path.parent)
    path.write_text(text)
    return path


def variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str, *more: tuple[str, str]
) -> Manifest:
    """The dev-only manifest with texts replaced, loaded from a copy."""
    path = write_variant(tmp_path, variant_text((old, new), *more))
    monkeypatch.chdir(tmp_path)
    return load_manifest(path)


_CPU_CELL = '  { name = "'  # a line of gates.parity's cells; gpu_cells' names begin "gpu-"


def fewer_parity_cells(text: str, kept: int) -> str:
    """The manifest's text with only the first `kept` of parity's CPU cells (its GPU cells all
    kept): for a test whose channel does not require parity, whose 29 cells on three wheels are
    over a minute of CI."""
    lines = text.splitlines(keepends=True)
    cells = [line for line in lines
             if line.startswith(_CPU_CELL) and not line.startswith(f"{_CPU_CELL}gpu-")]  # fmt: skip
    assert len(cells) > kept, "the manifest's parity cells"
    return "".join(line for line in lines if line not in cells[kept:])


KEYID = "ab" * 32
# stable released by the workflow: a tag releases it, its keys pinned (keyids: nothing to load).
STABLE = (
    ('channels = ["dev"]\n', 'channels = ["dev", "stable"]\ntag_channel = "stable"\n'),
    ('attestations = ["tests/gpu/evidence"]\n',
     'attestations = ["tests/gpu/evidence"]\npinned = { '
     + ", ".join(f'{use} = ["{KEYID}"]'
                 for use in ("signing", "root", "targets", "snapshot", "timestamp"))
     + " }\n"),
)  # fmt: skip


@pytest.fixture(scope="session")
def committed() -> dict[str, Any]:
    """The workflow the committed manifest writes (test_ci_workflow overrides it with the
    committed file itself, which its drift test requires to be the same)."""
    return ci_workflow.generate(load_manifest(REAL))


@pytest.fixture(scope="session")
def dev_manifest(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    """The manifest with dev alone in the workflow: no GPU job, no key step."""
    return load_manifest(write_variant(tmp_path_factory.mktemp("dev"), variant_text()))


@pytest.fixture(scope="session")
def dev_workflow(dev_manifest: Manifest) -> dict[str, Any]:
    return ci_workflow.generate(dev_manifest)


@pytest.fixture(scope="session")
def stable_ready(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    """The manifest once stable is pinned and in the workflow (its GPU job, its key step)."""
    return load_manifest(write_variant(tmp_path_factory.mktemp("stable"), variant_text(*STABLE)))


@pytest.fixture(scope="session")
def stable_workflow(stable_ready: Manifest) -> dict[str, Any]:
    return ci_workflow.generate(stable_ready)
