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
from pathlib import Path

from release.errors import PublishError

_TIMEOUT_S = 300.0
_REDACTED = "********"
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


def upload(wheel: Path, url: str, username: str, password: str) -> None:
    """Upload ``wheel`` to ``url``; PublishError naming what the index answered on failure."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINE_")}
    # Wide and not a dumb terminal: rich would wrap the server's answer at 80 columns.
    env.update(TWINE_USERNAME=username, TWINE_PASSWORD=password, COLUMNS="1000", LINES="50")
    env.pop("TERM", None)
    command = [sys.executable, "-m", "twine", "--no-color", "upload", "--non-interactive",
               "--disable-progress-bar", "--verbose", "--repository-url", url,
               str(wheel)]  # fmt: skip
    try:
        result = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=_TIMEOUT_S, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise PublishError(
            f"twine upload of {wheel.name} to {url} did not finish in {_TIMEOUT_S:.0f} s"
        ) from None
    if result.returncode != 0:
        output = result.stdout + "\n" + result.stderr
        if password:
            output = output.replace(password, _REDACTED)
        raise PublishError(f"twine upload of {wheel.name} to {url} failed: {failure(output)}")


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
