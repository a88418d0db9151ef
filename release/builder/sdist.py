"""The source distribution, built beside the wheels by the standard PEP 517 frontend:
`python -m build --sdist` (PyPA's build), calling scikit-build-core's own `build_sdist` hook with
the build's SOURCE_DATE_EPOCH (release/builder/wheels.py: source_date_epoch), so that two builds
are byte-identical (scikit-build-core sorts the members, zeroes their owners, normalises their
modes to 0644/0755 and stamps the archive and every member with that time).

It runs without build isolation, in the pipeline's own environment: the sdist hook needs no
compiler, and an isolated environment would install every build requirement (cmake, nanobind, …)
again on each build. The backend must then be the one build-system.requires pins (checked first),
as it is for the wheels, which pip builds in isolation.

What it holds is scikit-build-core's choice (the files .gitignore and pyproject's
`sdist.exclude` leave in); the payload gate judges it (release/gates/payload_sdist.py).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from packaging.requirements import Requirement

from release.errors import BuildError
from release.records import SDIST_FOLDER
from release.util.logged import run_logged
from release.util.paths import PYPROJECT
from release.util.pins import pyproject

BACKEND = "scikit-build-core"
FRONTEND = "build"
# scikit-build-core reads its settings from these too (SKBUILD_SDIST_EXCLUDE, …): the release's
# sdist is what pyproject.toml says, whatever the environment adds.
_SETTINGS_PREFIX = "SKBUILD_"


@dataclass(frozen=True)
class BuiltSdist:
    path: Path
    seconds: float

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def backend_pin() -> str:
    """The scikit-build-core version build-system.requires pins (the wheels' backend too)."""
    for text in pyproject().get("build-system", {}).get("requires", []):
        requirement = Requirement(text)
        specifiers = list(requirement.specifier)
        if requirement.name == BACKEND and len(specifiers) == 1 and specifiers[0].operator == "==":
            return specifiers[0].version
    raise BuildError(f"{PYPROJECT}: build-system.requires: expected a {BACKEND}==X pin")


def check_frontend() -> None:
    """BuildError naming what to install unless this environment has PyPA's build and the
    pinned scikit-build-core (the sdist is built here, without isolation)."""
    pin = backend_pin()
    found = {}
    for name in (FRONTEND, BACKEND):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    if found[FRONTEND] is None or found[BACKEND] != pin:
        got = ", ".join(f"{name} {version or 'not installed'}" for name, version in found.items())
        raise BuildError(f"the sdist: expected {FRONTEND} and {BACKEND}=={pin} (build-system."
                         f"requires) in {sys.prefix}; got {got}: install pyproject's build "
                         "dependency group")  # fmt: skip


class StagedSdist:
    """Builds the sdist into `<out>/.sdist.partial/` on entry; on a clean exit it replaces
    `<out>/sdist/`, on an error it is removed and `<out>/sdist/` is left as it was (so the sdist
    changes together with the wheels built in the block)."""

    def __init__(self, source_dir: Path, out_dir: Path, epoch: int) -> None:
        self.source_dir, self.out_dir, self.epoch = source_dir, out_dir, epoch
        self.staging = out_dir / f".{SDIST_FOLDER}.partial"
        self._built: BuiltSdist | None = None

    @property
    def built(self) -> BuiltSdist:
        """The sdist, in `<out>/sdist/` once the block has finished."""
        if self._built is None:
            raise BuildError("the sdist: asked for before it was built")
        return self._built

    def __enter__(self) -> StagedSdist:
        self._built = _build(self.source_dir, self.staging, self.out_dir / "logs", self.epoch)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        final = self.out_dir / SDIST_FOLDER
        shutil.rmtree(final, ignore_errors=True)
        self.staging.replace(final)
        self._built = BuiltSdist(final / self.built.path.name, self.built.seconds)


def _build(source_dir: Path, staging: Path, logs: Path, epoch: int) -> BuiltSdist:
    """The sdist of `source_dir`, built into a fresh `staging`; BuildError with the log's tail
    when the frontend fails or makes other than one `.tar.gz`."""
    check_frontend()
    started = time.monotonic()
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    log = logs / "build-sdist.log"
    log.unlink(missing_ok=True)
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(_SETTINGS_PREFIX)}  # fmt: skip
    env["SOURCE_DATE_EPOCH"] = str(epoch)
    command = [sys.executable, "-m", FRONTEND, "--sdist", "--no-isolation",
               "--skip-dependency-check", "--outdir", str(staging.resolve()),
               str(source_dir.resolve())]  # fmt: skip
    try:
        run_logged(command, env, log, "building the sdist")
        made = sorted(staging.iterdir())
        if len(made) != 1 or not made[0].name.endswith(".tar.gz"):
            raise BuildError(f"{staging}: expected exactly one .tar.gz from {FRONTEND} --sdist; "
                             f"found {[p.name for p in made]} (log: {log})")  # fmt: skip
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return BuiltSdist(made[0], time.monotonic() - started)


def sdist_differences(first: Path, second: Path) -> list[str]:
    """Each member that differs between two sdists (its bytes, or what the archive records of
    it: mode, time, owner, type, link), with its first differing byte."""
    with tarfile.open(first, "r:gz") as a, tarfile.open(second, "r:gz") as b:
        members_a = {m.name: m for m in a.getmembers()}
        members_b = {m.name: m for m in b.getmembers()}
        found = [f"{name}: only in the first" for name in sorted(set(members_a) - set(members_b))]
        found += [f"{name}: only in the second" for name in sorted(set(members_b) - set(members_a))]
        for name in sorted(set(members_a) & set(members_b)):
            found += _member_difference(name, a, members_a[name], b, members_b[name])
        if not found and [m.name for m in a.getmembers()] != [m.name for m in b.getmembers()]:
            found.append("same members and bytes, in another order")
    return found or ["same members, bytes and order; the compressed stream differs (gzip header)"]


_RECORDED = ("mode", "mtime", "uid", "gid", "uname", "gname", "type", "linkname", "pax_headers")


def _member_difference(
    name: str, a: tarfile.TarFile, one: tarfile.TarInfo, b: tarfile.TarFile, two: tarfile.TarInfo
) -> list[str]:
    changed = [f"{key} {getattr(one, key)!r} and {getattr(two, key)!r}"
               for key in _RECORDED if getattr(one, key) != getattr(two, key)]  # fmt: skip
    data_a, data_b = _data(a, one), _data(b, two)
    if data_a != data_b:
        offset = next((i for i, (x, y) in enumerate(zip(data_a, data_b, strict=False)) if x != y),
                      min(len(data_a), len(data_b)))  # fmt: skip
        changed.append(f"first difference at byte {offset} ({len(data_a)} and {len(data_b)} "
                       "bytes)")  # fmt: skip
    return [f"{name}: {', '.join(changed)}"] if changed else []


def _data(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    stream = archive.extractfile(member) if member.isfile() else None
    return stream.read() if stream is not None else b""
