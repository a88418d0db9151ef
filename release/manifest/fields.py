"""The manifest's field checks: each returns the value or raises with the phrase that follows
"expected" in its error line, and the constants they check against (the generic ones, and the
strict base model, are release/util/schema.py's)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated
from urllib.parse import urlsplit

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, Field, StrictInt, StrictStr

from release.manifest.messages import choices
from release.util.schema import pattern, require
from release.util.urls import url_secrets

SCHEMA_VERSION = 1
CUDA_ARCHITECTURES = ("75", "80", "86", "89", "90", "100", "103", "120")
REQUIRED_ARCHITECTURES = ("80", "90")
REQUIRED_CHANNELS = ("dev", "stable")
# The private key URI schemes securesystemslib signs with (SIGNER_FOR_URI_SCHEME; its "envvar:" is a
# CryptoSigner option for a key's location, not a signer, and fails at sign).
SIGNER_SCHEMES = ("gcpkms", "awskms", "azurekms", "hsm", "file2", "hv", "gnupg", "tkey")
MAX_MANIFEST_BYTES = 1 << 20
LOCAL_HOSTS = ("127.0.0.1", "localhost")
MIN_ABI3_PYTHON = (3, 12)


def schema_version(value: int) -> int:
    require(value == SCHEMA_VERSION, f"{SCHEMA_VERSION} (the only schema this pipeline reads)")
    return value


def _python_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def _python_version(value: str) -> str:
    match = re.fullmatch(r"3\.(0|[1-9][0-9]?)", value)
    require(
        match is not None and 8 <= int(match.group(1)) <= 14,
        'a Python version "3.N" with N from 8 to 14',
    )
    return value


def python_list(value: tuple[str, ...]) -> tuple[str, ...]:
    ordered = sorted(set(value), key=_python_tuple)
    require(list(value) == ordered, "Python versions without duplicates, in ascending order")
    return value


def abi3_version(value: str) -> str:
    require(_python_tuple(value) >= MIN_ABI3_PYTHON, '"3.12" or newer (the stable ABI of nanobind)')
    return value


def architectures(value: tuple[str, ...]) -> tuple[str, ...]:
    missing = [arch for arch in REQUIRED_ARCHITECTURES if arch not in value]
    require(not missing, "architectures that include " + choices(REQUIRED_ARCHITECTURES, "and"))
    return value


def shim_path(value: str) -> str:
    path = PurePosixPath(value)
    require(
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


def exact_version(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        require(False, 'an exact version such as "0.33.0" (no specifiers)')
    return value


def specifier_set(value: str) -> str:
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        require(False, 'a version range such as ">=0.32,<0.34" (PEP 440 specifiers)')
    require(bool(value.strip()), 'a version range such as ">=0.32,<0.34", not an empty one')
    return value


def signing_key(value: str) -> str:
    scheme, colon, rest = value.partition(":")
    require(
        value == "generate"
        or (scheme == "file" and PurePosixPath(rest).is_absolute())
        or (scheme in SIGNER_SCHEMES and colon == ":"),
        '"generate", "file:<absolute path>" or a signer URI "<scheme>:..." with scheme '
        + choices(SIGNER_SCHEMES, "or"),
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


def index_url(value: str) -> str:
    require(value == "embedded" or _is_web_url(value), f'"embedded" or {_WEB_URL}')
    return value


def web_url(value: str) -> str:
    require(_is_web_url(value), _WEB_URL)
    return value


def folder_name(value: str) -> str:
    no_control_characters(value)
    require(value.strip() != "", "a folder path")
    return value


def index_root(simple_url: str) -> str | None:
    """The folder a simple URL of a server's usual shape stands in: devpi's
    ``…/USER/INDEX/+simple/`` in ``…/USER/INDEX/`` (where it takes uploads), pypiserver's and the
    embedded index's ``…/simple/`` in the root (uploads there; the embedded index serves ``tuf/``
    beside it). None for any other shape."""
    base = urlsplit(simple_url)._replace(query="", fragment="").geturl().rstrip("/")
    parent, _, last = base.rpartition("/")
    return parent + "/" if last in ("simple", "+simple") and "//" in parent else None


def no_control_characters(value: str) -> None:
    require(
        not any(ord(c) < 0x20 or ord(c) == 0x7F for c in value),
        "a path without control characters (newline, NUL, ...)",
    )


def relative_dir(value: str) -> str:
    no_control_characters(value)
    path = PurePosixPath(value)
    require(
        value.strip() != "" and not path.is_absolute() and ".." not in path.parts,
        'a relative path without ".."',
    )
    return value


def state_dir(value: str) -> str:
    """Where keys and credentials live: a folder of its own inside the checkout."""
    relative_dir(value)
    parts = PurePosixPath(value).parts
    require(bool(parts), "a folder of its own, not the checkout itself (keys would lie untracked)")
    require(parts[0] != ".git", "a folder outside .git")
    require(parts[0] != "out", "a folder apart from the outputs (out/), which are handed on")
    return value


Name = Annotated[
    StrictStr,
    AfterValidator(
        pattern(
            r"[a-z][a-z0-9_-]*",
            "a name of lowercase letters, digits, '_' and '-' that starts with a letter",
        )
    ),
]


DistributionName = Annotated[
    StrictStr,
    AfterValidator(
        pattern(
            r"[a-z0-9]|[a-z0-9][a-z0-9._-]*[a-z0-9]",
            "a distribution name (ASCII letters, digits, '.', '_', '-'; starts and ends "
            "alphanumeric)",
            re.IGNORECASE | re.ASCII,
        )
    ),
]


PythonVersion = Annotated[StrictStr, AfterValidator(_python_version)]


PositiveInt = Annotated[StrictInt, Field(gt=0)]
