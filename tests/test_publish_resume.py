"""Kill a real `python -m release publish` between two uploads and run it again: the index ends with
every file exactly once, identical digests, nothing overwritten, and the TUF metadata complete.
Killed after storing its attestations and before its statement, a publish signed again completes
the version with its own attestations."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)
from fixtures_sign import TAGS, attest_passing_gates, gated_out, signed_out_dir

from release.manifest import load_manifest
from release.trust.attestation import published_name
from release.trust.index import EmbeddedIndex
from release.trust.publish import PAUSE_ENV
from release.trust.release_version import PROVENANCE_PREFIX
from release.trust.statement_store import PAUSE_BEFORE_STATEMENT_ENV
from release.trust.tuf_metadata import TufRepository
from release.util.digests import sha256_file
from release.util.paths import DEFAULT_MANIFEST
from release.util.pins import project_version

pytestmark = pytest.mark.integration  # real index servers, twine and killed processes

REPO = Path(__file__).resolve().parent.parent


def _release(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "release", *map(str, args)]


@pytest.fixture
def signed_out(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    """An output directory as the gates and the sign step leave it, for three fixture wheels."""
    return signed_out_dir(tmp_path, project_version())


def _wait_for_first_upload(packages: Path, log: Path, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, "publish ended before it could be interrupted"
        # the server logs a request once it has answered it: the file is complete by then
        accepted = log.exists() and log.read_text(errors="replace").count('"POST / HTTP') >= 1
        stored = sorted(packages.glob("*.whl")) if packages.exists() else []
        if accepted and stored:
            assert len(stored) == 1
            return stored[0].name
        time.sleep(0.1)
    raise AssertionError("the first upload never reached the index")


def _killable_env(state: Path, pause: str) -> dict[str, str]:
    """The environment of a publish to kill: paused a minute at ``pause``, its temporary folder
    (the wheels' private copies, which a killed publish cannot remove) beside ``state``."""
    scratch = state.parent / "killed-tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, **{pause: "60", "TMPDIR": str(scratch)})


def _killed_after_first_upload(command: list[str], state: Path) -> str:
    """Run a publish ``command`` and kill it once its first upload is stored; that file's name."""
    packages, log = state / "index" / "packages", state / "index" / "server.log"
    env = _killable_env(state, PAUSE_ENV)
    # a session of its own: the kill takes the publisher, twine and its pypiserver together
    first = subprocess.Popen(
        command, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.DEVNULL
    )
    try:
        uploaded_first = _wait_for_first_upload(packages, log, first)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL
    return uploaded_first


def test_publish_killed_between_uploads_resumes_without_duplicates_or_overwrites(
    signed_out: tuple[Path, Path, list[Path]],
) -> None:
    out, state, wheels = signed_out
    packages = state / "index" / "packages"
    command = _release("publish", "--out", out, "--state-dir", state)
    uploaded_first = _killed_after_first_upload(command, state)
    before = (packages / uploaded_first).stat()
    assert TufRepository(state / "index" / "tuf").targets() == {}  # nothing committed yet

    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr

    stored = sorted(packages.iterdir())
    assert [p.name for p in stored] == sorted(w.name for w in wheels)  # each file once
    assert {p.name: sha256_file(p) for p in stored} == {w.name: sha256_file(w) for w in wheels}
    after = (packages / uploaded_first).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    record = json.loads((out / "publish.json").read_text())
    outcomes = {f["file"]: f["outcome"] for f in record["files"]}
    assert outcomes.pop(uploaded_first) == "already present, identical"
    assert set(outcomes.values()) == {"uploaded"}
    targets = TufRepository(state / "index" / "tuf").targets()
    release = f"{PROVENANCE_PREFIX}activekv-{project_version()}"
    attested = {f"{release}.attestations/{gate}.intoto.json"
                for gate in load_manifest(DEFAULT_MANIFEST).channel("dev").requires}  # fmt: skip
    assert set(targets) == {w.name for w in wheels} | {f"{release}.intoto.json"} | attested
    for wheel in wheels:
        assert targets[wheel.name].hashes["sha256"] == sha256_file(wheel)

    # a third run changes nothing at all
    third = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "already exists on the index; nothing uploaded" in third.stdout
    assert {p.name: p.stat().st_mtime_ns for p in sorted(packages.iterdir())} == {
        p.name: p.stat().st_mtime_ns for p in stored
    }


def test_a_half_published_version_is_not_taken_over_by_another_set_of_files(
    signed_out: tuple[Path, Path, list[Path]], tmp_path: Path
) -> None:
    """Killed after its first upload, a version keeps the file set its publish started with: a
    publish of the same version from other wheels is refused, uploading nothing, and re-running
    the interrupted publish completes it."""
    out, state, wheels = signed_out
    packages = state / "index" / "packages"
    uploaded_first = _killed_after_first_upload(
        _release("publish", "--out", out, "--state-dir", state), state
    )
    other_out = tmp_path / "other-out"
    gated_out(other_out, TAGS[:2], project_version(), state)  # two of the three wheels
    signed = subprocess.run(_release("sign", "--out", other_out, "--state-dir", state), cwd=REPO,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert signed.returncode == 0, signed.stdout + signed.stderr

    taken_over = subprocess.run(_release("publish", "--out", other_out, "--state-dir", state),
                                cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert taken_over.returncode != 0
    message = " ".join(taken_over.stdout.split() + taken_over.stderr.split())
    assert "files were fixed by the first publish that started it" in message
    assert f"in it but not given: {wheels[2].name}" in message
    assert [p.name for p in packages.iterdir()] == [uploaded_first]  # nothing uploaded

    completed = subprocess.run(_release("publish", "--out", out, "--state-dir", state), cwd=REPO,
                               capture_output=True, text=True, timeout=300)  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert {p.name: sha256_file(p) for p in packages.iterdir()} == {
        w.name: sha256_file(w) for w in wheels
    }
    assert set(TufRepository(state / "index" / "tuf").targets()) >= {w.name for w in wheels}


def _consumer_verify(out: Path, state: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """`verify --index` of the published version, as a consumer, on this interpreter."""
    record = json.loads((out / "publish.json").read_text())
    with EmbeddedIndex(state, "activekv-publisher") as index:
        return subprocess.run(
            _release("verify", "--index", index.simple_url, f"activekv=={project_version()}",
                     "--root", record["tuf"]["trusted_root"], "--provenance-key",
                     out / "provenance" / "dev-signing-key.pub.json", "--tuf-cache", cache,
                     "--python", sys.executable, "--import", "activekv._probe", "--out", out),
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip


def test_a_publish_killed_before_its_statement_is_completed_by_a_new_signing(
    signed_out: tuple[Path, Path, list[Path]], tmp_path: Path
) -> None:
    """Killed after storing its attestations and before its statement; the gates and sign run
    again (new attestations) and the publish after them stores its own, not the killed one's:
    the consumer's verify passes, and a further publish has nothing to do."""
    out, state, wheels = signed_out
    command = _release("publish", "--out", out, "--state-dir", state)
    release = f"activekv-{project_version()}"
    attached = state / "index" / "metadata" / f"{release}.attestations"
    gates = load_manifest(DEFAULT_MANIFEST).channel("dev").requires
    names = {published_name(gate) for gate in gates}
    env = _killable_env(state, PAUSE_BEFORE_STATEMENT_ENV)
    first = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        # each is renamed into place whole: once all are there, the publish is before its statement
        while not (attached.is_dir() and {p.name for p in attached.iterdir()} >= names):
            assert first.poll() is None and time.monotonic() < deadline, "no attestations stored"
            time.sleep(0.1)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert not (state / "index" / "metadata" / f"{release}.intoto.json").exists()
    orphans = {name: sha256_file(attached / name) for name in names}

    attest_passing_gates(out, wheels, state)
    signed = subprocess.run(_release("sign", "--out", out, "--state-dir", state), cwd=REPO,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert signed.returncode == 0, signed.stdout + signed.stderr
    fresh = {name: sha256_file(out / "evidence" / name) for name in names}
    assert set(fresh.values()).isdisjoint(orphans.values())

    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert {name: sha256_file(attached / name) for name in names} == fresh
    verified = _consumer_verify(out, state, tmp_path / "cache")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    third = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "already exists on the index; nothing uploaded" in third.stdout


def _private_key_secrets(pem_path: Path) -> set[str]:
    """The forms a leaked private key would take: PEM body, raw seed as hex and base64."""
    pem = pem_path.read_bytes()
    private = load_pem_private_key(pem, password=None)
    seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    body = "".join(line for line in pem.decode().splitlines() if not line.startswith("-----"))
    return {body, seed.hex(), base64.b64encode(seed).decode(), base64.b64encode(pem).decode()}


def test_no_private_key_material_in_any_output_or_log_of_a_release(
    signed_out: tuple[Path, Path, list[Path]], tmp_path: Path
) -> None:
    """sign, publish (with TUF) and the consumer's verify, run as commands; then every file they
    wrote and everything they printed is scanned for the bytes of every private key."""
    out, state, _ = signed_out
    published = subprocess.run(_release("publish", "--out", out, "--state-dir", state), cwd=REPO,
                               capture_output=True, text=True, timeout=300)  # fmt: skip
    assert published.returncode == 0, published.stdout + published.stderr
    verified = _consumer_verify(out, state, tmp_path / "cache")
    assert verified.returncode == 0, verified.stdout + verified.stderr

    private_files = sorted(state.glob("keys/*.pem")) + sorted(state.glob("index/tuf/keys/*.pem"))
    assert len(private_files) == 5  # the dev signing key and one key per TUF role
    secrets = set().union(*(_private_key_secrets(p) for p in private_files))
    assert (out / "sign-output.txt").read_text().startswith("signed 3 wheel(s)")
    texts = {"publish output": published.stdout + published.stderr,
             "verify output": verified.stdout + verified.stderr}  # fmt: skip
    scanned = [p for p in sorted(out.rglob("*")) + sorted(state.rglob("*"))
               + sorted((tmp_path / "cache").rglob("*"))
               if p.is_file() and p not in private_files]  # fmt: skip
    assert any(p.name == "server.log" for p in scanned)
    assert any(p.name == "timestamp.json" for p in scanned)
    for path in scanned:
        texts[str(path)] = path.read_bytes().decode("latin-1")
    for where, text in texts.items():
        assert "PRIVATE KEY" not in text, where
        for secret in secrets:
            assert secret not in text, f"private key material in {where}"
