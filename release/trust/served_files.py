"""The first check of a verify: every file the index serves for a version is one the signed
statement names, with its digest, and every file it names is served (a pip install checks only
the one file it picks for its interpreter)."""

from __future__ import annotations

import shutil
import urllib.error
from collections.abc import Callable, Mapping
from pathlib import Path

from release.errors import PackageIndexError, VerifyError
from release.manifest import NetworkLimits
from release.trust.index import IndexFile, project_files
from release.trust.release_version import of_version
from release.util import http
from release.util.digests import sha256_file


def check_served_files(
    *,
    simple_url: str,
    project: str,
    version: str,
    signed: Mapping[str, str],
    folder: Path,
    file_check: Callable[[Path], None] | None = None,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
) -> dict[str, str]:
    """Every file the index lists for ``project==version`` (each file pip could take for it on
    any interpreter: wheels of every tag, source archives, yanked files and files of any
    Requires-Python included, named as pip names them), downloaded into ``folder``, checked by
    ``file_check`` and against ``signed`` (the statement's subjects): exactly those files, each
    with its signed digest. Name to sha256; VerifyError naming the first file that is not so (a
    pip install checks only the one file it picks). ``limits`` bound every read."""
    release = f"{project} {version}"
    foreign = sorted(name for name in signed if not of_version(name, project, version))
    if foreign:
        raise VerifyError(f"the signed statement names {', '.join(foreign)}: expected only files "
                          f"of {release}")  # fmt: skip
    served: dict[str, str] = {}
    for found in _project_files(simple_url, project, limits):
        name, url = found.filename, found.url
        if of_version(name, project, version, found.egg):
            if served.get(name, url) != url:  # which one would pip take?
                raise VerifyError(f"{simple_url} lists {name} twice, at {served[name]} and {url}: "
                                  "expected one file of a name")  # fmt: skip
            served[name] = url
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    checked: dict[str, str] = {}
    for name, url in sorted(served.items()):
        path = _download(url, folder / name, limits)
        if file_check is not None:
            file_check(path)
        digest = sha256_file(path)
        if name not in signed:
            raise VerifyError(
                f"{name} (sha256 {digest}), served by {simple_url} as {release}, is not in the "
                f"signed statement (it names: {', '.join(sorted(signed)) or 'nothing'})"
            )
        if signed[name] != digest:
            raise VerifyError(
                f"{name} served by {simple_url} has sha256 {digest}; the signed statement "
                f"expects {signed[name]}"
            )
        checked[name] = digest
    absent = sorted(set(signed) - set(checked))
    if absent:
        raise VerifyError(
            f"{simple_url} does not serve {', '.join(absent)}: expected every file the signed "
            f"statement of {release} names; the release is published in part, or the index "
            "lost files"
        )
    return checked


def _project_files(simple_url: str, project: str, limits: NetworkLimits) -> list[IndexFile]:
    """Every link on the project's page of the index, as pip reads it."""
    try:
        return project_files(simple_url, project, limits=limits)
    except PackageIndexError as exc:
        raise VerifyError(str(exc)) from None


def _download(url: str, destination: Path, limits: NetworkLimits) -> Path:
    """``url`` saved as ``destination`` (whose name is the listed file's: a plain name)."""
    if destination.name != Path(destination.name).name or destination.name.startswith("."):
        raise VerifyError(f"{url}: expected a plain file name; got {destination.name!r}")
    try:
        with destination.open("wb") as stream:
            http.fetch(url, stream.write, limits=limits, error=VerifyError)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise VerifyError(f"{url}: cannot download {destination.name} (HTTP {exc.code} "
                          f"{exc.reason})") from None  # fmt: skip
    except urllib.error.URLError as exc:
        raise VerifyError(f"{url}: cannot download {destination.name} ({exc.reason})") from None
    return destination
