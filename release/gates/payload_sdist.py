"""The payload gate's judgement of the sdist: it holds exactly the files it should.

Those are the files git hands on from the checkout it was built from (`git ls-files --cached
--others --exclude-standard`: what is tracked, and untracked files no ignore rule covers; the
same set release/builder/reproduce.py copies as what a build reads) plus the PKG-INFO its backend
writes, each under one `<name>-<version>/` folder, with the checkout's bytes. So a tracked file
left out (an `sdist.exclude` pattern that matches `release/builder/`) fails, and so does anything
git ignores that got in (`out/`, `.activekv/`, a build tree), a file whose bytes are not the
checkout's, a link or device, a member pip would unpack elsewhere than it reads, a member not
stamped as a reproducible build stamps it (owner 0, mode 0644 or 0755, the build's
SOURCE_DATE_EPOCH), and a PKG-INFO or file name of another project or version.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections import Counter
from email.parser import Parser
from pathlib import Path

from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import Version

from release.evidence import SDIST_FIGURE
from release.gates.payload_names import member_name_problem, path_spellings
from release.util.sources import handed_on
from release.wheelset import Sdist

PKG_INFO = "PKG-INFO"
_MODES = (0o644, 0o755)  # what scikit-build-core's reproducible sdist writes


def sdist_figure(sdist: Sdist, source_dir: Path, project: str, version: str) -> dict[str, object]:
    """What the payload evidence says of `sdist` (SDIST_FIGURE): its file, sha256, members and
    every problem, each naming the member."""
    problems: list[str] = []
    root = _name_problems(sdist.name, project, version, problems)
    members: list[tarfile.TarInfo] = []
    try:
        with tarfile.open(sdist.path, "r:gz") as archive:
            members = archive.getmembers()
            expected, problem = handed_on(source_dir)
            problems += [problem] if problem else []
            _member_problems(archive, members, root, sdist.epoch, problems)
            if not problem:
                _listing_problems(archive, members, root, source_dir, expected, problems)
            _pkg_info_problems(archive, root, project, version, problems)
    except (tarfile.TarError, OSError, EOFError) as error:
        problems.append(f"expected a gzip-compressed tar archive; got {error}")
    return {"file": sdist.name, "sha256": sdist.sha256, "root": root, "members": len(members),
            "problems": problems}  # fmt: skip


def sdist_failures(figures: dict[str, object]) -> list[str]:
    """The problems of the payload figures' sdist, each prefixed with its file name."""
    found = figures.get(SDIST_FIGURE)
    if not isinstance(found, dict):
        return []
    return [f"{found['file']}: {problem}" for problem in found.get("problems", [])]


def _name_problems(name: str, project: str, version: str, problems: list[str]) -> str:
    """The folder the members must be under, `<name>-<version>` as PEP 625 spells the file."""
    expected = f"{canonicalize_name(project).replace('-', '_')}-{Version(version)}"
    try:
        got_name, got_version = parse_sdist_filename(name)
    except InvalidSdistFilename as error:
        problems.append(f"expected the file name {expected}.tar.gz (PEP 625); {error}")
        return expected
    if (got_name, got_version) != (canonicalize_name(project), Version(version)) or (
        name != f"{expected}.tar.gz"
    ):
        problems.append(f"expected the file name {expected}.tar.gz (PEP 625: {project} "
                        f"{version}); got {name}")  # fmt: skip
    return expected


def _member_problems(
    archive: tarfile.TarFile,
    members: list[tarfile.TarInfo],
    root: str,
    epoch: int | None,
    problems: list[str],
) -> None:
    names = [member.name for member in members]
    counts, spellings = Counter(names), path_spellings(names)
    for member in members:
        name = member.name
        problem = member_name_problem(name, counts[name], spellings, archive="sdist")
        if not problem and not (name == root or name.startswith(root + "/")):
            problem = f"outside {root}/; expected every member in that one folder (PEP 625)"
        if not problem and not (member.isfile() or member.isdir()):
            kind = "a link" if member.issym() or member.islnk() else "not a regular file"
            problem = f"{kind}; expected regular files only (pip unpacks a link where it points)"
        if not problem and member.isfile():
            problem = _stamp_problem(member, epoch)
        if problem:
            problems.append(f"{name}: {problem}")


def _stamp_problem(member: tarfile.TarInfo, epoch: int | None) -> str:
    """How the member differs from what a reproducible build records of it."""
    found = []
    if (member.uid, member.gid, member.uname, member.gname) != (0, 0, "", ""):
        found.append(f"owner {member.uid}:{member.gid} ({member.uname!r}:{member.gname!r})")
    if member.mode not in _MODES:
        found.append(f"mode {member.mode:04o}")
    if epoch is not None and member.mtime != epoch:
        found.append(f"time {member.mtime}, not SOURCE_DATE_EPOCH {epoch}")
    if not found:
        return ""
    return ("expected owner 0:0, mode 0644 or 0755 and the build's time (a reproducible sdist); "
            f"got {', '.join(found)}")  # fmt: skip


def _listing_problems(
    archive: tarfile.TarFile,
    members: list[tarfile.TarInfo],
    root: str,
    source_dir: Path,
    expected: list[str],
    problems: list[str],
) -> None:
    """Exactly the expected files, each with the checkout's bytes."""
    held = {m.name.removeprefix(root + "/"): m for m in members if m.isfile()}
    for name in expected:
        if name not in held:
            problems.append(f"{name}: missing; expected every file git lists in {source_dir} "
                            "(does pyproject's sdist.exclude drop it?)")  # fmt: skip
    for name, member in sorted(held.items()):
        if name == PKG_INFO:
            continue
        if name not in expected:
            problems.append(f"{name}: not a file git lists in {source_dir} (ignored, or not "
                            "there); expected only those")  # fmt: skip
            continue
        stream = archive.extractfile(member)
        data = stream.read() if stream is not None else b""
        source = (source_dir / name).read_bytes()
        if data != source:
            problems.append(
                f"{name}: sha256 {hashlib.sha256(data).hexdigest()}; expected the checkout's "
                f"bytes (sha256 {hashlib.sha256(source).hexdigest()})"
            )


def _pkg_info_problems(
    archive: tarfile.TarFile, root: str, project: str, version: str, problems: list[str]
) -> None:
    try:
        stream = archive.extractfile(f"{root}/{PKG_INFO}")
    except KeyError:
        stream = None
    if stream is None:
        problems.append(f"{root}/{PKG_INFO}: missing; expected the metadata the backend writes")
        return
    metadata = Parser().parsestr(stream.read().decode("utf-8", "replace"))
    name, found = metadata.get("Name", ""), metadata.get("Version", "")
    try:
        same_version = Version(found) == Version(version)
    except ValueError:
        same_version = False
    if canonicalize_name(name) != canonicalize_name(project) or not same_version:
        problems.append(f"{root}/{PKG_INFO}: expected Name {project} and Version {version}; got "
                        f"Name {name!r} and Version {found!r}")  # fmt: skip
