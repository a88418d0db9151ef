"""What one publish is a release of: a project and its public version as pip compares versions
(``0.1`` is ``0.1.0``; a local label such as ``0.1.0+hotfix`` is refused), read from wheel and
index file names and from a signed statement."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.specifiers import Specifier
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from release.errors import PublishError
from release.trust.index import normalize_project

# What pip reads as a source distribution (besides wheels), so as a file of some version.
_SDIST_EXTENSIONS = (".tar.gz", ".zip", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tlz", ".tar.lz",
                     ".tar.lzma", ".tgz", ".tar")  # fmt: skip


def version_key(version: str) -> str:
    """``version`` as stored file names spell it: PEP 440-normalised (``1.0-RC1`` is ``1.0rc1``)."""
    try:
        return str(Version(version))
    except InvalidVersion:
        raise PublishError(f"version {version!r}: expected a PEP 440 version") from None


def file_version(filename: str, project: str) -> Version | None:
    """The version of ``project`` that a file of its index page is, read from its name as pip
    reads it; None for a file pip would not take as one of ``project`` (another project, not a
    distribution, or a name pip cannot read)."""
    if filename.endswith(".whl"):
        try:
            name, version, _, _ = parse_wheel_filename(filename)
        except (InvalidWheelFilename, InvalidVersion):
            return None
        return version if name == normalize_project(project) else None
    stem = next((filename[: -len(e)] for e in _SDIST_EXTENSIONS if filename.endswith(e)), None)
    if stem is None:
        return None
    for cut, char in enumerate(stem):  # name-version, the name spelled any way pip accepts
        if char == "-" and normalize_project(stem[:cut]) == normalize_project(project):
            with contextlib.suppress(InvalidVersion):
                return Version(stem[cut + 1 :])
    return None


def of_version(filename: str, project: str, version: str) -> bool:
    """Whether pip takes ``filename`` for ``project==version``: the same version however it is
    spelled (``0.1`` for ``0.1.0``), and a local label of it (``0.1.0+hotfix``) too."""
    found = file_version(filename, project)
    return found is not None and Specifier(f"=={version}").contains(found, prereleases=True)


def project_and_version(wheels: Sequence[Path]) -> tuple[str, str]:
    """(normalised project, normalised public version) of the wheels: one of each."""
    if not wheels:
        raise PublishError("nothing to publish: no wheels given")
    seen: set[str] = set()
    releases: set[tuple[str, str]] = set()
    for wheel in wheels:
        try:
            name, version, _, _ = parse_wheel_filename(wheel.name)
        except (InvalidWheelFilename, InvalidVersion):
            raise PublishError(f"{wheel}: not a wheel file name (name-version-tags.whl)") from None
        if wheel.name in seen:
            raise PublishError(f"{wheel.name} is given twice")
        seen.add(wheel.name)
        if version.local is not None:
            raise PublishError(
                f"{wheel.name}: expected a public version (PEP 440) to publish; got {version}, "
                f"whose local label +{version.local} pip also takes for =={version.public}"
            )
        releases.add((normalize_project(name), str(version)))
    if len(releases) != 1:
        listed = ", ".join(f"{n} {v}" for n, v in sorted(releases))
        raise PublishError(f"one publish is one project version; the wheels are of {listed}")
    return releases.pop()


def statement_version(statement: Mapping[str, Any]) -> object:
    """The version a release's statement says it is of (None when it says none)."""
    try:
        return statement["predicate"]["buildDefinition"]["externalParameters"]["version"]
    except (KeyError, TypeError):
        return None


def same_version(signed: object, version: str) -> bool:
    """Whether ``signed`` (a statement's version) is ``version``, however either is spelled."""
    try:
        return isinstance(signed, str) and Version(signed) == Version(version)
    except InvalidVersion:
        return False
