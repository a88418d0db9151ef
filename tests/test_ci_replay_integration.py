"""The dev channel replayed end to end (`python -m release.ci.replay`): the wheels job's matrix
and the release job, each in a fresh clone, publishing to devpi-server at the manifest's
ci.release.index with TUF served at ci.release.tuf_url, and verified from there as a consumer.

Kept cheap for CI, in two ways, each said where it is made:

* the cibuildwheel step takes the wheels of the hermetic build (`--wheels`, from the wheel
  cache), not a host build of each (minutes of compiling; and such wheels carry this host's
  manylinux_2_34, which dev's policy gate refuses: docs/ci.md);
* the replayed commit is HEAD with the served-path gate left out of the manifest and the
  workflow `python -m release ci` writes from that: the release job then installs no vLLM
  (~10 GB; dev does not require that gate, whose step is continue-on-error), and with two of
  the parity gate's CPU cells (dev does not require parity either: its 29 cells on three wheels
  are ~2 minutes of CI). Everything else is the committed workflow's, step for step.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from release.trust.server_process import bind_error
from release.util.paths import REPO_ROOT
from tests.ci_manifests import fewer_parity_cells

pytestmark = [pytest.mark.integration, pytest.mark.remote_index]

CACHE = Path(os.environ.get("ACTIVEKV_CACHE_DIR") or REPO_ROOT / ".activekv" / "cache")
PASSWORD = "replay-index-pass-8d41c2"
GIT = {
    "GIT_AUTHOR_NAME": "replay",
    "GIT_AUTHOR_EMAIL": "replay@localhost",
    "GIT_COMMITTER_NAME": "replay",
    "GIT_COMMITTER_EMAIL": "replay@localhost",
}
SERVED_PATH_TABLE = re.compile(
    r"\[gates\.served-path\]\n(?:#.*\n|runner = \"cpu\"\n|installs = \[\n(?:  .*\n)*\]\n)*\n"
)


def _run(command: list[str], cwd: Path, timeout: float = 600) -> str:
    done = subprocess.run(
        command, cwd=cwd, env={**os.environ, **GIT}, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def commit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """HEAD, less the served-path gate (module docstring), committed in a clone."""
    repo = tmp_path_factory.mktemp("replayed") / "repo"
    _run(["git", "clone", "--quiet", str(REPO_ROOT), str(repo)], REPO_ROOT)
    head = _run(["git", "rev-parse", "HEAD"], REPO_ROOT).strip()
    _run(["git", "checkout", "--quiet", "-B", "replayed", head], repo)
    manifest = repo / "manifests" / "activekv.toml"
    text, count = SERVED_PATH_TABLE.subn("", manifest.read_text())
    assert count == 1
    text = text.replace('"parity", "served-path", "warmup"', '"parity", "warmup"')
    manifest.write_text(fewer_parity_cells(text, 2))
    _run([sys.executable, "-m", "release", "ci"], repo)
    workflow = (repo / ".github" / "workflows" / "release.yml").read_text()
    assert "vllm" not in workflow and "served-path" not in workflow
    _run(["git", "commit", "--quiet", "-am", "the replay's test: no served-path gate"], repo)
    return repo, _run(["git", "rev-parse", "HEAD"], repo).strip()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hermetic build's wheels (from the wheel cache once any test built them)."""
    out = tmp_path_factory.mktemp("hermetic") / "out"
    env = {**os.environ, "ACTIVEKV_CACHE_DIR": str(CACHE)}
    done = subprocess.run(
        [sys.executable, "-m", "release", "build", "--out", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list((out / "wheels").glob("*.whl"))) == 3
    return out / "wheels"


def test_the_dev_channel_replays_end_to_end(
    commit: tuple[Path, str], wheels: Path, tmp_path: Path
) -> None:
    repo, head = commit
    secrets = tmp_path / "secrets"
    secrets.write_text(f"ACTIVEKV_INDEX_USERNAME=release-bot\nACTIVEKV_INDEX_PASSWORD={PASSWORD}\n")
    secrets.chmod(0o600)
    work = tmp_path / "run"
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "release.ci.replay",
            "--repo",
            str(repo),
            "--commit",
            head,
            "--channel",
            "dev",
            "--wheels",
            str(wheels),
            "--secrets",
            str(secrets),
            "--work",
            str(work),
            "--runner-dir",
            str(tmp_path / "runner"),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "ACTIVEKV_CACHE_DIR": str(CACHE)},
        capture_output=True,
        text=True,
        timeout=2400,
    )
    seconds = time.monotonic() - started
    print(f"the dev replay took {seconds:.0f} s")
    summary = (work / "summary.md").read_text()
    assert done.returncode == 0, f"{summary}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    for row in (
        "| wheel for Python 3.10 on x86_64 | | success |",
        "| wheel for Python 3.12 on x86_64 | | success |",
        # dev requires no GPU gate: the GPU job's condition leaves it out of a dev run.
        "| gpu-gates | | skipped |",
        "| release (a tag releases on stable) | | success |",
        "| | publish (refuses unless the channel's gates passed on these digests) | success |",
        "| | verify from the index, as a consumer | success |",
    ):
        assert row in summary, summary
    out = done.stdout
    assert "stand-in (--wheels): cp310-manylinux_x86_64: activekv-0.1.0-cp310-cp310-" in out
    assert "stand-in for actions/download-artifact (v8.0.1)" in out
    assert "started devpi-server http://127.0.0.1:3141/activekv/release/" in out
    # The index and the TUF folder's server are gone with the replay.
    assert bind_error(3141) is None and bind_error(8141) is None
    assert (tmp_path / "runner" / "tuf" / "metadata" / "1.root.json").is_file()
    # The password is never printed nor logged (the runner's own logs aside: devpi's).
    logged = [p for p in work.rglob("*") if p.is_file() and p.suffix in (".log", ".md")]
    assert logged and all(PASSWORD not in p.read_text(errors="replace") for p in logged)
    assert PASSWORD not in out + done.stderr
