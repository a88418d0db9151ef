"""The records the steps leave under ``<out>/``: one typed definition each, read and written only
through this module by every step, the report and the summary.

``build.json`` (the wheels and the sdist, and how they were made), ``sign.json``,
``publish.json`` and ``verify.json``; gate evidence has its own module (``release.evidence``). A
record that does not match its definition is refused with the file, the key and what was
expected. Benchmark records (``bench.json``, ``gpu-staging.json``) are measurements shown as they
are: plain JSON objects.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from release.errors import ReleaseError
from release.util.atomic import atomic_write
from release.util.jsonfile import JsonFileError, read_json

# The latest SOURCE_DATE_EPOCH the build takes (9999-12-31T23:59:59Z): GCC and Clang refuse a
# later one, and so does cmake/write_sbom.py (Python's datetime ends there).
LATEST_EPOCH = 253402300799

# The GPU staging benchmark's record (`python -m release gpu-staging`, read by the report).
GPU_STAGING_RECORD = "gpu-staging"


class Record(BaseModel):
    """One record file: `<out>/<FILE>.json`, written by the step named in MADE_BY."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    FILE: ClassVar[str]
    MADE_BY: ClassVar[str]


Sha256 = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
# A wheel's own file name, never a path: the wheels folder joined with it stays in that folder.
WheelFileName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.+!-]+\.whl$")]
# The sdist's own file name (PEP 625: <name>-<version>.tar.gz), never a path.
SdistFileName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.+!-]+\.tar\.gz$")]
PythonVersion = Annotated[StrictStr, Field(pattern=r"^3\.[0-9]+$")]
# Where a build leaves its sdist, under <out>/ (beside wheels/).
SDIST_FOLDER = "sdist"


class BuiltWheelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    file: WheelFileName
    python: PythonVersion
    serves: tuple[PythonVersion, ...]
    seconds: Annotated[StrictFloat, Field(ge=0, allow_inf_nan=False)]
    cached: StrictBool
    size: Annotated[StrictInt, Field(ge=0)]
    sha256: Sha256


class SkippedEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    python: PythonVersion
    reason: str


class SdistEntry(BaseModel):
    """The build's source distribution, `<out>/sdist/<file>` (SDIST_FOLDER)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    file: SdistFileName
    seconds: Annotated[StrictFloat, Field(ge=0, allow_inf_nan=False)]
    size: Annotated[StrictInt, Field(ge=0)]
    sha256: Sha256


class BuiltFrom(BaseModel):
    """The tree a build read (release/source_state.py), taken when it started: what the
    statement names, so that a tree changed after the build cannot be signed as its source."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    commit: StrictStr | None
    uncommitted: tuple[StrictStr, ...] = ()
    uncommitted_sha256: Sha256 | None = None


class BuildRecord(Record):
    FILE: ClassVar[str] = "build"
    MADE_BY: ClassVar[str] = "python -m release build"
    started: datetime
    finished: datetime
    source_date_epoch: Annotated[StrictInt, Field(ge=1, le=LATEST_EPOCH)]
    toolchain: dict[str, Any]
    wheels: tuple[BuiltWheelEntry, ...]
    skipped: tuple[SkippedEntry, ...] = ()
    source: BuiltFrom | None = None  # None: a record from before sources were recorded
    # None: wheels recorded without one (record-build), or a record from before the sdist.
    sdist: SdistEntry | None = None


class SignRecord(Record):
    FILE: ClassVar[str] = "sign"
    MADE_BY: ClassVar[str] = "python -m release sign"
    channel: str
    envelope: str
    envelope_sha256: str
    keyid: str
    public_key: str
    subjects: dict[str, str]  # file name -> sha256: every wheel, and the sdist when built
    attestations: dict[str, str] = {}  # gate -> the signed attestation the provenance names
    # The commit the statement names, and the uncommitted changes to wheel inputs it records
    # (dev only: stable refuses them; release/source_state.py).
    source_commit: str | None = None
    uncommitted: tuple[str, ...] = ()
    uncommitted_sha256: str | None = None


class PublishedFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    file: str
    sha256: str
    outcome: str


class TufPublished(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    url: str
    trusted_root: str
    added: tuple[str, ...]
    targets_version: int
    timestamp_version: int


class PublishRecord(Record):
    FILE: ClassVar[str] = "publish"
    MADE_BY: ClassVar[str] = "python -m release publish"
    channel: str
    index: str
    message: str
    files: tuple[PublishedFile, ...]
    statement: str
    statement_stored: bool
    tuf: TufPublished | None = None


class VerifyCheck(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    python: str
    wheel: str
    sha256: str
    digest_ok: bool
    imported: tuple[str, ...]


class VerifyRecord(Record):
    FILE: ClassVar[str] = "verify"
    MADE_BY: ClassVar[str] = "python -m release verify"
    index: str
    statement: str
    checks: tuple[VerifyCheck, ...]
    # Every file the index serves for the version, each checked against the statement: name to
    # sha256 (empty in records of verifies before this check).
    served: dict[str, Sha256] = {}


R = TypeVar("R", bound=Record)


def record_path(out_dir: Path, kind: type[Record]) -> Path:
    return out_dir / f"{kind.FILE}.json"


def write(out_dir: Path, record: Record) -> Path:
    path = record_path(out_dir, type(record))
    atomic_write(path, (record.model_dump_json(indent=2) + "\n").encode())
    return path


def read(out_dir: Path, kind: type[R]) -> R:
    """The record, or a ReleaseError naming the file and the step that writes it."""
    found = read_optional(out_dir, kind)
    if found is None:
        raise ReleaseError(
            f"{record_path(out_dir, kind)}: expected the record of `{kind.MADE_BY}`; run it first"
        )
    return found


def read_optional(out_dir: Path, kind: type[R]) -> R | None:
    """The record, None when the step did not run; a ReleaseError when it is unreadable."""
    path = record_path(out_dir, kind)
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    except JsonFileError as error:
        raise ReleaseError(f"{path}: the record of `{kind.MADE_BY}`: {error}") from None
    try:
        return kind.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "<top level>"
        raise ReleaseError(
            f"{path}: {key}: expected the record of `{kind.MADE_BY}` ({first['msg']}); "
            f"got {json.dumps(first.get('input'), default=str)[:80]}"
        ) from None


def discard(out_dir: Path, *kinds: type[Record]) -> None:
    """Removes records of an earlier run, so they cannot speak for this one."""
    for kind in kinds:
        record_path(out_dir, kind).unlink(missing_ok=True)


def write_measurement(out_dir: Path, name: str, data: dict[str, Any]) -> Path:
    """A benchmark's record: a plain JSON object, shown as measured."""
    path = out_dir / f"{name}.json"
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode())
    return path


def read_measurement(out_dir: Path, name: str) -> dict[str, Any] | None:
    path = out_dir / f"{name}.json"
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    except JsonFileError as error:
        raise ReleaseError(f"{path}: {error}") from None
    if not isinstance(data, dict):
        raise ReleaseError(f"{path}: expected a JSON object; got {type(data).__name__}")
    return data
