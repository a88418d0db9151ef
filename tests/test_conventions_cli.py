"""The command line's conventions: `--version`, each subcommand listing only the global options
its step reads, and `serve --port N`, which serves the embedded index at the same URL each time
(the install hint says when the port is another each time). The serve tests run the real
`python -m release serve` and its pypiserver."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from release_cli import run_release

from release.trust.index import install_hint
from release.trust.server_process import answers, free_port
from release.util.paths import REPO_ROOT
from release.util.pins import project_version

GLOBAL = {"--manifest", "--out", "--state-dir", "--channel", "--key-dir", "--attest-key"}
ALL = GLOBAL
GATE = ALL  # gates sign attestations (channel key, --key-dir or --attest-key), cache in state
TRUST = GLOBAL - {"--attest-key"}  # sign, publish, verify: the channel's keys, no gate runs
GATES = ("payload", "audit", "policy", "casters", "served-path", "parity", "reproduce", "gpu-gates")
# What each subcommand's step reads of the Context, written out here apart from release/cli.py.
READS = {
    "check-manifest": {"--manifest"},
    "ci": {"--manifest"},
    "cpp-tests": {"--manifest", "--state-dir"},
    "build": ALL,
    "record-build": {"--manifest", "--out"},
    "bench": {"--manifest", "--out"},
    "gpu-staging": {"--manifest", "--out", "--state-dir"},
    **dict.fromkeys(GATES, GATE),
    "report": {"--manifest", "--out", "--channel"},
    "sign": TRUST,
    "publish": TRUST,
    "verify": TRUST,
    "run": ALL,
    "serve": {"--manifest", "--state-dir"},
    "rebuild": {"--manifest", "--out", "--state-dir"},
    "keygen": {"--manifest", "--channel"},
}


def test_version_prints_the_projects_version(capsys, monkeypatch) -> None:
    result = run_release(["--version"], capsys, monkeypatch)
    assert (result.returncode, result.stdout) == (0, f"python -m release {project_version()}\n")


@pytest.mark.parametrize("command", sorted(READS))
def test_each_subcommands_help_lists_only_the_global_options_it_reads(
    command: str, capsys, monkeypatch
) -> None:
    result = run_release([command, "--help"], capsys, monkeypatch)
    assert result.returncode == 0, result.stderr
    listed = set(re.findall(r"(?m)^\s+(--[a-z-]+)", result.stdout)) & GLOBAL
    assert listed == READS[command]


def test_every_subcommand_is_in_the_table(capsys, monkeypatch) -> None:
    result = run_release(["--help"], capsys, monkeypatch)
    listed = re.findall(r"(?m)^    ([a-z][a-z-]+)(?:  |$)", result.stdout)
    assert set(listed) == set(READS)


def test_an_option_a_step_does_not_read_is_refused_by_name(capsys, monkeypatch) -> None:
    result = run_release(["check-manifest", "--out", "somewhere"], capsys, monkeypatch)
    assert result.returncode == 2 and "unrecognized arguments: --out somewhere" in result.stderr


@pytest.mark.parametrize("port", ["70000", "-1", "eighty"])
def test_a_port_that_is_not_one_is_refused_naming_the_option(port, capsys, monkeypatch) -> None:
    result = run_release(["serve", "--port", port], capsys, monkeypatch)
    assert result.returncode == 2
    assert f"argument --port: expected a port from 0 to 65535; got '{port}'" in result.stderr


def test_the_install_hint_says_when_its_port_changes() -> None:
    url = "http://127.0.0.1:8080/simple/"
    assert install_hint(url, "activekv") == (
        f"install with: PIP_CONFIG_FILE=/dev/null pip install --index-url {url} activekv"
    )
    assert install_hint(url, "activekv", port_changes=True).endswith(
        " (this port is another each time the index is served; `serve --port N` keeps one)"
    )


# ------------------------------------------------------------------------- serve, for real


@contextmanager
def _serving(state: Path, *port: str) -> Iterator[tuple[str, str]]:
    """`python -m release serve [--port N]` in its own process: the URL it serves, and its hint."""
    process = subprocess.Popen(
        [sys.executable, "-m", "release", "serve", "--state-dir", str(state), *port],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        url = hint = None
        for line in process.stdout:
            if url is None and (found := re.search(r" at (http://\S+/simple/) ", line)):
                url = found.group(1)
            elif line.startswith("install with:"):
                hint = line.strip()
                break
        assert url and hint, f"serve exited ({process.poll()}) without serving"
        yield url, hint
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.integration
def test_serve_port_serves_the_same_url_each_time(tmp_path: Path) -> None:
    port = free_port()
    wanted = f"http://127.0.0.1:{port}/simple/"
    for _ in range(2):  # served, stopped, served again: the same URL, as the hint gave it
        with _serving(tmp_path / "state", "--port", str(port)) as (url, hint):
            assert url == wanted and answers(url)
            assert hint.endswith(f"--index-url {wanted} activekv"), hint


@pytest.mark.integration
def test_a_port_in_use_is_one_line_and_no_other_port(tmp_path: Path) -> None:
    port = free_port()
    with _serving(tmp_path / "first", "--port", str(port)):
        taken = subprocess.run(
            [sys.executable, "-m", "release", "serve", "--state-dir", str(tmp_path / "second"),
             "--port", str(port)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert taken.returncode == 2, taken.stdout + taken.stderr
    assert taken.stderr == (f"error: pypiserver cannot listen on 127.0.0.1:{port} (Address already "
                            "in use); give --port another, or 0 for any free one\n")  # fmt: skip
    assert "serving" not in taken.stdout  # it did not take another port


@pytest.mark.integration
def test_serve_without_a_port_says_the_port_changes(tmp_path: Path) -> None:
    with _serving(tmp_path / "state") as (url, hint):
        assert answers(url)
        assert hint.endswith("(this port is another each time the index is served; "
                             "`serve --port N` keeps one)")  # fmt: skip
