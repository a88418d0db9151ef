"""A package index its operator already runs (devpi-server, pypiserver, or any index twine can
upload to), and the TUF repository written to a folder the operator serves beside it.

Credentials come from the environment, twine's configuration or keyring, never from the manifest,
and are never printed. The first source that gives a password wins, with that source's user:

1. ``ACTIVEKV_INDEX_TOKEN`` (an API token, user ``__token__``);
2. ``ACTIVEKV_INDEX_PASSWORD``, user ``ACTIVEKV_INDEX_USERNAME`` (default: ``publish.username``);
3. ``TWINE_PASSWORD``, user ``TWINE_USERNAME`` (default: ``publish.username``), then the user and
   password in ``TWINE_REPOSITORY_URL``; twine sends these to ``TWINE_REPOSITORY_URL`` when it is
   set, so one naming another URL than the upload URL is refused rather than followed or ignored;
4. the ``~/.pypirc`` section whose ``repository`` is the upload URL (release/trust/twine_config.py);
5. keyring's password for the upload URL and the first user named above.

Before anything is uploaded they are tried on the upload URL, on twine's own HTTP stack
(release/trust/twine_upload.py), with an upload that carries no file: a server that answers 401
or 403 refuses them, and the publish stops naming the index and where the credentials came from.

The publish rules are the embedded index's (release/trust/publish.py): this module only says where
files go and whether the server itself would replace a file (devpi's ``volatile`` indexes), which
the pipeline never does either way.
"""

from __future__ import annotations

import json
import os
import urllib.error
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import requests

from release.errors import PublishError
from release.manifest import NetworkLimits
from release.trust import twine_config, twine_upload
from release.trust.credential_names import ENV_PASSWORD, ENV_TOKEN, ENV_USERNAME
from release.trust.twine_config import Tls
from release.util import http


@dataclass
class RemoteIndex:
    """What :class:`release.trust.publish.IndexTarget` needs of a remote index, and where its TUF
    repository and signed statements are written (``tuf_dir``, served at ``tuf_url``)."""

    simple_url: str
    url: str  # where twine uploads
    tuf_dir: Path
    tuf_url: str
    keys_dir: Path  # the TUF roles' generated (dev) keys: never under tuf_dir, which is served
    default_username: str
    upload: bool = False  # opened to upload: credentials found and tried at __enter__
    limits: NetworkLimits = NetworkLimits()  # noqa: RUF009 (frozen: one shared default is fine)
    # Never in repr: a traceback or log that shows the index must not show its password.
    _credentials: Credentials | None = field(default=None, repr=False)

    @property
    def provenance_dir(self) -> Path:
        """The signed statements and attestations, TUF targets ``provenance/…``."""
        return self.tuf_dir / "targets" / "provenance"

    @property
    def username(self) -> str:
        return self._opened().username

    @property
    def password(self) -> str:
        return self._opened().password

    def __enter__(self) -> RemoteIndex:
        if self.upload:
            credentials = resolve_credentials(self.url, self.default_username)
            check_credentials(self.url, credentials.username, credentials.password,
                              limits=self.limits, tls=credentials.tls,
                              source=credentials.source)  # fmt: skip
            self._credentials = credentials
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._credentials = None

    def _opened(self) -> Credentials:
        if self._credentials is None:
            raise PublishError(f"{self.url}: not opened to upload (use it as `with` block)")
        return self._credentials

    def overwrite_note(self) -> str | None:
        """What the server would do with a file of a name it has: a devpi index with
        ``volatile`` replaces it. None where the server does not say (pypiserver does not)."""
        try:
            _, body = http.get(self.url, limits=self.limits, headers={"Accept": "application/json"},
                               error=PublishError)  # fmt: skip
            document = json.loads(body)
        except urllib.error.HTTPError as exc:
            exc.close()
            return None
        except (urllib.error.URLError, ValueError):
            return None  # it does not say
        except PublishError as exc:  # past publish.limits: the note says so, in its one line
            return f"whether the server would have let it is unknown: {exc}"
        result = document.get("result") if isinstance(document, dict) else None
        if isinstance(result, dict) and result.get("volatile") is True:
            return f"the server would have let it ({self.url} is a volatile devpi index)"
        return None


@dataclass(frozen=True)
class Credentials:
    """A user and password for an upload URL, and where they came from (named in errors)."""

    username: str
    password: str = field(repr=False)
    source: str  # "TWINE_PASSWORD with the user of TWINE_USERNAME", "~/.pypirc [name]", ...
    tls: Tls = Tls()  # noqa: RUF009 (frozen): twine's TLS settings for the URL


def find_credentials(upload_url: str, default_username: str) -> tuple[str, str]:
    """(user, password) for ``upload_url`` (:func:`resolve_credentials`)."""
    found = resolve_credentials(upload_url, default_username)
    return found.username, found.password


def resolve_credentials(
    upload_url: str,
    default_username: str,
    *,
    environ: Mapping[str, str] = os.environ,
    pypirc: Path | None = None,
) -> Credentials:
    """The credentials for ``upload_url`` by the precedence of this module's docstring, and
    twine's TLS settings for it; PublishError naming every source when there are none, or the
    source that is wrong (a TWINE_REPOSITORY_URL of another index, a .pypirc twine cannot read).
    ``pypirc``: the file to read (default ``~/.pypirc`` of ``environ``'s HOME)."""
    pypirc = pypirc or twine_config.pypirc_path(environ)
    section = twine_config.pypirc_section(upload_url, pypirc)
    tls = twine_config.tls_for(upload_url, section, environ)
    if token := environ.get(ENV_TOKEN):
        return Credentials("__token__", token, ENV_TOKEN, tls)
    if password := environ.get(ENV_PASSWORD):
        username = environ.get(ENV_USERNAME)
        user_from = ENV_USERNAME if username else "publish.username"
        return Credentials(username or default_username, password,
                           f"{ENV_PASSWORD} with the user of {user_from}", tls)  # fmt: skip
    twine = twine_config.twine_environment(environ)
    if twine.password or twine.url_password:
        twine_config.check_scope(twine, upload_url)
        if twine.password:
            user_from = twine_config.ENV_USERNAME if twine.username else "publish.username"
            return Credentials(twine.username or default_username, twine.password,
                               f"{twine_config.ENV_PASSWORD} with the user of {user_from}",
                               tls)  # fmt: skip
        return Credentials(twine.url_username or default_username, twine.url_password or "",
                           f"the user and password of {twine_config.ENV_REPOSITORY_URL}",
                           tls)  # fmt: skip
    if section is not None and section.password:
        return Credentials(section.username or default_username, section.password,
                           f"the .pypirc section {section.named}", tls)  # fmt: skip
    username, user_from = _keyring_user(upload_url, default_username, environ, twine, section)
    if keyring_password := _keyring_password(upload_url, username):
        return Credentials(username, keyring_password,
                           f"keyring for {upload_url} with the user of {user_from}",
                           tls)  # fmt: skip
    raise PublishError(
        f"publishing to {upload_url} needs credentials: set {ENV_TOKEN}, or {ENV_PASSWORD} (and "
        f"{ENV_USERNAME}, default {default_username!r}), or twine's {twine_config.ENV_PASSWORD} "
        f"(and {twine_config.ENV_USERNAME}), or give {pypirc} a section whose "
        f"repository is {upload_url}, or store the password in keyring for {upload_url}; "
        "nothing was uploaded"
    )


def _keyring_user(
    upload_url: str,
    default_username: str,
    environ: Mapping[str, str],
    twine: twine_config.TwineEnvironment,
    section: twine_config.PypircSection | None,
) -> tuple[str, str]:
    """The user keyring is asked for, and where it came from: the first user named above (the
    TWINE_USERNAME of another TWINE_REPOSITORY_URL is not this index's)."""
    twine_here = twine.repository_url is None or twine_config.same_url(twine.repository_url,
                                                                       upload_url)  # fmt: skip
    named = [
        (environ.get(ENV_USERNAME), ENV_USERNAME),
        (twine.username if twine_here else None, twine_config.ENV_USERNAME),
        (section.username if section else None, f"the .pypirc section {section and section.named}"),
    ]
    return next(((user, where) for user, where in named if user),
                (default_username, "publish.username"))  # fmt: skip


def _keyring_password(upload_url: str, username: str) -> str | None:
    """keyring's password for ``upload_url`` and ``username``, None where it has none (or no
    backend); PublishError in one line when its backend fails: a backend is anyone's code and may
    raise anything, and its message may quote a secret, so only the exception's type is named."""
    try:
        import keyring  # twine's own credential store
        from keyring.errors import NoKeyringError
    except ImportError:
        return None
    backend = "keyring"
    try:
        backend = _backend_name(keyring.get_keyring())
        password = keyring.get_password(upload_url, username)
    except NoKeyringError:  # no backend on this machine
        return None
    except Exception as exc:  # anything a third-party backend raises
        raise PublishError(
            f"keyring backend {backend} failed ({type(exc).__name__}) reading the password of "
            f"user {username!r} for {upload_url}; set {ENV_PASSWORD} (and {ENV_USERNAME}) or "
            f"{ENV_TOKEN} instead, or PYTHON_KEYRING_BACKEND=keyring.backends.null.Keyring to "
            "leave keyring out; nothing was uploaded"
        ) from None
    return password if isinstance(password, str) else None


def _backend_name(backend: object) -> str:
    kind = type(backend)
    return f"{kind.__module__}.{kind.__qualname__}"


def check_credentials(
    upload_url: str,
    username: str,
    password: str,
    *,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
    tls: Tls = Tls(),  # noqa: B008
    source: str | None = None,
) -> None:
    """Tries the credentials on ``upload_url`` with an upload that carries no file, on twine's
    session: the server checks who asks before what is sent, so 401 or 403 means refused;
    anything else (devpi and pypiserver answer 400: no file) means accepted. PublishError names
    the index, the cause and, when given, where the credentials came from (``source``)."""
    try:
        reply = twine_upload.probe(upload_url, username, password, limits=limits, tls=tls)
    except requests.RequestException as exc:
        raise PublishError(f"{upload_url} cannot be reached ({twine_upload.reason(exc)}); "
                           "nothing was uploaded") from None  # fmt: skip
    code, reason = reply.status_code, reply.reason
    if 300 <= code < 400:
        # Followed, a POST would become a GET carrying the credentials to wherever it points.
        raise PublishError(
            f"{upload_url} redirects (HTTP {code}) to {reply.headers.get('Location')}; give "
            "that URL as publish.upload_url; the credentials were not sent there, and nothing "
            "was uploaded"
        )
    if code in (401, 403):
        check = (f"taken from {source}; check them, or set {ENV_TOKEN}, or {ENV_USERNAME} and "
                 f"{ENV_PASSWORD}, which come first" if source else
                 f"check {ENV_TOKEN}, or {ENV_USERNAME} and {ENV_PASSWORD}")  # fmt: skip
        raise PublishError(f"{upload_url} refused the credentials of user {username!r} (HTTP "
                           f"{code}), {check}; nothing was uploaded")  # fmt: skip
    if code in (404, 405):
        raise PublishError(
            f"{upload_url} takes no uploads (HTTP {code} {reason}); set "
            "publish.upload_url to the URL twine uploads to; nothing was uploaded"
        )
    if code >= 500:
        raise PublishError(
            f"{upload_url} failed (HTTP {code} {reason}) when the credentials were "
            "tried; nothing was uploaded"
        )
