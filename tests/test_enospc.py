"""A disk that runs out of space while the pipeline writes: each write names its file and the
system's reason in one line and leaves no temporary file behind; a publish whose TUF commit finds
the disk full says what it had done (the wheels are on the index) and which write failed, and
once space is freed the same publish completes the commit and says so.

The full disk is real: a small tmpfs mounted for the test (as root), filled to the last page.
Where mounting is not allowed, the pipeline's writes into that folder go to /dev/full instead,
whose every write the kernel refuses with ENOSPC."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_sign import signed_envelope
from fixtures_wheels import build_wheel

from release.errors import PublishError, WriteError
from release.trust.index import EmbeddedIndex, list_project_files
from release.trust.publish import publish
from release.trust.tuf_metadata import TufRepository
from release.util import atomic
from release.util.atomic import atomic_write

pytestmark = pytest.mark.integration  # a tmpfs, and a real pypiserver with twine uploads

NO_SPACE = os.strerror(errno.ENOSPC)
_FDOPEN = os.fdopen  # the real one: the fallback patches the os module's


class SmallDisk:
    """A folder on a filesystem of its own that :meth:`fill` fills and :meth:`free` frees."""

    def __init__(self, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.folder = folder
        self._monkeypatch = monkeypatch
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
                                 capture_output=True)  # fmt: skip
        self.mounted = mounted.returncode == 0
        self._filler = folder / "filler"
        self._patched = False

    def fill(self) -> None:
        if self.mounted:
            with self._filler.open("ab", buffering=0) as stream:  # no buffer left to flush
                try:
                    while True:
                        stream.write(b"\0" * 4096)
                except OSError as error:
                    assert error.errno == errno.ENOSPC
        else:
            self._monkeypatch.setattr(atomic.os, "fdopen", self._fdopen_full)
            self._patched = True

    def free(self) -> None:
        if self.mounted:
            self._filler.unlink()
        elif self._patched:
            self._monkeypatch.setattr(atomic.os, "fdopen", _FDOPEN)

    def _fdopen_full(self, fd: int, mode: str = "r", *args: object) -> object:
        """A file made in the folder, opened for writing: writes go to /dev/full."""
        if Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(self.folder):
            os.close(fd)
            return open("/dev/full", mode)
        return _FDOPEN(fd, mode, *args)  # type: ignore[call-overload]

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.folder)], check=True)


@pytest.fixture
def small_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SmallDisk]:
    folder = tmp_path / "small-disk"
    folder.mkdir()
    disk = SmallDisk(folder.resolve(), monkeypatch)
    try:
        yield disk
    finally:
        disk.unmount()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*.tmp"))


def test_a_write_on_a_full_disk_names_the_file_and_the_reason_and_leaves_nothing(
    small_disk: SmallDisk,
) -> None:
    path = small_disk.folder / "records" / "publish.json"
    atomic_write(path, b"the earlier record\n")
    small_disk.fill()
    with pytest.raises(WriteError) as refused:
        atomic_write(path, b"x" * 200_000)
    assert str(refused.value) == f"writing {path}: {NO_SPACE}"
    assert path.read_bytes() == b"the earlier record\n"  # unchanged
    assert _leftovers(small_disk.folder) == []


def test_a_write_into_a_file_where_its_folder_should_be_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "records").write_text("a file, not a folder")
    path = tmp_path / "records" / "publish.json"
    with pytest.raises(WriteError, match=rf"^writing {path}: "):
        atomic_write(path, b"{}")


@pytest.fixture
def index(tmp_path: Path) -> Iterator[EmbeddedIndex]:
    with EmbeddedIndex(tmp_path / "state", "activekv-publisher") as running:
        yield running


def _publish(index: EmbeddedIndex, tuf: TufRepository, tmp: Path, version: str):
    wheel = build_wheel(tmp / f"dist-{version}", version=version)
    envelope = signed_envelope([wheel], tmp / "state", tmp / f"{version}.intoto.json", version)
    return wheel, lambda: publish([wheel], index, envelope=envelope,
                                  metadata_dir=index.provenance_dir, tuf=tuf)  # fmt: skip


def test_a_tuf_commit_on_a_full_disk_says_what_was_done_and_a_rerun_completes_it(
    small_disk: SmallDisk, index: EmbeddedIndex, tmp_path: Path
) -> None:
    """The wheels are uploaded, then the TUF metadata cannot be written: one line names the TUF
    commit, the file and the reason, and what the publish had done; the index keeps the wheels,
    TUF the earlier commit. Space freed, the same publish finds the wheels there, completes the
    commit and says it did so (not "nothing uploaded")."""
    tuf = TufRepository(small_disk.folder / "tuf", keys_directory=tmp_path / "tuf-keys")
    _, first = _publish(index, tuf, tmp_path, "0.1.0")
    assert first().tuf.targets_version == 2  # type: ignore[union-attr]
    before = {p.name: p.read_bytes() for p in tuf.metadata_dir.iterdir()}

    wheel, second = _publish(index, TufRepository(tuf.directory, keys_directory=tuf.keys_dir),
                             tmp_path, "0.2.0")  # fmt: skip
    small_disk.fill()
    with pytest.raises(PublishError) as failed:
        second()
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(
        f"TUF commit: writing {tuf.metadata_dir / '3.targets.json'}: {NO_SPACE}; nothing was "
        f"committed ({tuf.metadata_dir / 'timestamp.json'} is as it was)"
    )
    assert f"this publish had uploaded 1 file(s): {wheel.name}; stored its signed statement" in (
        message
    )
    assert "completes the TUF commit" in message
    assert wheel.name in list_project_files(index.simple_url, "activekv")
    assert {p.name: p.read_bytes() for p in tuf.metadata_dir.iterdir()} == before
    assert _leftovers(tuf.directory) == []

    small_disk.free()
    report = _publish(index, TufRepository(tuf.directory, keys_directory=tuf.keys_dir),
                      tmp_path, "0.2.0")[1]()  # fmt: skip
    assert report.message == (
        "activekv 0.2.0: all 1 file(s) were already on the index, identical; completed the TUF "
        "commit: 2 new target(s) (targets version 3, timestamp 3)"
    )
    assert wheel.name in TufRepository(tuf.directory).targets()


def test_a_key_generated_on_a_full_disk_is_one_line_and_leaves_no_partial_key(
    small_disk: SmallDisk,
) -> None:
    from release.errors import SigningError
    from release.trust.sign import key_paths, load_signer

    state = small_disk.folder / "state"
    (state / "keys").mkdir(parents=True)
    small_disk.fill()
    pem, public = key_paths(state, "dev")
    with pytest.raises(SigningError) as refused:
        load_signer("generate", channel="dev", state_dir=state)
    assert str(refused.value) == f"{pem}: cannot write the generated key ({NO_SPACE})"
    assert not pem.exists() and not public.exists()
    small_disk.free()  # space again: a key is generated, not a half-written one loaded
    _, key = load_signer("generate", channel="dev", state_dir=state)
    assert pem.is_file() and public.is_file() and key.keyid
