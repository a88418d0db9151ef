"""HTTP servers on 127.0.0.1 that misbehave for real, one thread per connection on a raw socket:
a reply that never ends, one that drips a byte at a time, and a server of fixed pages (any body
and Content-Type per path) for index pages as an operator's server might serve them."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Handler = Callable[[socket.socket, bytes], None]

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nConnection: close\r\n"


@contextmanager
def serving(handler: Handler) -> Iterator[str]:
    """``handler(connection, request)`` answers each connection; yields ``http://127.0.0.1:P``."""
    listener = socket.create_server(("127.0.0.1", 0))
    stopped = threading.Event()

    def one(connection: socket.socket) -> None:
        with connection:
            try:
                request = connection.recv(65536)
                handler(connection, request)
            except OSError:
                pass  # the client went away: what a reader that stops does

    def accept() -> None:
        while not stopped.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stopped.set()
        listener.close()


def endless(content_type: bytes = b"text/html", *, total: int = 256 << 20) -> Handler:
    """A body with no length that goes on (``total`` bytes: a reader that reads it whole fails
    by its size, not by hanging): a listing of links, over and over."""
    line = b'<a href="activekv-0.1.0-py3-none-any.whl#sha256=' + b"0" * 64 + b'">x</a>\n'

    def handle(connection: socket.socket, request: bytes) -> None:
        connection.sendall(HEAD % content_type + b"\r\n")
        sent = 0
        block = line * (65536 // len(line))
        while sent < total:
            connection.sendall(block)
            sent += len(block)

    return handle


def dripping(content_type: bytes = b"text/html", *, every_s: float = 0.2,
             seconds: float = 30.0, headers: bool = False) -> Handler:  # fmt: skip
    """One byte every ``every_s`` for ``seconds``: of the body, or of the headers themselves."""

    def handle(connection: socket.socket, request: bytes) -> None:
        head = HEAD % content_type + b"\r\n"
        if not headers:
            connection.sendall(head)
        payload = head if headers else b"<html>" + b" " * 10_000
        end = time.monotonic() + seconds
        for byte in payload:
            if time.monotonic() > end:
                return
            connection.sendall(bytes([byte]))
            time.sleep(every_s)

    return handle


def pages(routes: dict[str, tuple[bytes, bytes]]) -> Handler:
    """Fixed replies: path to (Content-Type, body); 404 for any other path."""

    def handle(connection: socket.socket, request: bytes) -> None:
        path = request.split(b" ", 2)[1].decode().partition("?")[0]
        found = routes.get(path)
        if found is None:
            connection.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        content_type, body = found
        connection.sendall(HEAD % content_type + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    return handle
