"""The wheels of one release as a typed value, built once and passed through every step, with
the sdist the same build made beside them.

A ``Wheel`` knows its file, its sha256, the Python version it was built for and the declared
versions it installs on. Digests are computed where a wheel comes into being (the build, or
``WheelSet.from_files`` for wheels built elsewhere or named on the command line); the wheels of a
build record are hashed again when they are read, and must match it.

The sdist rides along (``WheelSet.sdist``) but is no wheel: iterating a set, and its ``digests``
(what a gate's evidence names), are the wheels alone, so a gate that judges wheels never sees it.
The payload gate judges it too and names it in its figures (``release.evidence.SDIST_FIGURE``);
the statement names it as a subject and the index serves it (``release_digests``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from release.errors import BuildError, GateError
from release.records import SDIST_FOLDER
from release.util.digests import sha256_file

if TYPE_CHECKING:
    from release.manifest import Manifest
    from release.records import BuildRecord


def version_tuple(version: str) -> tuple[int, int]:
    """``"3.12"`` as ``(3, 12)``, for ordering Python versions."""
    major, minor = version.split(".")
    return int(major), int(minor)


def served_versions(manifest: Manifest, filename: str) -> tuple[str, tuple[str, ...]]:
    """(the version a wheel was built for, the declared versions it installs on), from its tags;
    a wheel for a version the manifest does not declare is refused."""
    declared = manifest.build.python
    tags = parse_wheel_filename(filename)[3]
    if all(tag.interpreter.startswith("py") and tag.abi == "none" for tag in tags):
        return declared[0], tuple(declared)  # pure Python: installs on every declared version
    built_for = {f"{tag.interpreter[2]}.{tag.interpreter[3:]}" for tag in tags}
    if len(built_for) != 1 or not built_for <= set(declared):
        raise BuildError(
            f"{filename}: expected a wheel for one of build.python {list(declared)} of "
            f"{manifest.path}; its tags name {sorted(built_for)}"
        )
    (version,) = built_for
    if not any(tag.abi == "abi3" for tag in tags):
        return version, (version,)
    return version, tuple(v for v in declared if version_tuple(v) >= version_tuple(version))


def running_python() -> str:
    """The version of the interpreter running the pipeline, e.g. ``"3.11"``."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(frozen=True)
class Wheel:
    path: Path
    sha256: str
    python: str  # the version it was built for ("3.12" for the abi3 wheel)
    serves: tuple[str, ...]  # the declared versions it installs on
    size: int

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def stable_abi(self) -> bool:
        return any(tag.abi == "abi3" for tag in parse_wheel_filename(self.name)[3])


@dataclass(frozen=True)
class Sdist:
    """The source distribution of a build: its file and sha256, and the SOURCE_DATE_EPOCH its
    members carry (the build record's; None where it is not known)."""

    path: Path
    sha256: str
    size: int
    epoch: int | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def digests(self) -> dict[str, str]:
        """File name to sha256, as the statement and the index name it."""
        return {self.name: self.sha256}

    @classmethod
    def of_build(cls, record: BuildRecord, sdist_dir: Path, *, check: bool = True) -> Sdist | None:
        """The sdist the build record names, as it lies in `sdist_dir`, hashed again; None when
        the record names none. `check`: GateError when its bytes are not the record's (what is
        judged is the file, never only what the record says); else the bytes as they are now
        (sign and publish compare them with what the payload gate judged)."""
        if record.sdist is None:
            return None
        path = sdist_dir / record.sdist.file  # a bare file name (records.SdistFileName)
        got = sha256_file(path) if path.is_file() else None
        if got is None or (check and got != record.sdist.sha256):
            raise GateError(
                f"{path}: expected the sdist of the build record (sha256 {record.sdist.sha256}); "
                + (f"got sha256 {got}" if got else "got no such file")
                + "; run `python -m release build` again"
            )
        return cls(path.resolve(), got, path.stat().st_size, record.source_date_epoch)


@dataclass(frozen=True)
class WheelSet:
    wheels: tuple[Wheel, ...]
    sdist: Sdist | None = None  # the build's, judged by the payload gate; never iterated

    def __iter__(self) -> Iterator[Wheel]:
        return iter(self.wheels)

    def __len__(self) -> int:
        return len(self.wheels)

    @property
    def paths(self) -> list[Path]:
        return [wheel.path for wheel in self.wheels]

    @property
    def digests(self) -> dict[str, str]:
        """Wheel file name to sha256: what gate evidence names (the wheels alone)."""
        return {wheel.name: wheel.sha256 for wheel in self.wheels}

    @property
    def release_digests(self) -> dict[str, str]:
        """Every file of the release, the wheels and the sdist, to its sha256: what the signed
        statement names and the index serves."""
        return {**self.digests, **(self.sdist.digests if self.sdist else {})}

    def serving(self, python: str) -> Wheel | None:
        """The wheel that installs on Python `python` (its own wheel before the abi3 one)."""
        own = [w for w in self.wheels if w.python == python]
        serving = own or [w for w in self.wheels if python in w.serves]
        return serving[0] if serving else None

    def for_running_interpreter(self) -> Wheel:
        """The wheel the interpreter running the pipeline installs."""
        wheel = self.serving(running_python())
        if wheel is None:
            raise GateError(
                f"no built wheel installs on Python {sys.version.split()[0]}: "
                f"{[w.name for w in self.wheels]}"
            )
        return wheel

    @classmethod
    def from_files(
        cls, manifest: Manifest, paths: Sequence[Path], named_by: str = "wheel"
    ) -> WheelSet:
        """Wheels hashed here, once: wheels named on the command line (`named_by` is the
        argument that named them), built by cibuildwheel, or about to be published."""
        wheels = []
        for path in paths:
            if not path.is_file():
                got = "a folder" if path.is_dir() else "no such file"
                raise GateError(f"{named_by} {path}: expected a wheel file; got {got}")
            try:
                python, serves = served_versions(manifest, path.name)
            except InvalidWheelFilename as error:
                raise GateError(f"{named_by} {path}: expected a wheel file name; {error}") from None
            wheels.append(Wheel(path.resolve(), sha256_file(path), python, serves,
                                path.stat().st_size))  # fmt: skip
        return cls(tuple(wheels))

    @classmethod
    def from_build(
        cls, record: BuildRecord, wheels_dir: Path, sdist_dir: Path | None = None
    ) -> WheelSet:
        """The wheels a build record names, as they lie in `wheels_dir`, hashed again: what a
        gate judges and names in its evidence is the file, never only what the record says; and
        its sdist, likewise, from `sdist_dir` (by default `sdist/` beside `wheels_dir`)."""
        wheels = []
        for entry in record.wheels:
            path = wheels_dir / entry.file  # a bare file name (records.WheelFileName)
            got = sha256_file(path) if path.is_file() else None
            if got != entry.sha256:
                raise GateError(
                    f"{path}: expected the wheel of the build record (sha256 {entry.sha256}); "
                    + (f"got sha256 {got}" if got else "got no such file")
                    + "; run `python -m release build` again"
                )
            wheels.append(Wheel(path.resolve(), entry.sha256, entry.python, entry.serves,
                                entry.size))  # fmt: skip
        sdist = Sdist.of_build(record, sdist_dir or wheels_dir.parent / SDIST_FOLDER)
        return cls(tuple(wheels), sdist)
