"""The manifest's schema: one frozen model per table, each field checked as it is read."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from packaging.specifiers import SpecifierSet
from packaging.version import Version
from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    PrivateAttr,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from release import catalogue
from release.catalogue import GateSettings
from release.errors import ManifestError
from release.manifest.fields import (
    CUDA_ARCHITECTURES,
    DistributionName,
    Name,
    PythonVersion,
    abi3_version,
    architectures,
    exact_version,
    folder_name,
    index_root,
    index_url,
    no_control_characters,
    python_list,
    relative_dir,
    schema_version,
    shim_path,
    signing_key,
    specifier_set,
    state_dir,
    web_url,
)
from release.manifest.messages import (
    Issue,
    choices,
    dotted,
    error_line,
    from_pydantic,
    known_keys,
    shown,
)
from release.util.limits import NetworkLimits
from release.util.schema import StrictModel, non_empty, pattern, require, unique


def _shims(value: tuple[Shim, ...]) -> tuple[Shim, ...]:
    paths = [shim.path for shim in value]
    require(len(set(paths)) == len(paths), "shims with distinct paths")
    return value


SIGNING_KEY_ATTESTER = "signing-key"


def _attester(value: str) -> str:
    path = PurePosixPath(value)
    require(
        value == SIGNING_KEY_ATTESTER
        or (not path.is_absolute() and ".." not in path.parts and value.endswith(".pub.json")),
        f'"{SIGNING_KEY_ATTESTER}" (the channel\'s signing key) or the path of a public key file '
        '"<name>.pub.json" relative to the manifest, without ".."',
    )
    return value


Attester = Annotated[StrictStr, AfterValidator(_attester)]


def _public_key_file(value: str) -> str:
    no_control_characters(value)
    named = value.endswith(".pub.json") and PurePosixPath(value).name != ".pub.json"
    require(named, 'the path of a public key file "<name>.pub.json" (relative: to the manifest)')
    return value


def _pinned_key(value: str) -> str:
    no_control_characters(value)
    path = PurePosixPath(value)
    require(
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
    AfterValidator(non_empty),
    AfterValidator(unique("pinned keys")),
]


class PinnedKeys(StrictModel):
    """``[release.channels.<name>.pinned]``: the only public keys that sign the channel: its
    provenance and CPU gate attestations (``signing``) and each TUF role's metadata of its index.
    Rotating a key is a commit of this table (docs/trust.md, "Pinned keys")."""

    signing: PinnedKeyList
    root: PinnedKeyList
    targets: PinnedKeyList
    snapshot: PinnedKeyList
    timestamp: PinnedKeyList


class ChannelSpec(StrictModel):
    """``[release.channels.<name>]``: the gates a channel requires, the key that signs it, and
    whose gate attestations it takes."""

    requires: Annotated[
        tuple[Name, ...], AfterValidator(non_empty), AfterValidator(unique("gate names"))
    ]
    signing: Name
    # Per runner class, the keys whose gate attestations count (release/trust/attestation.py).
    attesters: dict[
        Literal["cpu", "gpu"],
        Annotated[
            tuple[Attester, ...], AfterValidator(non_empty), AfterValidator(unique("attesters"))
        ],
    ] = Field(default_factory=lambda: {"cpu": (SIGNING_KEY_ATTESTER,)})
    # Folders of the checkout holding attestations made elsewhere (a GPU runner's), taken when
    # they name exactly the digests being published.
    attestations: Annotated[
        tuple[Annotated[StrictStr, AfterValidator(relative_dir)], ...],
        AfterValidator(unique("folders")),
    ] = ()
    # Required where the channel signs with an operator's key (not "generate"): a key is taken
    # only when pinned here, whatever file or folder holds it (release/trust/pins.py).
    pinned: PinnedKeys | None = None


class ReleaseSettings(StrictModel):
    """``[release]``."""

    name: DistributionName
    version_source: Literal["pyproject"]
    default_channel: Name
    channels: dict[Name, ChannelSpec]


class Toolchain(StrictModel):
    """``[build.toolchain]``."""

    kind: Literal["hermetic", "cibuildwheel"]
    cuda_host_compiler: Annotated[
        StrictStr, AfterValidator(pattern(r"\S+", "a program name without spaces"))
    ]


class CudaSettings(StrictModel):
    """``[build.cuda]``."""

    version: Annotated[
        StrictStr, AfterValidator(pattern(r"[0-9]+\.[0-9]+", 'a CUDA version such as "13.0"'))
    ]
    architectures: Annotated[
        tuple[
            Annotated[
                StrictStr,
                AfterValidator(
                    pattern(
                        "|".join(CUDA_ARCHITECTURES),
                        "a compute capability, one of "
                        + ", ".join(f'"{arch}"' for arch in CUDA_ARCHITECTURES),
                    )
                ),
            ],
            ...,
        ],
        AfterValidator(non_empty),
        AfterValidator(unique("architectures")),
        AfterValidator(architectures),
    ]
    runtime: Literal["static"]


class BuildSettings(StrictModel):
    """``[build]``: the interpreters, the platform policy and how the native code is compiled."""

    python: Annotated[
        tuple[PythonVersion, ...], AfterValidator(non_empty), AfterValidator(python_list)
    ]
    stable_abi_from: Annotated[PythonVersion, AfterValidator(abi3_version)]
    platform: Annotated[
        StrictStr,
        AfterValidator(
            pattern(
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


_SHA256 = Annotated[
    StrictStr, AfterValidator(pattern(r"[0-9a-f]{64}", "64 lowercase hex digits (sha256)"))
]


class FrameworkPin(StrictModel):
    """One ``payload.shims[].versions`` entry: a framework release the shim cites, and the sha256
    of that release's wheel, whose files the citations are checked against (the framework's own
    file, not any wheel that carries its name and version)."""

    version: Annotated[StrictStr, AfterValidator(exact_version)]
    sha256: _SHA256 | None = None


def _pins(value: tuple[FrameworkPin, ...]) -> tuple[FrameworkPin, ...]:
    versions = [Version(pin.version) for pin in value]
    require(bool(versions), "at least one framework version")
    require(versions == sorted(set(versions)), "distinct versions, oldest first")
    return value


class Shim(StrictModel):
    """One ``payload.shims`` entry: a Python file the wheel may hold, the framework releases it
    supports (``supports``, the range the native module refuses any other release by) and the
    pinned release of each that every code line cites (``versions``)."""

    path: Annotated[StrictStr, AfterValidator(shim_path)]
    framework: DistributionName
    supports: Annotated[StrictStr, AfterValidator(specifier_set)]
    versions: Annotated[tuple[FrameworkPin, ...], AfterValidator(_pins)]
    sha256: _SHA256

    @model_validator(mode="after")
    def _pins_supported(self) -> Shim:
        supported = SpecifierSet(self.supports)
        outside = [p.version for p in self.versions if not supported.contains(p.version, True)]
        require(not outside, f"versions inside supports {self.supports!r}; got {outside}")
        return self


FileKind = Literal["extension", "stub", "typed-marker", "metadata", "license", "shim", "sbom"]


class PayloadPolicy(StrictModel):
    """``[payload]``."""

    allowed_kinds: Annotated[tuple[FileKind, ...], AfterValidator(unique("file kinds"))]
    shims: Annotated[tuple[Shim, ...], AfterValidator(_shims)]
    # The SBOM every wheel must carry as <dist-info>/sboms/<sbom> (PEP 770), checked against the
    # wheel's own modules (release/gates/sbom.py); none required when absent.
    sbom: (
        Annotated[
            StrictStr,
            AfterValidator(
                pattern(
                    r"[a-z0-9][a-z0-9._-]*\.cdx\.json",
                    "a file name like activekv.cdx.json (CycloneDX JSON)",
                )
            ),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _sbom_is_allowed(self) -> PayloadPolicy:
        require(self.sbom is None or "sbom" in self.allowed_kinds,
               '"sbom" among payload.allowed_kinds, since payload.sbom requires one')  # fmt: skip
        return self


class SignSpec(StrictModel):
    """``[sign.<name>]``: a key reference (never the key itself)."""

    key: Annotated[StrictStr, AfterValidator(signing_key)]
    # The signer's public key file (*.pub.json); a signer URI key needs it (release/trust/sign.py).
    public_key: Annotated[StrictStr, AfterValidator(_public_key_file)] | None = None

    @property
    def generated(self) -> bool:
        """True for a key generated on first use (a dev key)."""
        return self.key == "generate"


class TufKeys(StrictModel):
    """``[publish.tuf_keys.<role>]``: the key reference of each TUF role of the index (as in
    ``[sign.*]``). Without this table the roles' keys are generated (dev only)."""

    root: SignSpec
    targets: SignSpec
    snapshot: SignSpec
    timestamp: SignSpec


class PublishSettings(StrictModel):
    """``[publish]``."""

    index: Annotated[StrictStr, AfterValidator(index_url)]
    username: Annotated[
        StrictStr,
        AfterValidator(pattern(r"[A-Za-z0-9._-]+", "a user name of [A-Za-z0-9._-] characters")),
    ]
    state_dir: Annotated[StrictStr, AfterValidator(state_dir)]
    tuf_keys: TufKeys | None = None
    # A remote index (``index`` is its PEP 503 simple URL): where twine uploads (default: the
    # server's convention, see index_root), the folder the TUF repository is written
    # to (relative to the manifest's folder), which the operator serves at ``tuf_url``.
    upload_url: Annotated[StrictStr, AfterValidator(web_url)] | None = None
    tuf_dir: Annotated[StrictStr, AfterValidator(folder_name)] | None = None
    tuf_url: Annotated[StrictStr, AfterValidator(web_url)] | None = None
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
        pattern(
            r"[A-Za-z0-9][A-Za-z0-9._-]*",
            "a runner label of letters, digits, '.', '_' and '-' that starts alphanumeric",
        )
    ),
]


def _without_self_hosted(value: tuple[str, ...]) -> tuple[str, ...]:
    require(
        "self-hosted" not in value,
        'labels without "self-hosted" (the workflow adds it before them)',
    )
    return value


# A self-hosted runner's labels, as the workflow's runs-on gives them after "self-hosted".
SelfHostedLabels = Annotated[
    tuple[RunnerLabel, ...],
    AfterValidator(non_empty),
    AfterValidator(unique("runner labels")),
    AfterValidator(_without_self_hosted),
]


WebUrl = Annotated[StrictStr, AfterValidator(web_url)]


def _workflow_path(value: str) -> str:
    path = PurePosixPath(value)
    require(
        len(path.parts) == 3
        and path.parts[:2] == (".github", "workflows")
        and path.suffix in (".yml", ".yaml"),
        'a path ".github/workflows/<name>.yml"',
    )
    return value


class CiRelease(StrictModel):
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


class CiSettings(StrictModel):
    """``[ci]``: the GitHub Actions workflow that ``python -m release ci`` generates."""

    workflow: Annotated[StrictStr, AfterValidator(_workflow_path)]
    build_runner: RunnerLabel
    gpu_runner_labels: SelfHostedLabels
    gpu_python: PythonVersion
    # The channels a manual run may release, and the one a pushed v* tag releases (none: a tag
    # releases nothing).
    channels: Annotated[
        tuple[Name, ...], AfterValidator(non_empty), AfterValidator(unique("channels"))
    ]
    tag_channel: Name | None = None
    release: CiRelease | None = None


def _gate_tables(value: Any, handler: ValidatorFunctionWrapHandler) -> dict[str, GateSettings]:
    """``[gates.<name>]``, each validated by the model its gate declares in the catalogue; the
    errors of all of them at once, each at ``gates.<name>.<key>``."""
    if not isinstance(value, dict):
        return handler(value)
    tables: dict[Any, Any] = {}
    errors: list[InitErrorDetails] = []
    for name, table in value.items():
        if not isinstance(name, str) or not isinstance(table, dict):
            tables[name] = table  # the handler names it
            continue
        model = catalogue.settings_of(name)
        try:
            tables[name] = model.model_validate(table)
        except ValidationError as error:
            errors += [_at_gate(name, model, e) for e in error.errors()]
    if errors:
        raise ValidationError.from_exception_data("gates", errors)
    return handler(tables)


def _at_gate(name: str, model: type[BaseModel], error: ErrorDetails) -> InitErrorDetails:
    """`error` of validating `model` as one of ``[gates.<name>]``'s, at its place in the
    manifest; an unknown key's error carries the keys that table allows."""
    ctx = dict(error.get("ctx") or {})
    if error["type"] == "extra_forbidden":
        ctx["keys"] = known_keys(model, tuple(error["loc"][:-1]))
    return InitErrorDetails(
        type=PydanticCustomError(error["type"], error["msg"], ctx),
        loc=(name, *error["loc"]),
        input=error["input"],
    )


class Manifest(StrictModel):
    """A whole release manifest. Build it with ``load_manifest``."""

    schema_version: Annotated[StrictInt, AfterValidator(schema_version)]
    release: ReleaseSettings
    build: BuildSettings
    payload: PayloadPolicy
    # Each table is checked against its own gate's model (release/catalogue.py).
    gates: Annotated[dict[Name, GateSettings], WrapValidator(_gate_tables)]
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
            known = choices(sorted(self.release.channels), "or")
            raise ManifestError(
                error_line(self._path, ("release", "channels"), f"a channel {known}", shown(name))
            ) from None

    def _override_line(self, issue: Issue, overrides: Mapping[str, str]) -> str:
        key = str(issue.loc[1]) if len(issue.loc) > 1 else ""
        option = f" (--{key.replace('_', '-')})" if key in overrides else ""
        where = f"{dotted(issue.loc)}{option}"
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
            found = [from_pydantic(error, PublishSettings) for error in exc.errors()]
            issues = [Issue(("publish", *issue.loc), issue.expected, issue.got) for issue in found]
        else:
            issues = publish_references(publish)
        if issues:
            lines = [self._override_line(issue, overrides) for issue in issues]
            raise ManifestError("\n".join(lines))
        updated = self.model_copy(update={"publish": publish})
        updated._path = self._path
        return updated


_REMOTE_KEYS = {
    "tuf_dir": "the folder the TUF repository is written to, which the operator serves beside a "
    "remote index",
    "tuf_url": "the URL that folder is served at",
}


# The [publish] keys that describe a remote index.
_REMOTE_ONLY = ("upload_url", *_REMOTE_KEYS)


def publish_references(publish: PublishSettings) -> list[Issue]:
    """A remote index needs its TUF folder and URL and an upload URL; the embedded one none."""
    issues: list[Issue] = []
    if publish.embedded:
        for key in _REMOTE_ONLY:
            if (value := getattr(publish, key)) is not None:
                expected = 'nothing with index = "embedded" (it serves uploads and TUF itself)'
                issues.append(Issue(("publish", key), expected, shown(value)))
        return issues
    for key, expected in _REMOTE_KEYS.items():
        if getattr(publish, key) is None:
            issues.append(Issue(("publish", key), expected, "nothing"))
    if publish.upload_endpoint is None:
        expected = ("the URL twine uploads to (publish.index does not end in /simple/ or "
                    "/+simple/, so it cannot be derived)")  # fmt: skip
        issues.append(Issue(("publish", "upload_url"), expected, "nothing"))
    return issues
