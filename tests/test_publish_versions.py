"""What one publish is: one public version, however spelled (``0.1`` is ``0.1.0`` to pip, and so
is ``0.1.0+hotfix``), the wheels its statement names and no fewer, and the bytes it checked (a
wheel changed while a publish runs is not what reaches the index). A real pypiserver with
twine uploads and real DSSE envelopes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fixtures_sign import signed_envelope
from fixtures_wheels import build_wheel

from release.errors import PublishError
from release.trust import twine_upload
from release.trust.index import EmbeddedIndex, list_project_files
from release.trust.publish import PAUSE_ENV, PublishReport, publish
from release.trust.release_version import of_version
from release.trust.statement_store import envelope_path_for
from release.util.digests import sha256_file

pytestmark = pytest.mark.integration  # a real pypiserver with htpasswd auth and twine uploads

USER = "activekv-publisher"
MANYLINUX = "py3-none-manylinux_2_17_x86_64"


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def index(state_dir: Path) -> Iterator[EmbeddedIndex]:
    with EmbeddedIndex(state_dir, USER) as running:
        yield running


def _publish(wheels: list[Path], index: EmbeddedIndex, state: Path, out: Path, version: str,
             metadata: str = "metadata") -> PublishReport:  # fmt: skip
    envelope = signed_envelope(wheels, state, out, version=version)
    return publish(wheels, index, envelope=envelope, metadata_dir=state / metadata)


def _listed(index: EmbeddedIndex) -> dict[str, str]:
    return list_project_files(index.simple_url, "activekv")


# ---------------------------------------------------------------------- one version, any spelling


@pytest.mark.parametrize(
    ("filename", "taken"),
    [
        ("activekv-0.1.0-py3-none-any.whl", True),
        ("activekv-0.1-py3-none-any.whl", True),
        ("activekv-0.1.0.0-py3-none-any.whl", True),
        ("activekv-0.1.0+hotfix-py3-none-any.whl", True),
        ("ActiveKV-0.1.0.tar.gz", True),
        ("activekv-0.1.0.tar.bz2", True),
        ("activekv-0.1.1-py3-none-any.whl", False),
        ("activekv-0.1.0rc1-py3-none-any.whl", False),
        ("activekv-0.1.0.post1-py3-none-any.whl", False),
        ("activekv_extra-0.1.0-py3-none-any.whl", False),
        ("activekv-0.1.0-py3-none-any.whl.asc", False),
        ("activekv-not-a-version.tar.gz", False),
    ],
)
def test_the_files_pip_takes_for_a_version(filename: str, taken: bool) -> None:
    assert of_version(filename, "activekv", "0.1.0") is taken


def test_statements_are_stored_under_the_normalised_version(tmp_path: Path) -> None:
    assert envelope_path_for(tmp_path, "ActiveKV", "1.0-RC1").name == "activekv-1.0rc1.intoto.json"


def test_another_spelling_of_a_published_version_is_the_same_version(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    first = build_wheel(tmp_path / "dist")
    _publish([first], index, state_dir, tmp_path / "e1.json", "0.1.0")
    before = _listed(index)
    respelled = build_wheel(tmp_path / "respelled", version="0.1", salt="other bytes")
    with pytest.raises(PublishError) as caught:
        _publish([respelled], index, state_dir, tmp_path / "e2.json", "0.1")
    message = str(caught.value)
    assert "files were fixed by the first publish that started it" in message
    assert str(state_dir / "metadata" / "activekv-0.1.0.intoto.json") in message
    assert f"not in it: {respelled.name}; in it but not given: {first.name}" in message
    assert _listed(index) == before
    assert sorted(p.name for p in (state_dir / "metadata").glob("*.intoto.json")) == [
        "activekv-0.1.0.intoto.json"
    ]
    # the control: another version is another release
    newer = build_wheel(tmp_path / "newer", version="0.2")
    assert _publish([newer], index, state_dir, tmp_path / "e3.json", "0.2").uploaded == (
        newer.name,
    )


@pytest.mark.parametrize("version", ["0.1", "0.1.0+hotfix"])
def test_a_file_of_the_same_version_on_the_index_refuses_a_publish_that_does_not_give_it(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path, version: str
) -> None:
    """Without any stored statement (another publisher's state, or none): the index's own file
    of that version, however spelled, refuses the publish before anything is uploaded."""
    theirs = build_wheel(tmp_path / "theirs", version=version)
    twine_upload.upload(theirs, index.url, index.username, index.password)
    ours = build_wheel(tmp_path / "dist")
    with pytest.raises(PublishError) as caught:
        _publish([ours], index, state_dir, tmp_path / "e.json", "0.1.0")
    assert str(caught.value).startswith(
        "refusing to publish activekv 0.1.0: the index already has files of this version that "
        f"this publish does not give: {theirs.name} (pip takes each for activekv==0.1.0)"
    )
    assert set(_listed(index)) == {theirs.name}
    assert not (state_dir / "metadata").exists()


def test_a_local_version_label_is_refused(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    wheel = build_wheel(tmp_path / "dist", version="0.1.0+hotfix")
    with pytest.raises(PublishError) as caught:
        _publish([wheel], index, state_dir, tmp_path / "e.json", "0.1.0+hotfix")
    assert str(caught.value) == (
        f"{wheel.name}: expected a public version (PEP 440) to publish; got 0.1.0+hotfix, whose "
        "local label +hotfix pip also takes for ==0.1.0"
    )
    assert _listed(index) == {}


# ------------------------------------------------------------------- the statement's wheels


def test_a_statement_naming_more_wheels_than_given_is_refused(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    given = build_wheel(tmp_path / "dist")
    left_out = build_wheel(tmp_path / "dist", tag=MANYLINUX)
    envelope = signed_envelope([given, left_out], state_dir, tmp_path / "e.json")
    with pytest.raises(PublishError) as caught:
        publish([given], index, envelope=envelope, metadata_dir=state_dir / "metadata")
    assert str(caught.value) == (
        f"the envelope to publish ({envelope}) does not cover exactly the files to publish: "
        f"{left_out.name} (not given, statement sha256 {sha256_file(left_out)}). Nothing was "
        "uploaded"
    )
    assert _listed(index) == {} and not (state_dir / "metadata").exists()


# --------------------------------------------------------------------- the bytes it checked


def test_a_wheel_changed_after_it_was_hashed_is_refused(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    wheel = build_wheel(tmp_path / "dist")
    hashed = {wheel.name: sha256_file(wheel)}  # as the build and the gates saw it
    envelope = signed_envelope([wheel], state_dir, tmp_path / "e.json")
    build_wheel(tmp_path / "dist", salt="changed afterwards")  # the same file, other bytes
    with pytest.raises(PublishError) as caught:
        publish([wheel], index, envelope=envelope, metadata_dir=state_dir / "metadata",
                digests=hashed)  # fmt: skip
    assert "expected the bytes hashed before publishing; got other bytes" in str(caught.value)
    assert f"hashed before: sha256 {hashed[wheel.name]}" in str(caught.value)
    assert _listed(index) == {}
    # the control: the bytes that were hashed publish
    build_wheel(tmp_path / "dist")
    report = publish([wheel], index, envelope=envelope, metadata_dir=state_dir / "metadata",
                     digests=hashed)  # fmt: skip
    assert report.uploaded == (wheel.name,)


def test_what_is_uploaded_is_the_copy_that_was_checked(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second wheel's file is rewritten while the publish pauses after its first upload:
    the index still gets the signed bytes (twine uploads the publish's checked copy)."""
    first, second = build_wheel(tmp_path / "dist"), build_wheel(tmp_path / "dist", tag=MANYLINUX)
    signed = {wheel.name: sha256_file(wheel) for wheel in (first, second)}
    envelope = signed_envelope([first, second], state_dir, tmp_path / "e.json")
    monkeypatch.setenv(PAUSE_ENV, "3")
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(publish, [first, second], index, envelope=envelope,
                              metadata_dir=state_dir / "metadata")  # fmt: skip
        deadline = time.monotonic() + 60
        while not (index.packages_dir / first.name).exists():
            assert time.monotonic() < deadline and not running.done(), "no first upload"
            time.sleep(0.05)
        build_wheel(tmp_path / "dist", tag=MANYLINUX, salt="swapped during the publish")
        assert sha256_file(second) != signed[second.name]
        report = running.result(timeout=120)
    assert set(report.uploaded) == set(signed)
    assert _listed(index) == signed
