"""A local index server's process: started on a free port of 127.0.0.1 (or on one it is given),
its output appended to a log, ready once a URL answers, stopped (terminate, then kill) when done.

A port found free may be taken before the server binds it; a server that exits saying so is
started again on another port, a few times. A port it is given is that port or an error.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import IO

from release.errors import PackageIndexError
from release.manifest import NetworkLimits
from release.util import http

HOST = "127.0.0.1"
_STOP_TIMEOUT_S = 15.0
_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 30


class ServerProcess:
    """One server subprocess at a time, named ``name`` in errors, logging to ``log_path``."""

    def __init__(self, name: str, log_path: Path, *, startup_timeout: float) -> None:
        self._name = name
        self._log_path = log_path
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._port: int | None = None

    @property
    def port(self) -> int | None:
        """The port it serves on while running, else None."""
        return self._port

    def start(self, command: Callable[[int], list[str]], ready_url: Callable[[int], str]) -> None:
        """Run ``command(port)`` until ``ready_url(port)`` answers 200."""
        for _ in range(_PORT_ATTEMPTS):
            port = free_port()
            if self._start_on(port, command(port), ready_url(port)):
                return
        raise PackageIndexError(
            f"{self._name} found its port taken {_PORT_ATTEMPTS} times; tail of "
            f"{self._log_path}:\n{self._log_tail(0)}"
        )

    def start_on(self, port: int, command: list[str], ready_url: str, *, advice: str = "") -> None:
        """Run ``command`` (which listens on ``port``) until ``ready_url`` answers 200; one line
        naming the port and why when it cannot listen there (``advice`` ends it)."""
        reason = bind_error(port)
        if reason is None and self._start_on(port, command, ready_url):
            return
        reason = reason or "taken by another process as the server started"
        raise PackageIndexError(f"{self._name} cannot listen on {HOST}:{port} ({reason})"
                                + (f"; {advice}" if advice else ""))  # fmt: skip

    def _start_on(self, port: int, command: list[str], ready_url: str) -> bool:
        """Whether it serves on ``port``; False when the port was taken meanwhile."""
        log_start = self._log_path.stat().st_size if self._log_path.exists() else 0
        self._log = self._log_path.open("ab")
        self._log.write(f"--- starting {self._name} on {HOST}:{port}\n".encode())
        self._log.flush()
        try:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                preexec_fn=_end_with_parent,
            )  # fmt: skip
        except OSError as exc:
            self.stop()
            raise PackageIndexError(f"{self._name}: cannot run {command[0]}: {exc}") from None
        self._port = port
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            status = self._process.poll()
            if status is not None:
                tail = self._log_tail(log_start)
                self.stop()
                if "Address already in use" in tail:
                    return False
                raise PackageIndexError(
                    f"{self._name} exited with status {status} before serving; tail of "
                    f"{self._log_path}:\n{tail}"
                )
            if answers(ready_url):
                return True
            time.sleep(0.1)
        tail = self._log_tail(log_start)
        self.stop()
        raise PackageIndexError(
            f"{self._name} did not answer on {ready_url} within {self._startup_timeout:.0f} s; "
            f"tail of {self._log_path}:\n{tail}"
        )

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        self._port = None

    def _log_tail(self, start: int) -> str:
        if self._log is not None:
            self._log.flush()
        try:
            with self._log_path.open("rb") as stream:
                stream.seek(start)
                text = stream.read().decode("utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _end_with_parent() -> None:
    """In the server's process, before it runs: the kernel sends it SIGTERM when the process that
    started it dies, however it dies (kill -9 included), so no server outlives its publish."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() == 1:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (a server may still race for it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def bind_error(port: int) -> str | None:
    """Why a server could not listen on ``port`` of 127.0.0.1 now (the OS's words), else None.
    With SO_REUSEADDR, as the servers' wsgiref sets it: a port an earlier server left in
    TIME_WAIT is free, one another process listens on is not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            return exc.strerror or type(exc).__name__
    return None


_ANSWER_LIMITS = NetworkLimits(deadline_s=1.0)


def answers(url: str) -> bool:
    """Whether `url` answers 200 within a second (its headers, whole: one that drips them does
    not hold the start up; its body is never read)."""
    try:
        with http.opened(url, limits=_ANSWER_LIMITS) as reply:
            return reply.status == 200
    except (urllib.error.URLError, PackageIndexError):
        return False
