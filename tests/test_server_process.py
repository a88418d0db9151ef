"""The local index servers' process handling (release/trust/server_process.py) with real processes:
a
real HTTP server, a server that says its port was taken, one that dies, one that cannot run."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from release.errors import PackageIndexError
from release.trust.server_process import HOST, ServerProcess, answers
from release.util.paths import REPO_ROOT

pytestmark = pytest.mark.integration  # real server processes


def http_server(port: int) -> list[str]:
    return [sys.executable, "-m", "http.server", "--bind", HOST, str(port)]


def url(port: int) -> str:
    return f"http://{HOST}:{port}/"


def test_a_server_is_ready_once_it_answers_and_gone_once_stopped(tmp_path: Path) -> None:
    server = ServerProcess("http.server", tmp_path / "server.log", startup_timeout=30)
    server.start(http_server, url)
    port = server.port
    assert port is not None and answers(url(port))
    server.stop()
    assert server.port is None and not answers(url(port))
    assert f"--- starting http.server on {HOST}:{port}" in (tmp_path / "server.log").read_text()


def test_a_port_taken_meanwhile_is_tried_again_then_refused(tmp_path: Path) -> None:
    taken = [sys.executable, "-c", "print('OSError: [Errno 98] Address already in use')"]
    server = ServerProcess("busy", tmp_path / "busy.log", startup_timeout=30)
    with pytest.raises(PackageIndexError, match=r"busy found its port taken 3 times") as info:
        server.start(lambda port: taken, url)
    assert "Address already in use" in str(info.value)
    assert (tmp_path / "busy.log").read_text().count("--- starting busy") == 3
    assert server.port is None


def test_a_server_that_dies_is_named_with_its_status_and_log(tmp_path: Path) -> None:
    dies = [sys.executable, "-c", "import sys; print('no config'); sys.exit(3)"]
    server = ServerProcess("dies", tmp_path / "dies.log", startup_timeout=30)
    with pytest.raises(PackageIndexError, match=r"dies exited with status 3 before") as info:
        server.start(lambda port: dies, url)
    assert "no config" in str(info.value) and str(tmp_path / "dies.log") in str(info.value)


def test_a_server_that_never_answers_is_stopped_after_the_timeout(tmp_path: Path) -> None:
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    server = ServerProcess("silent", tmp_path / "silent.log", startup_timeout=1)
    with pytest.raises(PackageIndexError, match=r"silent did not answer on .* within 1 s"):
        server.start(lambda port: silent, url)
    assert server.port is None


def test_a_missing_program_is_named(tmp_path: Path) -> None:
    server = ServerProcess("ghost", tmp_path / "ghost.log", startup_timeout=5)
    missing = str(tmp_path / "no-such-server")
    with pytest.raises(PackageIndexError, match=r"ghost: cannot run .*no-such-server"):
        server.start(lambda port: [missing], url)
    assert server.port is None


def _serve(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    """`python -m release serve` in its own process; it and the simple URL it serves."""
    process = subprocess.Popen(
        [sys.executable, "-m", "release", "serve", "--state-dir", str(tmp_path / "state")],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        if match := re.search(r"at (http://\S+/simple/)", line):
            return process, match.group(1)
    raise AssertionError(f"serve exited ({process.wait()}) without serving")


def _gone(url: str, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not answers(url):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGKILL])
def test_the_index_server_ends_with_the_process_that_started_it(tmp_path, signal_number):
    """SIGTERM to `serve` stops its server; kill -9 of it leaves none running under PID 1 (the
    kernel's parent-death signal ends it)."""
    process, url = _serve(tmp_path)
    assert answers(url)
    process.send_signal(signal_number)
    process.wait(timeout=30)
    assert _gone(url), f"the server at {url} outlived `serve` ({signal_number.name})"
