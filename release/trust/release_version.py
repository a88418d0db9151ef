"""What one publish is a release of: a project and its public version as pip compares versions
(``0.1`` is ``0.1.0``; a local label such as ``0.1.0+hotfix`` is refused), read from wheel and
index file names and from a signed statement; and the names its provenance is stored under
(its signed statement, and beside it the folder of the gate attestations it names), on the
index as TUF targets under ``provenance/`` and in the publisher's and a consumer's copies."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from pathlib import Path

from packaging.specifiers import Specifier
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from release.errors import PublishError
from release.statement import SUFFIX

PROVENANCE_PREFIX = "provenance/"  # the TUF targets of a release's provenance lie under it

# What pip takes as a distribution (pip/_internal/utils/filetypes.py), so as a file of a version.
_PIP_EXTENSIONS = (".zip", ".whl", ".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz", ".tar.xz",
                   ".txz", ".tlz", ".tar.lz", ".tar.lzma")  # fmt: skip
# A source archive's "-py3.1" suffix, which pip drops from the version (its _py_version_re).
_PY_SUFFIX = re.compile(r"-py([123]\.?[0-9]?)$")


def normalize_project(name: str) -> str:
    """PEP 503 normalised project name (packaging's, as pip's)."""
    return canonicalize_name(name)


def statement_file(project: str, version: str) -> str:
    """The file name of the signed statement of ``project`` ``version`` (as spelled)."""
    return f"{normalize_project(project)}-{version}{SUFFIX}"


def statement_target(project: str, version: str) -> str:
    """Where the signed statement of ``project`` ``version`` lies among the TUF targets."""
    return PROVENANCE_PREFIX + statement_file(project, version)


def release_folder(project: str, version: str) -> str:
    """The folder of a release's attestations, beside its statement."""
    return f"{project}-{version}.attestations"


def attestation_target(project: str, version: str, name: str) -> str:
    """Where a release's attestation lies among the TUF targets, beside its statement."""
    return f"{PROVENANCE_PREFIX}{release_folder(project, version)}/{name}"


def version_key(version: str) -> str:
    """``version`` as stored file names spell it: PEP 440-normalised (``1.0-RC1`` is ``1.0rc1``)."""
    try:
        return str(Version(version))
    except InvalidVersion:
        raise PublishError(f"version {version!r}: expected a PEP 440 version") from None


def file_version(filename: str, project: str, egg: str | None = None) -> Version | None:
    """The version of ``project`` that a file of its index page is, read as pip reads it
    (pip/_internal/index/package_finder.py, LinkEvaluator): a wheel's from its name, a source
    archive's from ``name-version`` with the name spelled any way pip accepts, and from the link's
    ``egg`` fragment instead where it has one. None for a file pip would not take as one of
    ``project`` (another project, not a distribution, or a name pip cannot read)."""
    stem, extension = _split_extension(filename)
    if extension not in _PIP_EXTENSIONS:
        return None
    if egg is None and extension == ".whl":
        try:
            name, version, _, _ = parse_wheel_filename(filename)
        except (InvalidWheelFilename, InvalidVersion):
            return None
        return version if name == canonicalize_name(project) else None
    return _name_version(stem if egg is None else egg, project)


def _split_extension(filename: str) -> tuple[str, str]:
    """pip's splitext: ``.tar`` is kept with the extension after it (``.tar.gz``)."""
    stem, extension = posixpath.splitext(filename)
    if stem.lower().endswith(".tar"):
        stem, extension = stem[:-4], stem[-4:] + extension
    return stem, extension


def _name_version(text: str, project: str) -> Version | None:
    """The version after the first ``-`` that ends a spelling of ``project`` (pip's
    _extract_version_from_fragment), less a ``-pyX.Y`` suffix pip reads as a target Python.
    Not packaging's parse_sdist_filename: it splits at the last ``-`` (pip takes
    ``activekv-0.1.0-1.tar.gz`` for 0.1.0.post1) and knows only .tar.gz and .zip."""
    for cut, char in enumerate(text):
        if char == "-" and canonicalize_name(text[:cut]) == canonicalize_name(project):
            try:
                return Version(_PY_SUFFIX.sub("", text[cut + 1 :]))
            except InvalidVersion:
                return None
    return None


def of_version(filename: str, project: str, version: str, egg: str | None = None) -> bool:
    """Whether pip takes ``filename`` (with the link's ``egg`` fragment, if any) for
    ``project==version``: the same version however it is spelled (``0.1`` for ``0.1.0``), and a
    local label of it (``0.1.0+hotfix``) too."""
    found = file_version(filename, project, egg)
    return found is not None and Specifier(f"=={version}").contains(found, prereleases=True)


def version_spellings(version: str) -> list[str]:
    """``version`` as file names may spell it, PEP 440-normalised, the release written with
    from none to three trailing zeros (``0.1``, ``0.1.0``, ``0.1.0.0``): a name made with the
    spelling its publisher gave is found from any other (pip takes each for the others)."""
    parsed = Version(version)
    release = list(parsed.release)
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    epoch = f"{parsed.epoch}!" if parsed.epoch else ""
    tail = str(parsed)[len(epoch) + len(".".join(map(str, parsed.release))) :]
    spelled = [epoch + ".".join(map(str, release + [0] * zeros)) + tail for zeros in range(4)]
    first = str(parsed)
    return [first, *(s for s in dict.fromkeys(spelled) if s != first)]


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
        releases.add((canonicalize_name(name), str(version)))
    if len(releases) != 1:
        listed = ", ".join(f"{n} {v}" for n, v in sorted(releases))
        raise PublishError(f"one publish is one project version; the wheels are of {listed}")
    return releases.pop()


def same_version(signed: object, version: str) -> bool:
    """Whether ``signed`` (a statement's version) is ``version``, however either is spelled."""
    try:
        return isinstance(signed, str) and Version(signed) == Version(version)
    except InvalidVersion:
        return False
