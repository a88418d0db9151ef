"""A package index its operator already runs (devpi-server, pypiserver, or any index twine can
upload to), and the TUF repository written to a folder the operator serves beside it.

Credentials come from the environment or keyring, never from the manifest, and are never
printed: ``ACTIVEKV_INDEX_TOKEN`` (an API token, user ``__token__``), else
``ACTIVEKV_INDEX_PASSWORD`` with ``ACTIVEKV_INDEX_USERNAME`` (default: the manifest's
``publish.username``), else keyring's password for the upload URL and that user. Before anything
is uploaded they are tried on the upload URL with an upload that carries no file: a server that
answers 401 or 403 refuses them, and the publish stops naming the index and the variables.

The publish rules are the embedded index's (release/trust/publish.py): this module only says where
files go and whether the server itself would replace a file (devpi's ``volatile`` indexes), which
the pipeline never does either way.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from release.errors import PublishError
from release.manifest import NetworkLimits
from release.util import http

ENV_USERNAME = "ACTIVEKV_INDEX_USERNAME"
ENV_PASSWORD = "ACTIVEKV_INDEX_PASSWORD"
ENV_TOKEN = "ACTIVEKV_INDEX_TOKEN"


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
    _credentials: tuple[str, str] | None = field(default=None, repr=False)

    @property
    def provenance_dir(self) -> Path:
        """The signed statements and attestations, TUF targets ``provenance/…``."""
        return self.tuf_dir / "targets" / "provenance"

    @property
    def username(self) -> str:
        return self._opened()[0]

    @property
    def password(self) -> str:
        return self._opened()[1]

    def __enter__(self) -> RemoteIndex:
        if self.upload:
            credentials = find_credentials(self.url, self.default_username)
            check_credentials(self.url, *credentials, limits=self.limits)
            self._credentials = credentials
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._credentials = None

    def _opened(self) -> tuple[str, str]:
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


def find_credentials(upload_url: str, default_username: str) -> tuple[str, str]:
    """(user, password) for ``upload_url`` from the environment or keyring; PublishError naming
    the variables to set when there are none."""
    if token := os.environ.get(ENV_TOKEN):
        return "__token__", token
    username = os.environ.get(ENV_USERNAME) or default_username
    password = os.environ.get(ENV_PASSWORD) or _keyring_password(upload_url, username)
    if not password:
        raise PublishError(
            f"publishing to {upload_url} needs credentials: set {ENV_PASSWORD} (and "
            f"{ENV_USERNAME}, default {default_username!r}) or {ENV_TOKEN}, or store the password "
            f"in keyring for {upload_url}; nothing was uploaded"
        )
    return username, password


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


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # the 3xx is raised as an HTTPError instead


def check_credentials(
    upload_url: str,
    username: str,
    password: str,
    *,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
) -> None:
    """Tries the credentials on ``upload_url`` with an upload that carries no file: the server
    checks who asks before what is sent, so 401 or 403 means refused; anything else (devpi and
    pypiserver answer 400: no file) means accepted. PublishError names the index and the cause."""
    boundary = uuid.uuid4().hex
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name=":action"\r\n\r\n'
        f"file_upload\r\n--{boundary}--\r\n"
    ).encode()
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    request = urllib.request.Request(
        upload_url, data=body, method="POST",
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}",
                 "Authorization": f"Basic {token}"},
    )  # fmt: skip
    try:
        # The reply's body is not read: its status says all (within the deadline).
        with http.opened(request, limits=limits, error=PublishError, handlers=[_RefuseRedirects()]):
            return
    except urllib.error.HTTPError as exc:
        exc.close()
        if 300 <= exc.code < 400:
            # Followed, a POST would become a GET carrying the credentials to wherever it points.
            raise PublishError(
                f"{upload_url} redirects (HTTP {exc.code}) to {exc.headers.get('Location')}; give "
                "that URL as publish.upload_url; the credentials were not sent there, and nothing "
                "was uploaded"
            ) from None
        if exc.code in (401, 403):
            raise PublishError(
                f"{upload_url} refused the credentials of user {username!r} (HTTP {exc.code}); "
                f"check {ENV_TOKEN}, or {ENV_USERNAME} and {ENV_PASSWORD}; nothing was uploaded"
            ) from None
        if exc.code in (404, 405):
            raise PublishError(
                f"{upload_url} takes no uploads (HTTP {exc.code} {exc.reason}); set "
                "publish.upload_url to the URL twine uploads to; nothing was uploaded"
            ) from None
        if exc.code >= 500:
            raise PublishError(
                f"{upload_url} failed (HTTP {exc.code} {exc.reason}) when the credentials were "
                "tried; nothing was uploaded"
            ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PublishError(f"{upload_url} cannot be reached ({reason}); nothing was "
                           "uploaded") from None  # fmt: skip
