"""What twine's own configuration says about one upload URL, read as twine reads it: the
``TWINE_USERNAME``, ``TWINE_PASSWORD``, ``TWINE_REPOSITORY_URL`` and ``TWINE_CERT`` variables, and
the ``~/.pypirc`` section whose ``repository`` is that URL (twine's own parser,
``twine.utils.get_config``, ``[server-login]`` defaults included).

twine picks a ``.pypirc`` section by name (``-r NAME``); the release knows only the manifest's
upload URL, so the section is the first, in ``index-servers`` order, whose ``repository`` is that
URL (a trailing ``/``, the case of scheme and host and a default port aside).
"""

from __future__ import annotations

import configparser
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from twine import exceptions as twine_exceptions
from twine import utils as twine_utils

from release.errors import PublishError
from release.util.urls import masked_url

ENV_USERNAME = "TWINE_USERNAME"
ENV_PASSWORD = "TWINE_PASSWORD"
ENV_REPOSITORY_URL = "TWINE_REPOSITORY_URL"
ENV_CERT = "TWINE_CERT"
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class PypircSection:
    """One ``.pypirc`` section: what twine would upload to that repository with."""

    path: Path
    name: str
    username: str | None
    password: str | None = field(repr=False)
    ca_cert: str | None
    client_cert: str | None

    @property
    def named(self) -> str:
        """How errors name it: the file and the section, never a value."""
        return f"{self.path} [{self.name}]"


@dataclass(frozen=True)
class Tls:
    """twine's TLS settings for an upload URL: the CA bundle (``TWINE_CERT``, else the section's
    ``ca_cert``; None: requests' own, ``REQUESTS_CA_BUNDLE`` included) and a client certificate
    (the section's ``client_cert``)."""

    cacert: str | None = None
    client_cert: str | None = None


@dataclass(frozen=True)
class TwineEnvironment:
    """The ``TWINE_*`` credentials, scoped as twine scopes them: to ``TWINE_REPOSITORY_URL``
    when it is set (its userinfo, if any, is a user and password too)."""

    username: str | None
    password: str | None = field(repr=False)
    url_username: str | None
    url_password: str | None = field(repr=False)
    repository_url: str | None  # without its userinfo


def same_url(one: str, other: str) -> bool:
    """Whether two upload URLs name the same endpoint (userinfo, a trailing ``/``, the case of
    scheme and host and a default port aside)."""
    return _url_key(one) == _url_key(other)


def _url_key(url: str) -> tuple[str, str, int | None, str, str]:
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:  # not a URL urllib reads: only the same text is the same
        return url, "", None, "", ""
    scheme = parts.scheme.lower()
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:  # not a number: compared as written
        port = None
    return scheme, (parts.hostname or "").lower(), port, parts.path.rstrip("/"), parts.query


def pypirc_path(environ: Mapping[str, str] = os.environ) -> Path:
    """twine's default configuration file, ``~/.pypirc`` (``HOME`` of ``environ``)."""
    home = environ.get("HOME")
    return (Path(home) if home else Path.home()) / ".pypirc"


def pypirc_section(upload_url: str, path: Path) -> PypircSection | None:
    """The first section of ``path`` whose repository is ``upload_url``; None without one (or
    without the file, as twine takes a missing ``~/.pypirc``). PublishError naming the file when
    twine could not read it (never quoting it: it holds passwords)."""
    if not path.is_file():
        return None
    try:
        config = twine_utils.get_config(str(path))
    except configparser.Error as exc:
        raise PublishError(f"{path}: not a .pypirc twine can read ({type(exc).__name__}); fix "
                           "it or move it aside; nothing was uploaded") from None  # fmt: skip
    except (OSError, twine_exceptions.TwineException) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise PublishError(f"{path}: cannot be read ({reason}); nothing was uploaded") from None
    for name, section in config.items():
        repository = section.get("repository")
        if repository and same_url(repository, upload_url):
            return PypircSection(
                path, name, section.get("username"), section.get("password"),
                section.get("ca_cert"), section.get("client_cert"),
            )  # fmt: skip
    return None


def twine_environment(environ: Mapping[str, str] = os.environ) -> TwineEnvironment:
    """The ``TWINE_*`` credentials of ``environ`` (an empty variable is unset, as for twine)."""
    url = environ.get(ENV_REPOSITORY_URL) or None
    url_username = url_password = None
    if url:
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError as exc:
            raise PublishError(f"{ENV_REPOSITORY_URL}: expected a URL; got one urllib cannot read "
                               f"({exc}); nothing was uploaded") from None  # fmt: skip
        url_username = urllib.parse.unquote(parts.username) if parts.username else None
        url_password = urllib.parse.unquote(parts.password) if parts.password else None
        if parts.username is not None or parts.password is not None:
            netloc = parts.netloc.rpartition("@")[2]
            url = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return TwineEnvironment(
        environ.get(ENV_USERNAME) or None, environ.get(ENV_PASSWORD) or None,
        url_username, url_password, url,
    )  # fmt: skip


def check_scope(twine: TwineEnvironment, upload_url: str) -> None:
    """PublishError when ``TWINE_REPOSITORY_URL`` names another index than ``upload_url`` while
    ``TWINE_*`` credentials would be used: twine would send them there, not here."""
    if twine.repository_url is None or same_url(twine.repository_url, upload_url):
        return
    raise PublishError(
        f"{ENV_REPOSITORY_URL} is {masked_url(twine.repository_url)}, but the release uploads to "
        f"{upload_url} (publish.upload_url, or the index's convention); the TWINE_* credentials "
        f"go with {ENV_REPOSITORY_URL}, so they are not sent here: set publish.upload_url (or "
        f"--upload-url) to it, unset {ENV_REPOSITORY_URL}, or set ACTIVEKV_INDEX_PASSWORD or "
        "ACTIVEKV_INDEX_TOKEN, which come first; nothing was uploaded"
    )


def tls_for(upload_url: str, section: PypircSection | None,
            environ: Mapping[str, str] = os.environ) -> Tls:  # fmt: skip
    """twine's TLS settings for ``upload_url``: ``TWINE_CERT`` over the section's ``ca_cert``."""
    cacert = environ.get(ENV_CERT) or (section.ca_cert if section else None)
    return Tls(cacert=cacert, client_cert=section.client_cert if section else None)
