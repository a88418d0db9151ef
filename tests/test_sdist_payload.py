"""The payload gate's judgement of the sdist (release/gates/payload_sdist.py): the real sdist of
this checkout holds exactly the files git lists, plus PKG-INFO; each planted problem (a tracked
file left out, an ignored file let in, other bytes, a link, a member outside its folder, an
unreproducible stamp, another release's PKG-INFO or file name, a broken archive, no checkout)
fails, naming the member. An unanchored `sdist.exclude` pattern (issue 34's bug) is built for
real and fails naming the first-party files it dropped."""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from release.builder.reproduce import snapshot
from release.builder.sdist import StagedSdist
from release.evidence import SDIST_FIGURE
from release.gates.payload import run_payload_gate
from release.gates.payload_sdist import sdist_figure
from release.manifest import load_manifest
from release.util.digests import sha256_file
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.wheelset import Sdist, WheelSet

EPOCH = 1_700_000_000
ROOT = "activekv-0.1.0"

Change = Callable[[list[tuple[tarfile.TarInfo, bytes]]], list[tuple[tarfile.TarInfo, bytes]]]


def _built(source: Path, out: Path) -> Sdist:
    with StagedSdist(source, out, EPOCH) as staged:
        pass
    path = staged.built.path
    return Sdist(path, sha256_file(path), path.stat().st_size, EPOCH)


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Sdist:
    """The real sdist of this checkout, as `python -m release build` makes it."""
    return _built(REPO_ROOT, tmp_path_factory.mktemp("sdist"))


def _judge(sdist: Sdist, source: Path = REPO_ROOT) -> list[str]:
    return sdist_figure(sdist, source, "activekv", "0.1.0")["problems"]


def _rewritten(sdist: Sdist, folder: Path, change: Change, name: str | None = None) -> Sdist:
    """`sdist` with its members (info and bytes) passed through `change`, written again."""
    with tarfile.open(sdist.path, "r:gz") as archive:
        members = [(m, archive.extractfile(m).read() if m.isfile() else b"")
                   for m in archive.getmembers()]  # fmt: skip
    path = folder / (name or sdist.name)
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as archive:
        for info, data in change(members):
            info.size = len(data) if info.isfile() else 0
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return Sdist(path, sha256_file(path), path.stat().st_size, EPOCH)


def _member(name: str, data: bytes = b"x\n", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = mode, EPOCH
    return info, data


def test_the_real_sdist_holds_exactly_what_git_lists(sdist: Sdist) -> None:
    figure = sdist_figure(sdist, REPO_ROOT, "activekv", "0.1.0")
    assert figure["problems"] == []
    with tarfile.open(sdist.path, "r:gz") as archive:
        names = {m.name for m in archive.getmembers()}
    # what the issue found missing from an unpacked sdist, and what every wheel carries
    for needed in ("release/builder/wheels.py", "release/builder/sdist.py", "LICENSE", "NOTICE",
                   "pyproject.toml", "PKG-INFO"):  # fmt: skip
        assert f"{ROOT}/{needed}" in names
    assert not [n for n in names if n.startswith((f"{ROOT}/out/", f"{ROOT}/.activekv/"))]
    assert figure["members"] == len(names) and figure["sha256"] == sdist.sha256


def test_a_tracked_file_left_out_fails_naming_it(sdist: Sdist, tmp_path: Path) -> None:
    gone = f"{ROOT}/release/builder/wheels.py"
    planted = _rewritten(sdist, tmp_path, lambda ms: [m for m in ms if m[0].name != gone])
    (problem,) = _judge(planted)
    assert problem.startswith("release/builder/wheels.py: missing; expected every file git lists")


def test_a_file_git_ignores_that_got_in_fails(sdist: Sdist, tmp_path: Path) -> None:
    key = _member(f"{ROOT}/.activekv/keys/dev-signing-key.pem", b"-----BEGIN PRIVATE KEY-----\n")
    planted = _rewritten(sdist, tmp_path, lambda ms: [*ms, key])
    (problem,) = _judge(planted)
    assert problem.startswith(".activekv/keys/dev-signing-key.pem: not a file git lists")


def test_other_bytes_than_the_checkouts_fail(sdist: Sdist, tmp_path: Path) -> None:
    name = f"{ROOT}/CMakeLists.txt"
    planted = _rewritten(sdist, tmp_path, lambda ms: [
        (info, data + b"# planted\n" if info.name == name else data) for info, data in ms
    ])  # fmt: skip
    (problem,) = _judge(planted)
    assert problem.startswith("CMakeLists.txt: sha256 ") and "expected the checkout's" in problem


def test_a_link_and_a_member_outside_its_folder_fail(sdist: Sdist, tmp_path: Path) -> None:
    link = tarfile.TarInfo(f"{ROOT}/escape")
    link.type, link.linkname, link.mtime = tarfile.SYMTYPE, "/etc/passwd", EPOCH
    outside = _member("elsewhere/setup.py")
    planted = _rewritten(sdist, tmp_path, lambda ms: [*ms, (link, b""), outside])
    problems = _judge(planted)
    assert f"{ROOT}/escape: a link; expected regular files only" in " ".join(problems)
    assert "elsewhere/setup.py: outside activekv-0.1.0/" in " ".join(problems)


def test_a_member_stamped_unreproducibly_fails(sdist: Sdist, tmp_path: Path) -> None:
    def restamp(
        members: list[tuple[tarfile.TarInfo, bytes]],
    ) -> list[tuple[tarfile.TarInfo, bytes]]:
        for info, _ in members:
            if info.name == f"{ROOT}/README.md":
                info.uid, info.uname, info.mode, info.mtime = 1000, "dev", 0o664, EPOCH + 1
        return members

    (problem,) = _judge(_rewritten(sdist, tmp_path, restamp))
    assert problem.startswith(f"{ROOT}/README.md: expected owner 0:0, mode 0644 or 0755")
    assert "owner 1000:0 ('dev':'')" in problem and "mode 0664" in problem
    assert f"time {EPOCH + 1}, not SOURCE_DATE_EPOCH {EPOCH}" in problem


def test_another_releases_metadata_or_file_name_fails(sdist: Sdist, tmp_path: Path) -> None:
    def other_version(members: list[tuple[tarfile.TarInfo, bytes]]):
        pkg_info = f"{ROOT}/PKG-INFO"
        return [(info, data.replace(b"Version: 0.1.0", b"Version: 0.2.0")
                 if info.name == pkg_info else data) for info, data in members]  # fmt: skip

    (problem,) = _judge(_rewritten(sdist, tmp_path, other_version))
    assert problem == (f"{ROOT}/PKG-INFO: expected Name activekv and Version 0.1.0; got Name "
                       "'activekv' and Version '0.2.0'")  # fmt: skip
    renamed = _rewritten(sdist, tmp_path, lambda ms: ms, name="activekv-0.2.0.tar.gz")
    assert _judge(renamed)[0].startswith("expected the file name activekv-0.1.0.tar.gz (PEP 625")


def test_an_archive_that_is_not_a_tarball_fails(tmp_path: Path) -> None:
    broken = tmp_path / "activekv-0.1.0.tar.gz"
    broken.write_bytes(b"not gzip")
    (problem,) = _judge(Sdist(broken, sha256_file(broken), 8, EPOCH))
    assert problem.startswith("expected a gzip-compressed tar archive; got")


def test_without_a_git_checkout_the_files_cannot_be_told(sdist: Sdist, tmp_path: Path) -> None:
    problems = _judge(sdist, source=tmp_path)
    assert problems[0].startswith(f"{tmp_path}: expected a git checkout")


def test_the_gate_fails_on_the_sdist_and_names_it_beside_the_wheels(
    sdist: Sdist, tmp_path: Path
) -> None:
    manifest = load_manifest(DEFAULT_MANIFEST)
    passed = run_payload_gate(manifest, WheelSet((), sdist), tmp_path, source_dir=REPO_ROOT)
    assert passed.verdict == "pass" and passed.artefacts == {}  # artefacts: the wheels alone
    assert passed.figures[SDIST_FIGURE]["sha256"] == sdist.sha256
    gone = f"{ROOT}/NOTICE"
    planted = _rewritten(sdist, tmp_path, lambda ms: [m for m in ms if m[0].name != gone])
    failed = run_payload_gate(manifest, WheelSet((), planted), tmp_path, source_dir=REPO_ROOT)
    assert failed.verdict == "fail"
    assert failed.reason.startswith("activekv-0.1.0.tar.gz: NOTICE: missing")


def test_an_unanchored_exclude_that_drops_a_first_party_folder_fails(tmp_path: Path) -> None:
    """An unanchored `sdist.exclude` pattern matches a folder's name at any depth (issue 34's
    `"build"` dropped the pipeline's build package): built for real from a copy of this checkout
    with `"cuda"`, which also matches engine/cuda/, the sdist fails naming what it dropped."""
    source = snapshot(REPO_ROOT, tmp_path / "src")
    pyproject = source / "pyproject.toml"
    anchored = 'sdist.exclude = ["/build", "/out", "/.activekv", "/.nox"]'
    assert anchored in pyproject.read_text()
    pyproject.write_text(pyproject.read_text().replace(anchored, 'sdist.exclude = ["cuda"]'))
    subprocess.run(["git", "-C", str(source), "init", "-q"], check=True)
    subprocess.run(["git", "-C", str(source), "add", "--all"], check=True)
    problems = _judge(_built(source, tmp_path / "out"), source)
    dropped = sorted(p.split(":")[0] for p in problems)
    assert dropped and all(p.startswith("engine/cuda/") for p in dropped), problems
    assert "missing; expected every file git lists" in problems[0]
