"""Verify checks every file the index serves for the version, not only the one pip picks for the
interpreter at hand: three wheels (cp310, cp311, abi3) published to a real embedded index with
TUF, then one the 3.11 consumer never installs is changed, lost, or joined by another file of the
same version (another spelling, a local label) in the index's storage."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures_sign import TAGS, signed_envelope
from fixtures_wheels import build_wheel
from index_servers import StaticServer

from release.errors import VerifyError
from release.trust.index import EmbeddedIndex
from release.trust.publish import publish
from release.trust.served_files import check_served_files
from release.trust.sign import key_paths, load_public_key, read_and_verify_envelope
from release.trust.tuf_metadata import TufRepository
from release.trust.verify import Verification, verify_release
from release.util.digests import sha256_file

pytestmark = pytest.mark.integration  # a real pypiserver, python-tuf and pip

USER = "activekv-publisher"
IMPORTS = ["activekv._probe"]


@dataclass(frozen=True)
class Site:
    index: EmbeddedIndex
    state_dir: Path
    wheels: list[Path]  # cp310, cp311, abi3

    @property
    def signed(self) -> dict[str, str]:
        return {wheel.name: sha256_file(wheel) for wheel in self.wheels}

    def stored(self, wheel: Path) -> Path:
        """The wheel's file in the index's storage."""
        return self.index.packages_dir / wheel.name

    def consumer(self, work: Path, requirement: str = "activekv==0.1.0") -> Verification:
        """`verify --index` as a consumer on this interpreter (3.11: pip picks the cp311 wheel)."""
        return verify_release(
            index_url=self.index.simple_url, requirement=requirement,
            trusted_root=TufRepository(self.index.tuf_dir).trusted_root_path,
            provenance_key=key_paths(self.state_dir, "dev")[1], interpreters=[Path(sys.executable)],
            imports=IMPORTS, workdir=work / "verify", cache_dir=work / "tuf-cache",
        )  # fmt: skip

    def served(self, work: Path) -> dict[str, str]:
        """The file check alone, without TUF: against the stored statement's subjects."""
        key = load_public_key(key_paths(self.state_dir, "dev")[1])
        statement = read_and_verify_envelope(
            self.index.provenance_dir / "activekv-0.1.0.intoto.json", key
        )
        signed = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
        return check_served_files(
            simple_url=self.index.simple_url, project="activekv", version="0.1.0", signed=signed,
            folder=work / "served",
        )  # fmt: skip


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    state = tmp_path / "state"
    wheels = [build_wheel(tmp_path / "dist", tag=tag) for tag in TAGS]
    with EmbeddedIndex(state, USER) as index:
        envelope = signed_envelope(wheels, state, tmp_path / "envelope.json")
        publish(wheels, index, envelope=envelope, metadata_dir=index.provenance_dir,
                tuf=TufRepository(index.tuf_dir))  # fmt: skip
        yield Site(index, state, wheels)


def _not_installed(work: Path) -> bool:
    return not list((work / "verify").glob("py*/venv/lib/python*/site-packages/activekv"))


def test_a_wheel_pip_does_not_pick_here_changed_on_the_index_fails_the_consumers_verify(
    site: Site, tmp_path: Path
) -> None:
    cp310 = site.wheels[0]
    assert sys.version_info[:2] != (3, 10)  # this consumer's pip never picks the cp310 wheel
    # control: as published, every file is checked and the cp311 wheel installs
    verified = site.consumer(tmp_path / "before")
    assert verified.files == site.signed
    assert [check.wheel for check in verified.checks] == [site.wheels[1].name]

    shutil.copyfile(build_wheel(tmp_path / "evil", tag=TAGS[0], salt="evil"), site.stored(cp310))
    with pytest.raises(VerifyError, match=rf"{cp310.name} as served does not match its TUF "
                       r"target.*tampered file"):  # fmt: skip
        site.consumer(tmp_path / "after")
    assert _not_installed(tmp_path / "after")


@pytest.mark.parametrize("requirement", ["activekv==0.1", "ActiveKV==0.1.0.0"])
def test_another_spelling_of_the_published_version_is_that_version(
    site: Site, tmp_path: Path, requirement: str
) -> None:
    """pip and publish take 0.1 for 0.1.0: so does verify (its statement, attestations, files)."""
    verified = site.consumer(tmp_path, requirement)
    assert verified.files == site.signed
    assert [check.wheel for check in verified.checks] == [site.wheels[1].name]


def test_without_tuf_a_changed_wheel_is_refused_by_the_statements_digest(
    site: Site, tmp_path: Path
) -> None:
    cp310 = site.wheels[0]
    assert site.served(tmp_path / "before") == site.signed  # control
    evil = build_wheel(tmp_path / "evil", tag=TAGS[0], salt="evil")
    shutil.copyfile(evil, site.stored(cp310))
    with pytest.raises(VerifyError) as caught:
        site.served(tmp_path / "after")
    assert str(caught.value) == (
        f"{cp310.name} served by {site.index.simple_url} has sha256 {sha256_file(evil)}; "
        f"the signed statement expects {sha256_file(cp310)}"
    )


def test_a_wheel_the_index_lost_fails_the_verify(site: Site, tmp_path: Path) -> None:
    cp310 = site.wheels[0]
    site.stored(cp310).unlink()
    with pytest.raises(VerifyError, match=rf"does not serve {cp310.name}: expected every file the "
                       r"signed statement of activekv 0\.1\.0 names"):  # fmt: skip
        site.consumer(tmp_path)
    assert _not_installed(tmp_path)


@pytest.mark.parametrize("version", ["0.1", "0.1.0+evil", "0.1.0.0"])
def test_another_file_of_the_same_version_fails_the_verify(
    site: Site, tmp_path: Path, version: str
) -> None:
    """pip takes each of these for activekv==0.1.0 (a local label even before 0.1.0 itself)."""
    stray = build_wheel(tmp_path / "stray", version=version)
    shutil.copyfile(stray, site.index.packages_dir / stray.name)
    name = re.escape(stray.name)
    with pytest.raises(VerifyError, match=rf"{name} is not a TUF target .*unknown file"):
        site.consumer(tmp_path)
    with pytest.raises(VerifyError, match=rf"{name} \(sha256 .*as activekv 0\.1\.0, is not in "
                       r"the signed statement"):  # fmt: skip
        site.served(tmp_path)


def test_files_of_other_versions_do_not_count(site: Site, tmp_path: Path) -> None:
    """The control of the test above: files of 0.1.1, 0.2.0 and 0.1.0rc1 lie on the index too,
    and the files of 0.1.0 are still exactly the signed ones."""
    for version in ("0.1.1", "0.2.0", "0.1.0rc1"):
        other = build_wheel(tmp_path / "other", version=version)
        shutil.copyfile(other, site.index.packages_dir / other.name)
    assert site.served(tmp_path) == site.signed


def test_a_statement_naming_a_file_of_another_version_is_refused(
    site: Site, tmp_path: Path
) -> None:
    other = build_wheel(tmp_path / "other", version="0.2.0")
    signed = {**site.signed, other.name: sha256_file(other)}
    with pytest.raises(VerifyError, match=rf"names {other.name}: expected only files of activekv "
                       r"0\.1\.0"):  # fmt: skip
        check_served_files(simple_url=site.index.simple_url, project="activekv", version="0.1.0",
                           signed=signed, folder=tmp_path / "served")  # fmt: skip


def _static_index(folder: Path, links: list[str], wheel: Path) -> None:
    """A PEP 503 index as plain files: the project's page with ``links``, the wheel at two
    places."""
    for place in ("a", "b"):
        (folder / place).mkdir(parents=True)
        shutil.copyfile(wheel, folder / place / wheel.name)
    page = "".join(f'<a href="{link}">{wheel.name}</a>\n' for link in links)
    (folder / "simple" / "activekv").mkdir(parents=True)
    (folder / "simple" / "activekv" / "index.html").write_text(f"<html><body>{page}</body></html>")


def test_a_page_that_lists_a_file_of_the_version_twice_is_refused(tmp_path: Path) -> None:
    """Which of two listings pip would take is pip's choice: refused, naming both; the control
    lists it once, quoted as an index may quote it."""
    wheel = build_wheel(tmp_path / "dist")
    signed = {wheel.name: sha256_file(wheel)}
    once, twice = tmp_path / "once", tmp_path / "twice"
    _static_index(once, [f"../../a/{wheel.name.replace('-', '%2D')}#sha256={'0' * 64}"], wheel)
    _static_index(twice, [f"../../a/{wheel.name}", f"../../b/{wheel.name}"], wheel)
    with StaticServer(once) as server:
        assert (
            check_served_files(
                simple_url=server.url + "simple/",
                project="activekv",
                version="0.1.0",
                signed=signed,
                folder=tmp_path / "w1",
            )
            == signed
        )
    with StaticServer(twice) as server:
        with pytest.raises(VerifyError, match=rf"lists {re.escape(wheel.name)} twice, at "
                           rf"{server.url}a/.* and {server.url}b/"):  # fmt: skip
            check_served_files(
                simple_url=server.url + "simple/",
                project="activekv",
                version="0.1.0",
                signed=signed,
                folder=tmp_path / "w2",
            )
