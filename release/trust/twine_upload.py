"""One file uploaded with twine's command line, the way a release engineer runs it; a failure
becomes one line that says what the index answered.

twine reports a refused upload as ``HTTPError: 400 Bad Request`` and keeps the server's reason in
the response body, which it prints only with ``--verbose``. So twine runs verbose, without colour
and wide enough not to wrap, and the body of its last ``Response from`` block is reduced to its
text: an error page's ``<pre>`` (bottle, so pypiserver), else the page without markup.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import IO

from release.errors import PublishError
from release.manifest import NetworkLimits

_REDACTED = "********"
# What is kept of twine's output: its end, where the index's last answer is (twine --verbose
# prints a reply's body whole, and a server may answer with any number of bytes).
_KEPT_OUTPUT_BYTES = 1 << 20
_MAX_ANSWER_CHARS = 400
# twine's rich log: "INFO     Response from URL:" then "<status> <reason>", then the body.
_RESPONSE = re.compile(r"Response from \S+:\s*\n\s*(?P<status>\d{3}[^\n]*)\n")
_LEVEL = r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b"  # a rich log record starts so
_LOG_LEVEL = re.compile(_LEVEL, re.MULTILINE)
# The body is logged as a record of its own, up to the next record.
_BODY = re.compile(rf"\s*INFO\b(?P<text>.*?)(?={_LEVEL}|\Z)",
                   re.DOTALL | re.MULTILINE)  # fmt: skip
_PRE = re.compile(r"<pre>(.*?)</pre>", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r"<(style|script|title)\b.*?</\1>|<[^>]+>", re.DOTALL | re.IGNORECASE)


def upload(
    wheel: Path,
    url: str,
    username: str,
    password: str,
    *,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
) -> None:
    """Upload ``wheel`` to ``url`` within ``limits.deadline_s``; PublishError naming what the
    index answered on failure."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINE_")}
    # Wide and not a dumb terminal: rich would wrap the server's answer at 80 columns.
    env.update(TWINE_USERNAME=username, TWINE_PASSWORD=password, COLUMNS="1000", LINES="50")
    env.pop("TERM", None)
    command = [sys.executable, "-m", "twine", "--no-color", "upload", "--non-interactive",
               "--disable-progress-bar", "--verbose", "--repository-url", url,
               str(wheel)]  # fmt: skip
    status, output = _run(command, env, limits.deadline_s, wheel.name, url)
    if status != 0:
        if password:
            output = output.replace(password, _REDACTED)
        raise PublishError(f"twine upload of {wheel.name} to {url} failed: {failure(output)}")


def _run(
    command: list[str], env: dict[str, str], deadline_s: float, name: str, url: str
) -> tuple[int, str]:
    """twine's exit status and the end of its output (stdout, then stderr), within
    ``deadline_s``."""
    try:
        process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    except OSError as exc:
        raise PublishError(f"twine upload of {name} to {url}: cannot run twine ({exc})") from None
    streams = [process.stdout, process.stderr]
    kept: list[deque[bytes]] = [deque(), deque()]
    readers = [threading.Thread(target=keep_end, args=(stream, end), daemon=True)
               for stream, end in zip(streams, kept, strict=True)]  # fmt: skip
    for reader in readers:
        reader.start()
    try:
        status = process.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise PublishError(
            f"twine upload of {name} to {url} did not finish in {deadline_s:g} s "
            f"(publish.limits.deadline_s = {deadline_s:g})"
        ) from None
    finally:
        for reader in readers:
            reader.join(timeout=5)
    return status, "\n".join(b"".join(end).decode("utf-8", errors="replace") for end in kept)


def keep_end(stream: IO[bytes] | None, kept: deque[bytes]) -> None:
    """Read ``stream`` to its end, keeping its last ``_KEPT_OUTPUT_BYTES`` in ``kept`` (whole
    lines: a line cut at the front could show the end of a password that no redaction finds)."""
    if stream is None:
        return
    size, trimmed = 0, False
    with stream:
        while chunk := stream.read1(1 << 16):  # type: ignore[attr-defined]
            kept.append(chunk)
            size += len(chunk)
            while size - len(kept[0]) >= _KEPT_OUTPUT_BYTES:
                size -= len(kept.popleft())
                trimmed = True
    if trimmed:
        rest = b"".join(kept).partition(b"\n")[2]
        kept.clear()
        kept.append(rest)


def failure(output: str) -> str:
    """One line from twine's verbose output: the index's status and answer, else twine's error."""
    responses = list(_RESPONSE.finditer(output))
    if responses:
        last = responses[-1]
        body = _BODY.match(output, last.end())
        answer = server_text(body["text"]) if body else ""
        status = " ".join(last["status"].split())
        return f"the index answered {status}" + (f": {answer}" if answer else "")
    errors = [line for line in output.splitlines() if line.startswith("ERROR")]
    last_error = errors[-1] if errors else (output.strip().splitlines() or ["no output"])[-1]
    return " ".join(_LOG_LEVEL.sub("", last_error).split()) or "no output"


def server_text(body: str) -> str:
    """What an error page says, as one line: its ``<pre>`` if it has one, else its text."""
    pre = _PRE.search(body)
    text = pre.group(1) if pre else _TAG.sub(" ", body)
    line = " ".join(html.unescape(text).split())
    return line if len(line) <= _MAX_ANSWER_CHARS else line[: _MAX_ANSWER_CHARS - 1] + "…"
