"""Every read from an index, a TUF server or an upload endpoint goes through here: capped in size
while it streams (never read whole first) and bounded by one wall-clock deadline from the
connection to the last byte. urllib's ``timeout=`` is per socket operation, so a reply that drips
a byte a second would never end; here a timer shuts the request's sockets down at the deadline,
which wakes any blocked read. Past either limit, one line names the URL and the limit
(``[publish.limits]`` of the manifest, release/util/limits.py ``NetworkLimits``).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from email.message import Message
from types import TracebackType
from typing import Literal

from release.errors import PackageIndexError
from release.util.limits import NetworkLimits
from release.util.urls import masked_url

CapKey = Literal["page_bytes", "file_bytes"]
ErrorType = Callable[[str], Exception]
_CHUNK = 1 << 16
_SCHEMES = ("http", "https", "file")


class Deadline:
    """One request's (or one upload's) wall-clock deadline: at it, every socket it watches is
    shut down, which wakes a read blocked in another thread."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._timer.cancel()

    def left(self) -> float:
        return self._end - time.monotonic()

    @property
    def passed(self) -> bool:
        return self.expired or self.left() <= 0

    def watch(self, sock: socket.socket) -> None:
        """Shut `sock` down at the deadline (at once if it has passed)."""
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def connect(
        self, address: tuple[str, int], timeout: object = None, source_address: object = None
    ) -> socket.socket:
        """``socket.create_connection``, given at most the time left and watched."""
        left = self.left()
        if left <= 0:
            raise TimeoutError("the deadline passed before connecting")
        sock = socket.create_connection(address, left, source_address)  # type: ignore[arg-type]
        self.watch(sock)
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # The plain socket's shutdown, a TLS socket's too: it wakes a call blocked in another thread.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # closed, or detached when TLS wrapped it (the TLS socket is watched instead)


def _handlers(deadline: Deadline) -> list[urllib.request.BaseHandler]:
    """HTTP(S) handlers whose connections are opened through ``deadline``."""

    class Watched(http.client.HTTPConnection):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            # The hook http.client connects with (plain and TLS alike, proxies too).
            self._create_connection = deadline.connect

    class WatchedTLS(http.client.HTTPSConnection):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            self._create_connection = deadline.connect

    class HTTP(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(Watched, req)

    class HTTPS(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(WatchedTLS, req, context=self._context)  # type: ignore[attr-defined]

    return [HTTP(), HTTPS()]


class _WebRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects to http(s) only (urllib would follow one to ftp:, outside the deadline)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: object,
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        if not newurl.lower().startswith(("http://", "https://")):
            return None  # raised as the 3xx HTTPError
        return super().redirect_request(req, fp, code, msg, headers, newurl)  # type: ignore[arg-type]


def too_large(url: str, key: CapKey, limits: NetworkLimits) -> str:
    cap = getattr(limits, key)
    return (f"{masked_url(url)}: the reply exceeded {_size(cap)} "
            f"(publish.limits.{key} = {cap}); stopped reading")  # fmt: skip


def too_slow(url: str, limits: NetworkLimits) -> str:
    return (f"{masked_url(url)}: no complete reply within {limits.deadline_s:g} s "
            f"(publish.limits.deadline_s = {limits.deadline_s:g}); stopped reading")  # fmt: skip


def _size(count: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift and count % (1 << shift) == 0:
            return f"{count >> shift} {unit}"
    return f"{count} bytes"


class Reply:
    """An open reply: its status, headers and final URL; its body read through :meth:`chunks`."""

    def __init__(
        self,
        response: http.client.HTTPResponse,
        url: str,
        deadline: Deadline,
        limits: NetworkLimits,
        error: ErrorType,
    ) -> None:
        self._response = response
        self._deadline = deadline
        self._limits = limits
        self._error = error
        self.requested = url
        self.url: str = response.geturl()
        self.status: int = response.status
        self.headers: Message = response.headers

    def chunks(self, key: CapKey) -> Iterator[bytes]:
        """The body, at most ``limits.<key>`` bytes of it, before the deadline; else ``error``."""
        cap: int = getattr(self._limits, key)
        declared = self.headers.get("Content-Length", "").strip()
        if declared.isdigit() and int(declared) > cap:
            raise self._error(too_large(self.requested, key, self._limits))
        total = 0
        while True:
            try:
                chunk = self._response.read(min(_CHUNK, cap + 1 - total))
            except (OSError, http.client.HTTPException) as exc:
                if self._deadline.passed:
                    raise self._error(too_slow(self.requested, self._limits)) from None
                raise self._error(f"{masked_url(self.requested)}: the reply broke off "
                                  f"({type(exc).__name__})") from None  # fmt: skip
            if self._deadline.expired:  # a shut socket reads as the end: not a whole reply
                raise self._error(too_slow(self.requested, self._limits))
            if not chunk:
                return
            total += len(chunk)
            if total > cap:
                raise self._error(too_large(self.requested, key, self._limits))
            yield chunk

    def read(self, key: CapKey = "page_bytes") -> bytes:
        return b"".join(self.chunks(key))


@contextmanager
def opened(
    request: str | urllib.request.Request,
    *,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008 (frozen: one shared default is fine)
    error: ErrorType = PackageIndexError,
    handlers: Sequence[urllib.request.BaseHandler] = (),
) -> Iterator[Reply]:
    """``request`` sent, its reply open within ``limits.deadline_s`` (which also bounds reading
    it). urllib's HTTPError (a 4xx or 5xx) and URLError (not reached) pass through, for the
    caller to say what they mean; past the deadline, ``error`` names the URL and the limit."""
    url = request if isinstance(request, str) else request.full_url
    scheme = url.partition(":")[0].lower()
    if scheme not in _SCHEMES:
        raise error(f"{masked_url(url)}: expected an http(s) URL; got scheme {scheme!r}")
    deadline = Deadline(float(limits.deadline_s))
    redirects = (
        []
        if any(isinstance(h, urllib.request.HTTPRedirectHandler) for h in handlers)
        else [_WebRedirects()]
    )
    opener = urllib.request.build_opener(*_handlers(deadline), *redirects, *handlers)
    with deadline:
        try:
            response = opener.open(request, timeout=float(limits.deadline_s))
        except urllib.error.HTTPError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            if deadline.passed:
                raise error(too_slow(url, limits)) from None
            if isinstance(exc, urllib.error.URLError):
                raise
            raise urllib.error.URLError(exc) from None
        with response:
            yield Reply(response, url, deadline, limits, error)


def get(
    url: str,
    *,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
    headers: dict[str, str] | None = None,
    error: ErrorType = PackageIndexError,
) -> tuple[Reply, bytes]:
    """GET ``url``: the reply and its body (at most ``limits.page_bytes``)."""
    request = urllib.request.Request(url, headers=headers or {})
    with opened(request, limits=limits, error=error) as reply:
        return reply, reply.read("page_bytes")


def fetch(
    url: str,
    write: Callable[[bytes], object],
    *,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
    error: ErrorType = PackageIndexError,
) -> None:
    """GET ``url`` (a file: at most ``limits.file_bytes``), each chunk given to ``write`` as it
    comes (a file's write, a digest's update): never held whole."""
    with opened(url, limits=limits, error=error) as reply:
        for chunk in reply.chunks("file_bytes"):
            write(chunk)
