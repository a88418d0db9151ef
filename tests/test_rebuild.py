"""The consumer's rebuild check (`python -m release rebuild`, release/trust/rebuild.py) end to end.

A publisher builds the real wheel from a git repository of these sources, signs it and publishes
it to the embedded index with TUF; a consumer, knowing only the index, the trusted root, the
provenance key and where the source lives, rebuilds it cold from the commit the statement names.
The negative control publishes a wheel built from a tree with one byte of README.md changed (the
statement still names the clean commit): the rebuild must refuse it, naming the member.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_sign import attest_passing_gates

from release.build.reproduce import snapshot
from release.errors import VerifyError
from release.trust.index import EmbeddedIndex
from release.trust.rebuild import _build_inputs, toolchain_differences
from release.util.digests import sha256_file
from release.util.pins import project_version

REPO = Path(__file__).resolve().parent.parent
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# The publisher's builds share the checkout's compiler cache; the consumer's rebuild never does.
PUBLISHER_ENV = dict(os.environ, ACTIVEKV_CACHE_DIR=str(REPO / ".activekv" / "cache"))


def _release(cwd: Path, *args: str | Path, env: dict[str, str] | None = None):
    command = [sys.executable, "-m", "release", *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


def _git(*args: str | Path) -> str:
    command = ["git", "-c", "user.name=publisher", "-c", "user.email=publisher@example.org"]
    return subprocess.run(
        [*command, *map(str, args)], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def source_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git repository holding these sources in one commit: where the consumer rebuilds from."""
    source = snapshot(REPO, tmp_path_factory.mktemp("upstream") / "activekv")
    _git("-C", source, "init", "--quiet")
    _git("-C", source, "add", "--all")
    _git("-C", source, "commit", "--quiet", "--message", "the released sources")
    return source


def _publish_from(source: Path, work: Path) -> tuple[Path, Path, Path]:
    """Build, attest, sign and publish the wheel for this Python from `source` as a publisher
    would; (out, state, wheel)."""
    out, state = work / "out", work / "state"
    for step in (("build", "--python", PYTHON), ("sign",), ("publish",)):
        done = _release(source, *step, "--out", out, "--state-dir", state, env=PUBLISHER_ENV)
        assert done.returncode == 0, f"{step}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        if step[0] == "build":
            (wheel,) = sorted((out / "wheels").glob("*.whl"))
            attest_passing_gates(out, [wheel], state)
    return out, state, wheel


def _rebuild(out: Path, state: Path, source: Path, consumer: Path):
    trusted_root = json.loads((out / "publish.json").read_text())["tuf"]["trusted_root"]
    with EmbeddedIndex(state, "activekv-publisher") as index:
        return _release(
            REPO,
            "rebuild",
            "--index",
            index.simple_url,
            f"activekv=={project_version()}",
            "--root",
            trusted_root,
            "--provenance-key",
            out / "provenance" / "dev-signing-key.pub.json",
            "--tuf-cache",
            consumer / "tuf-cache",
            "--source",
            source,
            "--python",
            PYTHON,
            "--out",
            consumer,
        )


@pytest.mark.integration  # builds the real wheel, publishes, rebuilds it
def test_a_published_wheel_is_bit_identical_to_its_cold_rebuild(source_repo, tmp_path):
    out, state, wheel = _publish_from(source_repo, tmp_path / "publisher")
    consumer = tmp_path / "consumer"
    done = _rebuild(out, state, source_repo, consumer)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "bit-identical to its rebuild at commit" in done.stdout
    record = json.loads((consumer / "rebuild.json").read_text())
    assert record["wheel"] == wheel.name
    assert record["published_sha256"] == record["rebuilt_sha256"] == sha256_file(wheel)
    assert record["commit"] == _git("-C", source_repo, "rev-parse", "HEAD")
    assert record["differences"] == [] and record["toolchain_differences"] == []
    # compiled afresh: its own build trees, no compiler cache
    log = (consumer / "rebuild" / "rebuild.log").read_text()
    assert "build --fresh --python" in log and "built in" in log and "cached" not in log


@pytest.mark.integration  # builds the real wheel, publishes, rebuilds it
def test_a_wheel_built_from_a_changed_tree_is_refused_naming_the_member(source_repo, tmp_path):
    changed = tmp_path / "changed"
    _git("clone", "--quiet", source_repo, changed)
    readme = changed / "README.md"
    text = readme.read_bytes()
    at = text.index(b"ActiveKV")  # one byte: "ActiveKV" becomes "activeKV"
    readme.write_bytes(text[:at] + b"a" + text[at + 1 :])
    assert sum(a != b for a, b in zip(text, readme.read_bytes(), strict=True)) == 1
    out, state, wheel = _publish_from(changed, tmp_path / "publisher")

    done = _rebuild(out, state, source_repo, tmp_path / "consumer")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    message = " ".join(done.stderr.split())
    assert f"the rebuild of {wheel.name} at commit" in message
    assert "is not the published wheel" in message
    assert "activekv-0.1.0.dist-info/METADATA: first difference at byte" in message


def test_a_statement_without_a_commit_has_nothing_to_rebuild_from():
    statement = {
        "predicate": {
            "buildDefinition": {
                "resolvedDependencies": [],
                "internalParameters": {"source_date_epoch": 1},
            }
        }
    }
    with pytest.raises(VerifyError, match="names no source commit"):
        _build_inputs(statement)


@pytest.mark.parametrize(
    ("commit", "epoch", "named"),
    [
        ("--upload-pack=touch /tmp/x", 1, "gitCommit: expected a commit id"),
        ("a" * 40, None, "source_date_epoch: expected seconds"),
        ("a" * 40, "1700000000", "source_date_epoch: expected seconds"),
    ],
)
def test_a_statement_with_malformed_build_inputs_is_refused(commit, epoch, named):
    statement = {"predicate": {"buildDefinition": {
        "resolvedDependencies": [{"uri": "git+file:///x", "digest": {"gitCommit": commit}}],
        "internalParameters": {"source_date_epoch": epoch}}}}  # fmt: skip
    with pytest.raises(VerifyError, match=named):
        _build_inputs(statement)


def test_toolchain_differences_ignore_paths_and_ccache():
    recorded = {"zig": "0.17.1", "zig_path": "/a/zig", "ccache": "4.8", "nvcc_sha256": "aa"}
    used = {"zig": "0.17.1", "zig_path": "/b/zig", "ccache": "not used", "nvcc_sha256": "bb"}
    assert toolchain_differences(recorded, used) == [
        "nvcc_sha256: recorded 'aa', rebuilt with 'bb'"
    ]


@pytest.mark.parametrize("python", ["3", "3.12.1", "python3.12", ""])
def test_a_python_that_is_not_a_version_is_refused_before_anything_is_fetched(python, tmp_path):
    done = _release(
        REPO, "rebuild", "--index", "http://127.0.0.1:9/simple/", "activekv==0.1.0",
        "--root", tmp_path / "root.json", "--provenance-key", tmp_path / "key.json",
        "--source", tmp_path, "--python", python, "--out", tmp_path / "out",
    )  # fmt: skip
    assert done.returncode == 2
    assert "--python: expected a Python version X.Y, e.g. 3.12" in " ".join(done.stderr.split())


def test_missing_trust_inputs_are_named(tmp_path):
    done = _release(REPO, "rebuild", "activekv==0.1.0", "--out", tmp_path / "out")
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert "rebuild: also give --index, --root, --provenance-key, --source" in message
