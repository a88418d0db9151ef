"""Uploads through twine's API, in this process: twine's ``Repository`` and ``PackageFile``, so
twine's requests session (its user agent, retries, proxies and TLS settings) sends the file, and
the credential probe (release/trust/remote_index.py) goes out on that same session. A failure is
one line saying what the index answered: its status and its own words (an error page's
``<pre>``, as bottle, so pypiserver, writes one; else the page without markup).

Every request is bounded as release/util/http.py bounds urllib's: the reply's body is capped at
``publish.limits.page_bytes`` while it streams, and one wall-clock deadline
(``publish.limits.deadline_s``) covers the whole upload, twine's retries of a 5xx included; at it
a timer shuts the upload's sockets down, which wakes a read or write blocked on a server that
drips or stalls (requests' ``timeout`` is per socket operation and never fires on a drip).
"""

from __future__ import annotations

import html
import re
import socket
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
import rich
from requests.adapters import HTTPAdapter
from twine import exceptions as twine_exceptions
from twine.package import PackageFile
from twine.repository import Repository
from twine.settings import Settings
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from release.errors import PublishError
from release.manifest import NetworkLimits
from release.trust import twine_config
from release.trust.twine_config import Tls
from release.util.http import Deadline, too_large, too_slow

_REDACTED = "********"
_MAX_ANSWER_CHARS = 400
_CHUNK = 1 << 16
_PRE = re.compile(r"<pre>(.*?)</pre>", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r"<(style|script|title)\b.*?</\1>|<[^>]+>", re.DOTALL | re.IGNORECASE)


def _watched_pools(deadline: Deadline) -> dict[str, type[HTTPConnectionPool]]:
    """urllib3 pool classes whose connections' sockets ``deadline`` shuts down."""

    class Connection(HTTPConnection):
        def _new_conn(self) -> socket.socket:
            sock = super()._new_conn()
            deadline.watch(sock)
            return sock

    class TLSConnection(HTTPSConnection):
        def _new_conn(self) -> socket.socket:
            sock = super()._new_conn()
            deadline.watch(sock)  # the TCP connect and the TLS handshake
            return sock

        def connect(self) -> None:
            super().connect()
            deadline.watch(self.sock)  # type: ignore[arg-type]  # the TLS socket it reads from

    class Pool(HTTPConnectionPool):
        ConnectionCls = Connection

    class TLSPool(HTTPSConnectionPool):
        ConnectionCls = TLSConnection

    return {"http": Pool, "https": TLSPool}


class _BoundedAdapter(HTTPAdapter):
    """twine's adapter (its retries), each request given at most the time left and watched by
    the deadline, its reply's body read here within ``limits.page_bytes``."""

    def __init__(
        self, deadline: Deadline, limits: NetworkLimits, slow: str, cacert: str | None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        self._deadline, self._limits, self._slow = deadline, limits, slow
        self._cacert = cacert
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _watched_pools(self._deadline)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS pools are their own classes
            manager.pool_classes_by_scheme = _watched_pools(self._deadline)
        return manager

    def send(self, request: requests.PreparedRequest, stream: bool = False, timeout: Any = None,
             **kwargs: Any) -> requests.Response:  # fmt: skip
        left = self._deadline.left()
        if left <= 0:
            raise PublishError(self._slow)
        if self._cacert:
            # The bundle named for this index; requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE
            # win over a session's (psf/requests#4650), as it would for twine --cert.
            kwargs["verify"] = self._cacert
        try:
            response = super().send(request, stream=True, timeout=left, **kwargs)
        except requests.RequestException:
            if self._deadline.passed:
                raise PublishError(self._slow) from None
            raise
        # Read here, bounded, instead of whole by requests: any reply asked for whole, and a
        # redirect's (requests reads it whole before it would follow, even when streaming).
        if not stream or response.is_redirect:
            response._content = self._body(response, request.url or "")
        return response

    def _body(self, response: requests.Response, url: str) -> bytes:
        cap, total, chunks = self._limits.page_bytes, 0, []
        try:
            while chunk := response.raw.read(min(_CHUNK, cap + 1 - total), decode_content=True):
                total += len(chunk)
                if total > cap:
                    raise PublishError(too_large(url, "page_bytes", self._limits))
                chunks.append(chunk)
        except (OSError, requests.RequestException, ValueError) as exc:
            if self._deadline.passed:
                raise PublishError(self._slow) from None
            raise PublishError(f"{url}: the reply broke off ({type(exc).__name__})") from None
        finally:
            response.close()
        if self._deadline.expired:  # a shut socket reads as the end: not a whole reply
            raise PublishError(self._slow)
        return b"".join(chunks)


@contextmanager
def repository(
    url: str,
    username: str,
    password: str,
    *,
    limits: NetworkLimits,
    tls: Tls = Tls(),  # noqa: B008 (frozen)
    slow: str,
) -> Iterator[Repository]:
    """twine's Repository for ``url`` (its Settings: the credentials given, never asked for),
    every request on its session within ``limits``; ``slow`` is the error past the deadline."""
    try:
        settings = Settings(
            repository_url=url, username=username, password=password, non_interactive=True,
            disable_progress_bar=True, cacert=tls.cacert, client_cert=tls.client_cert,
        )  # fmt: skip
        twine_repository = settings.create_repository()
    except twine_exceptions.TwineException as exc:
        raise PublishError(f"twine refuses {url}: {_one_line(str(exc))}") from None
    with Deadline(float(limits.deadline_s)) as deadline:
        for prefix in ("http://", "https://"):
            twine_adapter = twine_repository.session.get_adapter(prefix)
            retries = getattr(twine_adapter, "max_retries", 0)
            bounded = _BoundedAdapter(deadline, limits, slow, tls.cacert, max_retries=retries)
            twine_repository.session.mount(prefix, bounded)
        try:
            yield twine_repository
        finally:
            twine_repository.close()


@contextmanager
def _quiet_rich() -> Iterator[None]:
    """twine prints "Uploading <file>" on rich's global console; the publish says it instead."""
    console = rich.get_console()
    before, console.quiet = console.quiet, True
    try:
        yield
    finally:
        console.quiet = before


def upload(
    wheel: Path,
    url: str,
    username: str,
    password: str,
    *,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
    tls: Tls | None = None,
) -> None:
    """Upload ``wheel`` to ``url`` with twine, within ``limits``; PublishError naming what the
    index answered on failure. ``tls``: twine's TLS settings for ``url``; None: found as for
    the credential probe (:func:`tls_settings`)."""
    head = f"twine upload of {wheel.name} to {url}"
    tls = tls_settings(url) if tls is None else tls
    slow = (f"{head} did not finish in {limits.deadline_s:g} s "
            f"(publish.limits.deadline_s = {limits.deadline_s:g})")  # fmt: skip
    try:
        package = PackageFile.from_filename(str(wheel), None)
    except (twine_exceptions.TwineException, OSError, ValueError, zipfile.BadZipFile,
            tarfile.TarError) as exc:  # fmt: skip
        said = _one_line(str(exc)) or type(exc).__name__
        raise PublishError(f"{head}: twine cannot read the file ({said})") from None
    with repository(url, username, password, limits=limits, tls=tls, slow=slow) as twine_repo:
        try:
            with _quiet_rich():
                response = twine_repo.upload(package)
        except requests.RequestException as exc:
            raise PublishError(f"{head} failed: {reason(exc)}") from None
    if response.status_code == requests.codes.ok:
        return
    if response.is_redirect:  # twine refuses to follow one (its RedirectDetected)
        raise PublishError(f"{head} failed: the index redirects (HTTP {response.status_code}) to "
                           f"{response.headers.get('Location')}; give that URL as "
                           "publish.upload_url")  # fmt: skip
    raise PublishError(f"{head} failed: {answer(response, password)}")


def tls_settings(url: str) -> Tls:
    """twine's TLS settings for ``url`` (release/trust/twine_config.py): ``TWINE_CERT``, the
    ``.pypirc`` section of the URL. None apply to an ``http`` URL, whose ``.pypirc`` is not read
    (the embedded index's)."""
    if not url.lower().startswith("https:"):
        return Tls()
    section = twine_config.pypirc_section(url, twine_config.pypirc_path())
    return twine_config.tls_for(url, section)


def answer(response: requests.Response, password: str = "") -> str:
    """What the index answered: its status, and its words when it said any."""
    said = server_text(response.content.decode(response.encoding or "utf-8", errors="replace"))
    if password:
        said = said.replace(password, _REDACTED)
    status = " ".join(f"{response.status_code} {response.reason or ''}".split())
    return f"the index answered {status}" + (f": {said}" if said else "")


def probe(
    url: str,
    username: str,
    password: str,
    *,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
    tls: Tls = Tls(),  # noqa: B008
) -> requests.Response:
    """An upload that carries no file, sent as twine sends one (its session, its credentials),
    redirects not followed; the reply's status and headers (its body is never read).
    PublishError past the deadline; requests' own error when the URL cannot be reached."""
    boundary = uuid.uuid4().hex
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name=":action"\r\n\r\n'
        f"file_upload\r\n--{boundary}--\r\n"
    ).encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    slow = too_slow(url, limits)
    with repository(url, username, password, limits=limits, tls=tls, slow=slow) as twine_repo:
        response = twine_repo.session.post(url, data=body, headers=headers, allow_redirects=False,
                                           stream=True)  # fmt: skip
        response.close()
    return response


def reason(exc: BaseException) -> str:
    """The innermost cause of a requests error, in its own words: "Connection refused", not
    urllib3's retry wrapper around it."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "reason", None)
        if not isinstance(inner, BaseException):
            inner = next((a for a in exc.args if isinstance(a, BaseException)), None)
        inner = inner or exc.__cause__ or exc.__context__
        if inner is None:
            break
        exc = inner
    if isinstance(exc, OSError) and exc.strerror:
        return _one_line(exc.strerror)
    return _one_line(str(exc)) or type(exc).__name__


def server_text(body: str) -> str:
    """What an error page says, as one line: its ``<pre>`` if it has one, else its text."""
    pre = _PRE.search(body)
    text = pre.group(1) if pre else _TAG.sub(" ", body)
    line = " ".join(html.unescape(text).split())
    return line if len(line) <= _MAX_ANSWER_CHARS else line[: _MAX_ANSWER_CHARS - 1] + "…"


def _one_line(text: str) -> str:
    return " ".join(text.split())
