"""Metadata of different versions served together (a mix-and-match) is told apart from a rollback:
with an empty cache nothing was seen before, so an older targets or snapshot file mixed in means
the metadata do not match each other (the snapshot names targets version N, the server serves M).
A rollback, older than what this consumer saw, is still called one. A real embedded index serves
python-tuf metadata written by release.trust.tuf_metadata; the consumer is ngclient's Updater."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures_sign import signed_envelope
from fixtures_wheels import build_wheel

from release.errors import VerifyError
from release.trust.index import EmbeddedIndex
from release.trust.publish import publish
from release.trust.tuf_client import TrustedIndex, mismatch
from release.trust.tuf_metadata import TufRepository

pytestmark = pytest.mark.integration  # a real pypiserver and python-tuf

USER = "activekv-publisher"


@dataclass
class Site:
    index: EmbeddedIndex
    metadata: Path  # the served metadata folder

    def refresh(self, cache: Path) -> None:
        trusted_root = TufRepository(self.index.tuf_dir).trusted_root_path
        TrustedIndex(self.index.tuf_url, trusted_root, cache).refresh()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    """Two releases published: targets and snapshot at versions 2 and 3."""
    state = tmp_path / "state"
    with EmbeddedIndex(state, USER) as index:
        tuf = TufRepository(index.tuf_dir)
        for version in ("0.1.0", "0.2.0"):
            wheel = build_wheel(tmp_path / version, version=version)
            envelope = signed_envelope([wheel], state, tmp_path / f"{version}.intoto.json",
                                       version=version)  # fmt: skip
            publish([wheel], index, envelope=envelope, metadata_dir=index.provenance_dir,
                    tuf=tuf)  # fmt: skip
        yield Site(index, tuf.metadata_dir)


@pytest.mark.parametrize("role", ["targets", "snapshot"])
def test_an_older_file_mixed_in_with_an_empty_cache_is_a_mix_and_match(
    site: Site, tmp_path: Path, role: str
) -> None:
    site.refresh(tmp_path / "control")  # as published, the metadata match
    (site.metadata / f"3.{role}.json").write_bytes((site.metadata / f"2.{role}.json").read_bytes())
    naming = "snapshot" if role == "targets" else "timestamp"
    with pytest.raises(VerifyError) as caught:
        site.refresh(tmp_path / "empty-cache")
    message = str(caught.value)
    assert f"do not match each other: the {naming} names {role} version 3 but the server " \
           f"serves {role} version 2 (mix-and-match refused" in message, message  # fmt: skip
    assert "rollback" not in message and "\n" not in message


def test_a_rollback_after_a_newer_version_was_seen_is_still_a_rollback(
    site: Site, tmp_path: Path
) -> None:
    served = site.metadata / "timestamp.json"
    old = served.read_bytes()
    wheel = build_wheel(tmp_path / "0.3.0", version="0.3.0")
    tuf = TufRepository(site.index.tuf_dir)
    tuf.add_targets({wheel.name: wheel})  # a newer timestamp ...
    site.refresh(tmp_path / "cache")  # ... that this consumer sees
    served.write_bytes(old)
    with pytest.raises(VerifyError, match=r"older than what this consumer has already seen "
                       r"\(rollback refused"):  # fmt: skip
        site.refresh(tmp_path / "cache")


@pytest.mark.parametrize(
    ("message", "said"),
    [
        ("Expected snapshot version 3, got 2", "the timestamp names snapshot version 3"),
        ("Expected targets v3, got v2.", "the snapshot names targets version 3"),
        ("Expected root version 2 instead got version 1", "root version 2 holds root version 1"),
        ("New timestamp version 2 must be >= 3", None),
        ("New snapshot version must be >= 3, got version 2", None),
        ("Expected targets.json version 3, got 2.", None),  # the snapshot seen named a newer one
    ],
)
def test_python_tufs_version_errors_are_told_apart(message: str, said: str | None) -> None:
    found = mismatch(message)
    assert (found is None) if said is None else (found is not None and said in found), found
