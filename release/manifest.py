"""The schema of a release manifest (``manifests/*.toml``) and its loader.

``load_manifest`` is the only way in: it parses the TOML, validates it against the frozen models
below, checks the cross-references between sections, and turns every problem into a
``ManifestError`` whose lines read ``<file>: <dotted.key>: expected <what>; got <value>``.
"""

from __future__ import annotations

import json
import re
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from release import catalogue
from release.errors import ManifestError
from release.util.limits import NetworkLimits
from release.util.paths import PYPROJECT
from release.util.pins import pyproject
from release.util.urls import mask_urls, url_secrets

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SCHEMA_VERSION = 1
CUDA_ARCHITECTURES = ("75", "80", "86", "89", "90", "100", "103", "120")
REQUIRED_ARCHITECTURES = ("80", "90")
REQUIRED_CHANNELS = ("dev", "stable")
# The private key URI schemes securesystemslib signs with (SIGNER_FOR_URI_SCHEME; its "envvar:" is a
# CryptoSigner option for a key's location, not a signer, and fails at sign).
SIGNER_SCHEMES = ("gcpkms", "awskms", "azurekms", "hsm", "file2", "hv", "gnupg", "tkey")
MAX_MANIFEST_BYTES = 1 << 20
MAX_CELL_BYTES = 4 << 30
LOCAL_HOSTS = ("127.0.0.1", "localhost")
MIN_ABI3_PYTHON = (3, 12)

Loc = tuple[str | int, ...]


# --- field checks: each returns the value or raises with the phrase that follows "expected" ---


def _check(ok: bool, expected: str) -> None:
    if not ok:
        raise PydanticCustomError("manifest", expected)


def _schema_version(value: int) -> int:
    _check(value == SCHEMA_VERSION, f"{SCHEMA_VERSION} (the only schema this pipeline reads)")
    return value


def _pattern(regex: str, expected: str, flags: int = 0) -> Callable[[str], str]:
    compiled = re.compile(regex, flags)

    def check(value: str) -> str:
        _check(compiled.fullmatch(value) is not None, expected)
        return value

    return check


def _non_empty(value: tuple[Any, ...]) -> tuple[Any, ...]:
    _check(len(value) > 0, "a non-empty array")
    return value


def _unique(what: str) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    def check(value: tuple[Any, ...]) -> tuple[Any, ...]:
        _check(len(set(value)) == len(value), f"{what} without duplicates")
        return value

    return check


def _python_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def _python_version(value: str) -> str:
    match = re.fullmatch(r"3\.(0|[1-9][0-9]?)", value)
    _check(
        match is not None and 8 <= int(match.group(1)) <= 14,
        'a Python version "3.N" with N from 8 to 14',
    )
    return value


def _python_list(value: tuple[str, ...]) -> tuple[str, ...]:
    ordered = sorted(set(value), key=_python_tuple)
    _check(list(value) == ordered, "Python versions without duplicates, in ascending order")
    return value


def _abi3_python(value: str) -> str:
    _check(_python_tuple(value) >= MIN_ABI3_PYTHON, '"3.12" or newer (the stable ABI of nanobind)')
    return value


def _architectures(value: tuple[str, ...]) -> tuple[str, ...]:
    missing = [arch for arch in REQUIRED_ARCHITECTURES if arch not in value]
    _check(not missing, "architectures that include " + _choices(REQUIRED_ARCHITECTURES, "and"))
    return value


def _shim_path(value: str) -> str:
    path = PurePosixPath(value)
    _check(
        "\\" not in value
        and not path.is_absolute()
        and path.as_posix() == value  # normal form: no "./", "//" or trailing "/"
        and "." not in value.split("/")
        and ".." not in path.parts
        and len(path.parts) >= 2
        and path.parts[0] == "activekv"
        and path.suffix == ".py",
        'a relative path "activekv/<name>.py" inside the package',
    )
    return value


def _exact_version(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        _check(False, 'an exact version such as "0.33.0" (no specifiers)')
    return value


def _shims(value: tuple[Shim, ...]) -> tuple[Shim, ...]:
    paths = [shim.path for shim in value]
    _check(len(set(paths)) == len(paths), "shims with distinct paths")
    return value


def _signing_key(value: str) -> str:
    scheme, colon, rest = value.partition(":")
    _check(
        value == "generate"
        or (scheme == "file" and PurePosixPath(rest).is_absolute())
        or (scheme in SIGNER_SCHEMES and colon == ":"),
        '"generate", "file:<absolute path>" or a signer URI "<scheme>:..." with scheme '
        + _choices(SIGNER_SCHEMES, "or"),
    )
    return value


def _is_web_url(value: str) -> bool:
    """An https URL without credentials in it (userinfo, or a query that could carry a token);
    http only on this machine."""
    if any(c.isspace() or not c.isprintable() for c in value):
        return False
    try:
        url = urlsplit(value)
        host = url.hostname
        url.port  # noqa: B018 -- raises ValueError for a port out of range
    except ValueError:
        return False
    return not url_secrets(value) and (
        (url.scheme == "https" and bool(host)) or (url.scheme == "http" and host in LOCAL_HOSTS)
    )


_WEB_URL = (
    "an https:// URL without credentials, query or fragment (http:// only for 127.0.0.1 or "
    "localhost)"
)


def _index(value: str) -> str:
    _check(value == "embedded" or _is_web_url(value), f'"embedded" or {_WEB_URL}')
    return value


def _web_url(value: str) -> str:
    _check(_is_web_url(value), _WEB_URL)
    return value


def _folder(value: str) -> str:
    _no_control_characters(value)
    _check(value.strip() != "", "a folder path")
    return value


def index_root(simple_url: str) -> str | None:
    """The folder a simple URL of a server's usual shape stands in: devpi's
    ``…/USER/INDEX/+simple/`` in ``…/USER/INDEX/`` (where it takes uploads), pypiserver's and the
    embedded index's ``…/simple/`` in the root (uploads there; the embedded index serves ``tuf/``
    beside it). None for any other shape."""
    base = urlsplit(simple_url)._replace(query="", fragment="").geturl().rstrip("/")
    parent, _, last = base.rpartition("/")
    return parent + "/" if last in ("simple", "+simple") and "//" in parent else None


def _no_control_characters(value: str) -> None:
    _check(
        not any(ord(c) < 0x20 or ord(c) == 0x7F for c in value),
        "a path without control characters (newline, NUL, ...)",
    )


def _relative_dir(value: str) -> str:
    _no_control_characters(value)
    path = PurePosixPath(value)
    _check(
        value.strip() != "" and not path.is_absolute() and ".." not in path.parts,
        'a relative path without ".."',
    )
    return value


def _state_dir(value: str) -> str:
    """Where keys and credentials live: a folder of its own inside the checkout."""
    _relative_dir(value)
    parts = PurePosixPath(value).parts
    _check(bool(parts), "a folder of its own, not the checkout itself (keys would lie untracked)")
    _check(parts[0] != ".git", "a folder outside .git")
    _check(parts[0] != "out", "a folder apart from the outputs (out/), which are handed on")
    return value


Name = Annotated[
    StrictStr,
    AfterValidator(
        _pattern(
            r"[a-z][a-z0-9_-]*",
            "a name of lowercase letters, digits, '_' and '-' that starts with a letter",
        )
    ),
]
DistributionName = Annotated[
    StrictStr,
    AfterValidator(
        _pattern(
            r"[a-z0-9]|[a-z0-9][a-z0-9._-]*[a-z0-9]",
            "a distribution name (ASCII letters, digits, '.', '_', '-'; starts and ends "
            "alphanumeric)",
            re.IGNORECASE | re.ASCII,
        )
    ),
]
PythonVersion = Annotated[StrictStr, AfterValidator(_python_version)]
PositiveInt = Annotated[StrictInt, Field(gt=0)]


def _bounded(high: int) -> Any:
    """A positive integer no larger than `high` (what the engine and a gate's run can hold)."""
    return Annotated[StrictInt, Field(gt=0, le=high)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- the schema, one model per table ---


SIGNING_KEY_ATTESTER = "signing-key"


def _attester(value: str) -> str:
    path = PurePosixPath(value)
    _check(
        value == SIGNING_KEY_ATTESTER
        or (not path.is_absolute() and ".." not in path.parts and value.endswith(".pub.json")),
        f'"{SIGNING_KEY_ATTESTER}" (the channel\'s signing key) or the path of a public key file '
        '"<name>.pub.json" relative to the manifest, without ".."',
    )
    return value


Attester = Annotated[StrictStr, AfterValidator(_attester)]


def _public_key_file(value: str) -> str:
    _no_control_characters(value)
    named = value.endswith(".pub.json") and PurePosixPath(value).name != ".pub.json"
    _check(named, 'the path of a public key file "<name>.pub.json" (relative: to the manifest)')
    return value


def _pinned_key(value: str) -> str:
    _no_control_characters(value)
    path = PurePosixPath(value)
    _check(
        re.fullmatch(r"[0-9a-f]{64}", value) is not None
        or (
            value.endswith(".pub.json")
            and path.name != ".pub.json"
            and not path.is_absolute()
            and ".." not in path.parts
        ),
        'a public key file "<name>.pub.json" relative to the manifest, without "..", or a keyid '
        "(64 lowercase hex digits)",
    )
    return value


PinnedKeyList = Annotated[
    tuple[Annotated[StrictStr, AfterValidator(_pinned_key)], ...],
    AfterValidator(_non_empty),
    AfterValidator(_unique("pinned keys")),
]


class PinnedKeys(_Model):
    """``[release.channels.<name>.pinned]``: the only public keys that sign the channel: its
    provenance and CPU gate attestations (``signing``) and each TUF role's metadata of its index.
    Rotating a key is a commit of this table (docs/trust.md, "Pinned keys")."""

    signing: PinnedKeyList
    root: PinnedKeyList
    targets: PinnedKeyList
    snapshot: PinnedKeyList
    timestamp: PinnedKeyList


class ChannelSpec(_Model):
    """``[release.channels.<name>]``: the gates a channel requires, the key that signs it, and
    whose gate attestations it takes."""

    requires: Annotated[
        tuple[Name, ...], AfterValidator(_non_empty), AfterValidator(_unique("gate names"))
    ]
    signing: Name
    # Per runner class, the keys whose gate attestations count (release/trust/attestation.py).
    attesters: dict[
        Literal["cpu", "gpu"],
        Annotated[
            tuple[Attester, ...], AfterValidator(_non_empty), AfterValidator(_unique("attesters"))
        ],
    ] = Field(default_factory=lambda: {"cpu": (SIGNING_KEY_ATTESTER,)})
    # Folders of the checkout holding attestations made elsewhere (a GPU runner's), taken when
    # they name exactly the digests being published.
    attestations: Annotated[
        tuple[Annotated[StrictStr, AfterValidator(_relative_dir)], ...],
        AfterValidator(_unique("folders")),
    ] = ()
    # Required where the channel signs with an operator's key (not "generate"): a key is taken
    # only when pinned here, whatever file or folder holds it (release/trust/pins.py).
    pinned: PinnedKeys | None = None


class ReleaseSettings(_Model):
    """``[release]``."""

    name: DistributionName
    version_source: Literal["pyproject"]
    default_channel: Name
    channels: dict[Name, ChannelSpec]


class Toolchain(_Model):
    """``[build.toolchain]``."""

    kind: Literal["hermetic", "cibuildwheel"]
    cuda_host_compiler: Annotated[
        StrictStr, AfterValidator(_pattern(r"\S+", "a program name without spaces"))
    ]


class CudaSettings(_Model):
    """``[build.cuda]``."""

    version: Annotated[
        StrictStr, AfterValidator(_pattern(r"[0-9]+\.[0-9]+", 'a CUDA version such as "13.0"'))
    ]
    architectures: Annotated[
        tuple[
            Annotated[
                StrictStr,
                AfterValidator(
                    _pattern(
                        "|".join(CUDA_ARCHITECTURES),
                        "a compute capability, one of "
                        + ", ".join(f'"{arch}"' for arch in CUDA_ARCHITECTURES),
                    )
                ),
            ],
            ...,
        ],
        AfterValidator(_non_empty),
        AfterValidator(_unique("architectures")),
        AfterValidator(_architectures),
    ]
    runtime: Literal["static"]


class BuildSettings(_Model):
    """``[build]``: the interpreters, the platform policy and how the native code is compiled."""

    python: Annotated[
        tuple[PythonVersion, ...], AfterValidator(_non_empty), AfterValidator(_python_list)
    ]
    stable_abi_from: Annotated[PythonVersion, AfterValidator(_abi3_python)]
    platform: Annotated[
        StrictStr,
        AfterValidator(
            _pattern(
                # x86_64 only: the hermetic toolchain targets x86_64-linux-gnu (zig_target).
                r"manylinux_[0-9]+_[0-9]+_x86_64",
                'a platform "manylinux_<major>_<minor>_x86_64" (the toolchain builds x86_64)',
            )
        ),
    ]
    build_type: Literal["Release", "RelWithDebInfo"]
    toolchain: Toolchain
    cuda: CudaSettings

    @property
    def glibc(self) -> tuple[int, int]:
        """The glibc version of the platform policy, e.g. ``(2, 28)``."""
        _, major, minor, _ = self.platform.split("_", 3)
        return int(major), int(minor)

    @property
    def arch(self) -> str:
        """The machine architecture of the platform, e.g. ``x86_64``."""
        return self.platform.split("_", 3)[3]

    @property
    def abi3_python(self) -> str:
        """The first Python version served by the stable-ABI (abi3) wheel, e.g. ``"3.12"``."""
        return self.stable_abi_from


class Shim(_Model):
    """One ``payload.shims`` entry: a Python file the wheel may hold and the framework it cites."""

    path: Annotated[StrictStr, AfterValidator(_shim_path)]
    framework: DistributionName
    version: Annotated[StrictStr, AfterValidator(_exact_version)]
    sha256: Annotated[
        StrictStr, AfterValidator(_pattern(r"[0-9a-f]{64}", "64 lowercase hex digits (sha256)"))
    ]
    # The sha256 of the framework wheel the citations are checked against: the framework's own
    # file, not any wheel that carries its name and version.
    framework_sha256: (
        Annotated[
            StrictStr,
            AfterValidator(_pattern(r"[0-9a-f]{64}", "64 lowercase hex digits (sha256)")),
        ]
        | None
    ) = None


FileKind = Literal["extension", "stub", "typed-marker", "metadata", "license", "shim", "sbom"]


class PayloadPolicy(_Model):
    """``[payload]``."""

    allowed_kinds: Annotated[tuple[FileKind, ...], AfterValidator(_unique("file kinds"))]
    shims: Annotated[tuple[Shim, ...], AfterValidator(_shims)]
    # The SBOM every wheel must carry as <dist-info>/sboms/<sbom> (PEP 770), checked against the
    # wheel's own modules (release/gates/sbom.py); none required when absent.
    sbom: (
        Annotated[
            StrictStr,
            AfterValidator(
                _pattern(
                    r"[a-z0-9][a-z0-9._-]*\.cdx\.json",
                    "a file name like activekv.cdx.json (CycloneDX JSON)",
                )
            ),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _sbom_is_allowed(self) -> PayloadPolicy:
        _check(self.sbom is None or "sbom" in self.allowed_kinds,
               '"sbom" among payload.allowed_kinds, since payload.sbom requires one')  # fmt: skip
        return self


def _unique_cells(value: tuple[ParityCell, ...]) -> tuple[ParityCell, ...]:
    names = [cell.name for cell in value]
    _check(len(set(names)) == len(names), "cells with distinct names")
    return value


class ParityCell(_Model):
    """One ``[[gates.<name>.cells]]`` entry: a trace configuration the parity gate replays."""

    name: Annotated[
        StrictStr, AfterValidator(_pattern(r"[a-z0-9][a-z0-9._-]*", "a cell name of [a-z0-9._-]"))
    ]
    mode: Literal["exact", "int8", "fp8_e4m3"]
    dtype: Literal["fp16", "bf16", "fp32"]
    num_layers: _bounded(512)
    block_size: _bounded(1024)
    num_kv_heads: _bounded(256)
    head_dim: _bounded(1024)
    # Host pool size in blocks: below the trace's working set, it forces eviction and refusal.
    pool_blocks: _bounded(1 << 20)
    num_regions: _bounded(1024)
    region_blocks: _bounded(4096)
    steps: _bounded(100_000)
    # Fence faults the trace injects (each quarantines a region for good).
    fence_faults: Annotated[StrictInt, Field(ge=0, le=1024)]
    seed: Annotated[StrictInt, Field(ge=0, lt=1 << 63)]
    # How the trace's steps are made (release/gates/trace.py): "random", one request per step;
    # "requests", several requests per step with chains of blocks and shared prefixes, after a
    # warm-up that fills and fragments the pool (the extent allocator's splitting and eviction).
    trace: Literal["random", "requests"] = "random"

    @property
    def num_device_blocks(self) -> int:
        """The device KV's blocks the trace addresses: room for two regions' leases at once
        (a step's loads and the next one's), and two more."""
        return 2 * self.region_blocks + 2

    @model_validator(mode="after")
    def _fits_in_memory(self) -> ParityCell:
        # Each implementation replaying the cell holds the pool and the device KV at once.
        words = 4 if self.dtype == "fp32" else 2
        block = 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * words
        blocks = self.pool_blocks + self.num_device_blocks
        _check(block * blocks <= MAX_CELL_BYTES,
               f"a host pool and device KV of at most {MAX_CELL_BYTES >> 30} GiB together "
               f"((pool_blocks + 2 x region_blocks + 2) x {block} bytes per block)")  # fmt: skip
        return self


class GateSpec(_Model):
    """``[gates.<name>]``: where a gate runs and its parameters."""

    runner: Literal["cpu", "gpu"]
    warmup_steps: _bounded(100_000) | None = None
    steady_steps: _bounded(1_000_000) | None = None
    cells: Annotated[tuple[ParityCell, ...], AfterValidator(_unique_cells)] | None = None
    # Cells the parity gate replays only on the CUDA route (parity --device cuda), besides `cells`.
    gpu_cells: Annotated[tuple[ParityCell, ...], AfterValidator(_unique_cells)] | None = None

    @model_validator(mode="after")
    def _cells_apart(self) -> GateSpec:
        # A CUDA replay runs both lists, one trace file per name: a shared name would overwrite.
        shared = {c.name for c in self.cells or ()} & {c.name for c in self.gpu_cells or ()}
        _check(not shared, f"gpu_cells named apart from cells; {sorted(shared)} are in both")
        return self


class SignSpec(_Model):
    """``[sign.<name>]``: a key reference (never the key itself)."""

    key: Annotated[StrictStr, AfterValidator(_signing_key)]
    # The signer's public key file (*.pub.json); a signer URI key needs it (release/trust/sign.py).
    public_key: Annotated[StrictStr, AfterValidator(_public_key_file)] | None = None

    @property
    def generated(self) -> bool:
        """True for a key generated on first use (a dev key)."""
        return self.key == "generate"


class TufKeys(_Model):
    """``[publish.tuf_keys.<role>]``: the key reference of each TUF role of the index (as in
    ``[sign.*]``). Without this table the roles' keys are generated (dev only)."""

    root: SignSpec
    targets: SignSpec
    snapshot: SignSpec
    timestamp: SignSpec


class PublishSettings(_Model):
    """``[publish]``."""

    index: Annotated[StrictStr, AfterValidator(_index)]
    username: Annotated[
        StrictStr,
        AfterValidator(_pattern(r"[A-Za-z0-9._-]+", "a user name of [A-Za-z0-9._-] characters")),
    ]
    state_dir: Annotated[StrictStr, AfterValidator(_state_dir)]
    tuf_keys: TufKeys | None = None
    # A remote index (``index`` is its PEP 503 simple URL): where twine uploads (default: the
    # server's convention, see index_root), the folder the TUF repository is written
    # to (relative to the manifest's folder), which the operator serves at ``tuf_url``.
    upload_url: Annotated[StrictStr, AfterValidator(_web_url)] | None = None
    tuf_dir: Annotated[StrictStr, AfterValidator(_folder)] | None = None
    tuf_url: Annotated[StrictStr, AfterValidator(_web_url)] | None = None
    limits: NetworkLimits = NetworkLimits()

    @property
    def embedded(self) -> bool:
        """True when the pipeline starts its own index on 127.0.0.1."""
        return self.index == "embedded"

    @property
    def upload_endpoint(self) -> str | None:
        """Where twine uploads to a remote index: ``upload_url``, else the server's convention."""
        return self.upload_url or index_root(self.index)


RunnerLabel = Annotated[
    StrictStr,
    AfterValidator(
        _pattern(
            r"[A-Za-z0-9][A-Za-z0-9._-]*",
            "a runner label of letters, digits, '.', '_' and '-' that starts alphanumeric",
        )
    ),
]


def _without_self_hosted(value: tuple[str, ...]) -> tuple[str, ...]:
    _check(
        "self-hosted" not in value,
        'labels without "self-hosted" (the workflow adds it before them)',
    )
    return value


# A self-hosted runner's labels, as the workflow's runs-on gives them after "self-hosted".
SelfHostedLabels = Annotated[
    tuple[RunnerLabel, ...],
    AfterValidator(_non_empty),
    AfterValidator(_unique("runner labels")),
    AfterValidator(_without_self_hosted),
]
WebUrl = Annotated[StrictStr, AfterValidator(_web_url)]


def _workflow_path(value: str) -> str:
    path = PurePosixPath(value)
    _check(
        len(path.parts) == 3
        and path.parts[:2] == (".github", "workflows")
        and path.suffix in (".yml", ".yaml"),
        'a path ".github/workflows/<name>.yml"',
    )
    return value


class CiRelease(_Model):
    """``[ci.release]``: the self-hosted runner the release job runs on (it writes the TUF folder
    the operator's web server serves: docs/ci.md), where it publishes, and where its keys come
    from. ``index``, ``upload_url`` and ``tuf_url`` replace ``[publish]``'s for the job."""

    runner_labels: SelfHostedLabels
    # "secrets": an operator-signed channel's keys come from the repository's secrets (written to
    # a private folder, given as --key-dir); "manifest": its [sign.*] and [publish.tuf_keys].
    keys: Literal["secrets", "manifest"] = "secrets"
    index: WebUrl | None = None
    upload_url: WebUrl | None = None
    tuf_url: WebUrl | None = None


class CiSettings(_Model):
    """``[ci]``: the GitHub Actions workflow that ``python -m release ci`` generates."""

    workflow: Annotated[StrictStr, AfterValidator(_workflow_path)]
    build_runner: RunnerLabel
    gpu_runner_labels: SelfHostedLabels
    gpu_python: PythonVersion
    # The channels a manual run may release, and the one a pushed v* tag releases (none: a tag
    # releases nothing).
    channels: Annotated[
        tuple[Name, ...], AfterValidator(_non_empty), AfterValidator(_unique("channels"))
    ]
    tag_channel: Name | None = None
    release: CiRelease | None = None


class Manifest(_Model):
    """A whole release manifest. Build it with ``load_manifest``."""

    schema_version: Annotated[StrictInt, AfterValidator(_schema_version)]
    release: ReleaseSettings
    build: BuildSettings
    payload: PayloadPolicy
    gates: dict[Name, GateSpec]
    sign: dict[Name, SignSpec]
    publish: PublishSettings
    ci: CiSettings | None = None

    _path: Path = PrivateAttr(default=Path("<manifest>"))

    @property
    def path(self) -> Path:
        """The file this manifest was loaded from."""
        return self._path

    def channel(self, name: str) -> ChannelSpec:
        """The channel called ``name``; a ManifestError names the known channels otherwise."""
        try:
            return self.release.channels[name]
        except KeyError:
            known = _choices(sorted(self.release.channels), "or")
            raise ManifestError(
                _line(self._path, ("release", "channels"), f"a channel {known}", _show(name))
            ) from None

    def _override_line(self, issue: _Issue, overrides: Mapping[str, str]) -> str:
        key = str(issue.loc[1]) if len(issue.loc) > 1 else ""
        option = f" (--{key.replace('_', '-')})" if key in overrides else ""
        where = f"{_dotted(issue.loc)}{option}"
        return f"{self._path}: {where}: expected {issue.expected}; got {issue.got}"

    def with_publish(self, **overrides: str) -> Manifest:
        """This manifest with ``[publish]`` keys given on the command line (``--index URL`` and
        the like), checked as the manifest's own; each error names the option."""
        data = self.publish.model_dump(exclude_none=True)
        if "index" in overrides:  # another index: the manifest's keys of its own index go too
            for key in _REMOTE_ONLY:
                data.pop(key, None)
        data.update(overrides)
        try:
            publish = PublishSettings.model_validate(data)
        except ValidationError as exc:
            found = [_from_pydantic(error) for error in exc.errors()]
            issues = [_Issue(("publish", *issue.loc), issue.expected, issue.got) for issue in found]
        else:
            issues = _publish_references(publish)
        if issues:
            lines = [self._override_line(issue, overrides) for issue in issues]
            raise ManifestError("\n".join(lines))
        updated = self.model_copy(update={"publish": publish})
        updated._path = self._path
        return updated


# --- loading and error reporting ---


@dataclass(frozen=True)
class _Issue:
    loc: Loc
    expected: str
    got: str


def load_manifest(path: Path) -> Manifest:
    """Read, validate and cross-check the manifest at ``path``."""
    text = _read_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(_syntax_error(path, exc)) from None
    except RecursionError:
        raise ManifestError(f"{path}: expected TOML of ordinary depth; got tables or arrays "
                            "nested too deep to read") from None  # fmt: skip
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        issues = [_from_pydantic(error) for error in exc.errors()]
    else:
        issues = _cross_references(manifest)
    if issues:
        raise ManifestError(
            "\n".join(_line(path, issue.loc, issue.expected, issue.got) for issue in issues)
        )
    manifest._path = path
    return manifest


def _read_text(path: Path) -> str:
    """The manifest's text: a regular file (never a FIFO or a device) of at most 1 MiB."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ManifestError(f"{path}: expected a regular manifest file; got a "
                                f"{_file_kind(info.st_mode)}")  # fmt: skip
        if info.st_size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{path}: expected a manifest of at most 1 MiB; got "
                                f"{info.st_size} bytes")  # fmt: skip
        with path.open("rb") as stream:
            data = stream.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise ManifestError(f"{path}: expected a manifest file; got no such file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ManifestError(f"{path!r}: expected a readable manifest file; got {exc}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: expected a manifest of at most 1 MiB; got more")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: expected UTF-8 text; got {exc.reason}") from None


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "device"),
             (stat.S_ISBLK, "device"), (stat.S_ISSOCK, "socket"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "special file")


def _cross_references(m: Manifest) -> list[_Issue]:
    """Checks that span tables: names that must refer to declared entries."""
    issues: list[_Issue] = []
    channels = m.release.channels
    known_channels = _choices(sorted(channels), "or")
    if m.release.default_channel not in channels:
        issues.append(
            _Issue(
                ("release", "default_channel"),
                f"a declared channel {known_channels}",
                _show(m.release.default_channel),
            )
        )
    missing = [name for name in REQUIRED_CHANNELS if name not in channels]
    if missing:
        issues.append(
            _Issue(
                ("release", "channels"),
                "channels that include " + _choices(REQUIRED_CHANNELS, "and"),
                _show(sorted(channels)),
            )
        )
    for name, channel in channels.items():
        loc: Loc = ("release", "channels", name)
        for index, gate in enumerate(channel.requires):
            if gate not in m.gates:
                issues.append(
                    _Issue(
                        (*loc, "requires", index),
                        "a gate declared in [gates.*], " + _choices(sorted(m.gates), "or"),
                        _show(gate),
                    )
                )
        unattested: dict[str, list[str]] = {}  # runner class -> required gates it runs
        for gate in channel.requires:
            runner = catalogue.runner_of(gate) if gate in catalogue.names() else None
            if runner is not None and runner not in channel.attesters:
                unattested.setdefault(runner, []).append(gate)
        for runner, gates in unattested.items():
            issues.append(
                _Issue(
                    (*loc, "attesters"),
                    f'keys for "{runner}", which runs the required {_choices(gates, "and")}',
                    _show(sorted(channel.attesters)),
                )
            )
        signer = m.sign.get(channel.signing)
        if signer is None:
            issues.append(
                _Issue(
                    (*loc, "signing"),
                    "a key declared in [sign.*], " + _choices(sorted(m.sign), "or"),
                    _show(channel.signing),
                )
            )
        elif name == "stable" and signer.generated:
            issues.append(
                _Issue(
                    (*loc, "signing"),
                    'a [sign.*] entry whose key is not "generate" (dev keys never sign stable)',
                    _show(channel.signing),
                )
            )
    issues += _pyproject_references(m)
    issues += _publish_references(m.publish)
    if m.build.stable_abi_from not in m.build.python:
        issues.append(
            _Issue(
                ("build", "stable_abi_from"),
                "one of build.python, " + _choices(m.build.python, "or"),
                _show(m.build.stable_abi_from),
            )
        )
    if m.ci is not None:
        issues += _ci_references(m, m.ci)
    issues += _gate_references(m)
    if "parity" in m.gates and not m.gates["parity"].cells:
        issues.append(
            _Issue(("gates", "parity", "cells"), "a non-empty array of parity cells", "nothing")
        )
    for name, gate in m.gates.items():
        if name != "warmup":
            continue
        for key in ("warmup_steps", "steady_steps"):
            if getattr(gate, key) is None:
                issues.append(
                    _Issue(
                        ("gates", name, key),
                        "a positive integer (the warm-up gate needs it)",
                        "nothing",
                    )
                )
    return issues


_REMOTE_KEYS = {
    "tuf_dir": "the folder the TUF repository is written to, which the operator serves beside a "
    "remote index",
    "tuf_url": "the URL that folder is served at",
}
# The [publish] keys that describe a remote index.
_REMOTE_ONLY = ("upload_url", *_REMOTE_KEYS)


def _publish_references(publish: PublishSettings) -> list[_Issue]:
    """A remote index needs its TUF folder and URL and an upload URL; the embedded one none."""
    issues: list[_Issue] = []
    if publish.embedded:
        for key in _REMOTE_ONLY:
            if (value := getattr(publish, key)) is not None:
                expected = 'nothing with index = "embedded" (it serves uploads and TUF itself)'
                issues.append(_Issue(("publish", key), expected, _show(value)))
        return issues
    for key, expected in _REMOTE_KEYS.items():
        if getattr(publish, key) is None:
            issues.append(_Issue(("publish", key), expected, "nothing"))
    if publish.upload_endpoint is None:
        expected = ("the URL twine uploads to (publish.index does not end in /simple/ or "
                    "/+simple/, so it cannot be derived)")  # fmt: skip
        issues.append(_Issue(("publish", "upload_url"), expected, "nothing"))
    return issues


def _pyproject_references(m: Manifest) -> list[_Issue]:
    """The release is the distribution pyproject.toml builds, for Pythons it allows."""
    project = pyproject().get("project", {})
    issues: list[_Issue] = []
    name = project.get("name")
    if m.release.name != name:
        expected = f"{_show(name)}, the name pyproject.toml builds ({PYPROJECT})"
        issues.append(_Issue(("release", "name"), expected, _show(m.release.name)))
    allowed = SpecifierSet(project.get("requires-python", ""))
    for index, version in enumerate(m.build.python):
        if f"{version}.0" not in allowed:
            expected = f"a version pyproject.toml's requires-python ({allowed}) allows"
            issues.append(_Issue(("build", "python", index), expected, _show(version)))
    return issues


# The parameters each gate reads; any other gate given one would silently ignore it.
_GATE_PARAMETERS = {"warmup": ("warmup_steps", "steady_steps"), "parity": ("cells", "gpu_cells")}


def _gate_references(m: Manifest) -> list[_Issue]:
    """[gates.<name>] names a gate of the registry, on the runner that gate needs, with only the
    parameters that gate reads."""
    issues: list[_Issue] = []
    known = catalogue.names()
    for name, gate in m.gates.items():
        takes = _GATE_PARAMETERS.get(name, ())
        for key in (k for ks in _GATE_PARAMETERS.values() for k in ks):
            if key not in takes and getattr(gate, key) is not None:
                expected = f"one of {', '.join(takes)}" if takes else "no parameters"
                issues.append(_Issue(("gates", name, key),
                                     f"no {key}: the {name} gate reads {expected}",
                                     "a value it would ignore"))  # fmt: skip
        if name not in known:
            issues.append(
                _Issue(
                    ("gates", name),
                    "a gate the pipeline has, " + _choices(known, "or"),
                    "an unknown gate",
                )
            )
        elif gate.runner != catalogue.runner_of(name):
            needed = catalogue.runner_of(name)
            issues.append(
                _Issue(
                    ("gates", name, "runner"),
                    f'"{needed}" (the {name} gate runs there)',
                    _show(gate.runner),
                )
            )
    return issues


def _ci_references(m: Manifest, ci: CiSettings) -> list[_Issue]:
    """[ci] names a declared Python version and declared channels, its tag channel among them."""
    issues: list[_Issue] = []
    if ci.gpu_python not in m.build.python:
        issues.append(
            _Issue(
                ("ci", "gpu_python"),
                "one of build.python, " + _choices(m.build.python, "or"),
                _show(ci.gpu_python),
            )
        )
    # A missing required channel is reported once, at release.channels.
    known = set(m.release.channels) | set(REQUIRED_CHANNELS)
    for index, channel in enumerate(ci.channels):
        if channel not in known:
            issues.append(
                _Issue(
                    ("ci", "channels", index),
                    "a declared channel " + _choices(sorted(m.release.channels), "or"),
                    _show(channel),
                )
            )
    if ci.tag_channel is not None and ci.tag_channel not in ci.channels:
        issues.append(
            _Issue(
                ("ci", "tag_channel"),
                "one of ci.channels, " + _choices(ci.channels, "or"),
                _show(ci.tag_channel),
            )
        )
    return issues


_EXPECTED_BY_TYPE = {
    "string_type": "a string",
    "int_type": "an integer",
    "greater_than": "an integer greater than 0",
    "greater_than_equal": "an integer of 0 or more",
    "tuple_type": "an array",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


def _from_pydantic(error: Any) -> _Issue:
    """One pydantic error as an _Issue that says what was expected."""
    loc: Loc = tuple(error["loc"])
    kind = error["type"]
    got = _show(error["input"])
    if kind == "manifest":
        expected = error["msg"]
    elif kind == "missing":
        expected, got = "this key (it is required)", "nothing"
    elif kind == "extra_forbidden":
        keys = _known_keys(loc[:-1])
        expected = "one of the keys " + ", ".join(keys) if keys else "no such key"
        got = "an unknown key"
    elif kind in ("less_than_equal", "less_than"):
        bound = error["ctx"].get("le", error["ctx"].get("lt"))
        expected = f"an integer {'at most' if kind == 'less_than_equal' else 'below'} {bound}"
    elif kind == "literal_error":
        choices = error["ctx"]["expected"].replace("'", '"')
        expected = f"one of {choices}" if " or " in choices else choices
    else:
        expected = _EXPECTED_BY_TYPE.get(kind, f"a valid value ({error['msg']})")
    if loc and loc[-1] == "[key]":
        loc, expected = loc[:-1], f"{expected} (as a table name)"
    return _Issue(loc, expected, got)


def _known_keys(loc: Loc) -> list[str]:
    """The keys the schema allows in the table at ``loc`` (empty if it cannot tell)."""
    node: Any = Manifest
    for part in loc:
        node = _unwrapped(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            if field is None:
                return []
            node = field.annotation
        elif get_origin(node) in (dict, tuple):
            node = get_args(node)[-1 if get_origin(node) is dict else 0]
        else:
            return []
    node = _unwrapped(node)
    if isinstance(node, type) and issubclass(node, BaseModel):
        return list(node.model_fields)
    return []


def _unwrapped(node: Any) -> Any:
    """The type under Annotated[...] and Optional[...] (an optional table lists X's keys)."""
    while True:
        if get_origin(node) is Annotated:
            node = get_args(node)[0]
        elif get_origin(node) in (Union, UnionType):
            node = next(a for a in get_args(node) if a is not type(None))
        else:
            return node


def _syntax_error(path: Path, exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if match is None:
        return f"{path}: expected valid TOML; got {message}"
    where = f"line {match.group(1)}, column {match.group(2)}"
    return f"{path}: {where}: expected valid TOML; got {message[: match.start()]}"


def _line(path: Path, loc: Loc, expected: str, got: str) -> str:
    return f"{path}: {_dotted(loc)}: expected {expected}; got {got}"


def _dotted(loc: Loc) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else f".{_key(part)}" if key else _key(part)
    return key or "<top level>"


def _key(part: object) -> str:
    """A key as an error shows it: quoted and escaped if it holds what a terminal would act on
    or hide (control or non-printing characters), shortened if long."""
    text = str(part)
    if not text.isprintable() or " " in text:
        text = json.dumps(text)
    return text if len(text) <= 60 else text[:57] + "..."


def _show(value: object, limit: int = 80) -> str:
    """A value as TOML-like text, shortened, with a URL's userinfo and query masked."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    # What a terminal would act on or hide (bidi overrides, zero-width): escaped as JSON would.
    text = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)
    text = mask_urls(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _choices(items: Sequence[str], conjunction: str) -> str:
    quoted = [f'"{item}"' for item in items]
    if len(quoted) <= 1:
        return "".join(quoted) or "(none declared)"
    return f"{', '.join(quoted[:-1])} {conjunction} {quoted[-1]}"
