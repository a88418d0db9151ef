"""The main job end to end: real builds, real gates, a real pypiserver, fresh venvs.

The release is made once for the module, in a copy of this checkout committed as one commit
(`checkout`), and every test reads that one release. Kept cheap for CI, said where it is made:
the copy's manifest keeps two of the parity gate's CPU cells (dev does not require parity, and
its 29 cells on three wheels were ~70 s of CI; no test here reads parity's verdict). The copy's
commit is dated at this checkout's SOURCE_DATE_EPOCH and the compiler and wheel caches are the
repository's `.activekv/cache`, so its wheels are this checkout's (a warm machine rebuilds
nothing).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from fixtures_checkout import committed_snapshot

from release.gates.policy import tag_glibc
from release.util.digests import sha256_file
from tests.ci_manifests import fewer_parity_cells

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parent.parent
KEPT_CELLS = 2


def _release(
    *args: str, cwd: Path, out: Path | None, state: Path | None
) -> subprocess.CompletedProcess[str]:
    """`python -m release` in `cwd`, with `--out` and `--state-dir` where given (a step refuses
    an option it does not read)."""
    env = {**os.environ, "ACTIVEKV_CACHE_DIR": str(REPO / ".activekv" / "cache")}
    where = [*(("--out", str(out)) if out else ()), *(("--state-dir", str(state)) if state else ())]
    return subprocess.run(
        [sys.executable, "-m", "release", *args, *where],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=3000,
    )  # fmt: skip


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's files (tracked and untracked, as a build reads them) committed in a new
    repository, its manifest less all but the first KEPT_CELLS of parity's CPU cells (module
    docstring)."""

    def fewer_cells(repo: Path) -> None:
        manifest = repo / "manifests" / "activekv.toml"
        manifest.write_text(fewer_parity_cells(manifest.read_text(), KEPT_CELLS))

    return committed_snapshot(tmp_path_factory.mktemp("checkout") / "activekv",
                              "the e2e release: two parity cells", fewer_cells)  # fmt: skip


@pytest.fixture(scope="module")
def release_run(checkout: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("release")
    out, state = root / "out", root / "state"
    result = _release("run", cwd=checkout, out=out, state=state)
    print(result.stdout[-6000:], result.stderr[-6000:])
    assert result.returncode == 0, result.stderr[-4000:]
    # The earlier outputs a run sets aside are gone once its own stand (release/util/set_aside.py).
    assert not [p for p in out.iterdir() if p.name.startswith((".set-aside-", ".discarded-"))]
    parity = json.loads((out / "evidence" / "parity.json").read_text())
    assert parity["verdict"] == "pass", parity  # the kept cells ran, on every wheel
    return result, out, state


def _index_files(state: Path) -> dict[str, tuple[str, int]]:
    packages = state / "index" / "packages"
    return {p.name: (sha256_file(p), p.stat().st_mtime_ns) for p in packages.iterdir()}


def test_release_summary_names_every_wheel_and_the_signed_statement(release_run):
    result, out, _ = release_run
    wheels = sorted((out / "wheels").glob("*.whl"))
    assert len(wheels) >= 1
    for wheel in wheels:
        assert sha256_file(wheel) in result.stdout
        assert wheel.name.startswith("activekv-0.1.0-")
    envelope = out / "provenance" / "activekv-0.1.0.intoto.json"
    assert sha256_file(envelope) in result.stdout
    assert "install with: PIP_CONFIG_FILE=/dev/null pip install --index-url" in result.stdout


def test_skipped_versions_are_said_with_a_reason(release_run):
    _, out, _ = release_run
    build = json.loads((out / "build.json").read_text())
    built = {v for wheel in build["wheels"] for v in wheel["serves"]}
    skipped = {s["python"]: s["reason"] for s in build["skipped"]}
    assert built | set(skipped) == {"3.10", "3.11", "3.12", "3.13"}
    assert all(reason for reason in skipped.values())


def test_auditwheel_policy_is_no_newer_than_declared(release_run):
    _, out, _ = release_run
    policy = json.loads((out / "evidence" / "policy.json").read_text())
    assert policy["verdict"] == "pass"
    for wheel in (out / "wheels").glob("*.whl"):
        shown = policy["figures"]["wheels"][wheel.name]["auditwheel_show"]
        assert tag_glibc(shown) <= (2, 28)
        assert policy["artefacts"][wheel.name] == sha256_file(wheel)


def test_the_sdist_is_built_judged_and_signed_with_the_wheels(release_run):
    _, out, _ = release_run
    build = json.loads((out / "build.json").read_text())
    (sdist,) = (out / "sdist").glob("*.tar.gz")
    assert build["sdist"]["file"] == sdist.name == "activekv-0.1.0.tar.gz"
    assert build["sdist"]["sha256"] == sha256_file(sdist)
    with tarfile.open(sdist) as archive:  # stamped with the wheels' SOURCE_DATE_EPOCH
        assert {m.mtime for m in archive.getmembers()} == {build["source_date_epoch"]}
    payload = json.loads((out / "evidence" / "payload.json").read_text())
    assert payload["verdict"] == "pass"
    assert payload["figures"]["sdist"]["sha256"] == sha256_file(sdist)
    assert sdist.name not in payload["artefacts"]  # the gates' artefacts are the wheels
    sign = json.loads((out / "sign.json").read_text())
    assert sign["subjects"][sdist.name] == sha256_file(sdist)


def test_published_wheels_install_from_the_index_and_import(release_run):
    _, out, _ = release_run
    publish = json.loads((out / "publish.json").read_text())
    assert {f["outcome"] for f in publish["files"]} == {"uploaded"}
    verify = json.loads((out / "verify.json").read_text())
    wheels = {w.name: sha256_file(w) for w in (out / "wheels").glob("*.whl")}
    (sdist,) = (out / "sdist").glob("*.tar.gz")
    released = {**wheels, sdist.name: sha256_file(sdist)}  # the sdist is published with them
    assert {f["file"]: f["sha256"] for f in publish["files"]} == released
    assert verify["served"] == released  # every file the index serves, checked against it
    assert {check["wheel"] for check in verify["checks"]} == set(wheels)
    for check in verify["checks"]:
        assert check["digest_ok"] and check["sha256"] == wheels[check["wheel"]]
        assert check["imported"] == ["activekv._engine", "activekv._fabric"]


def test_second_publish_says_the_version_exists_and_changes_nothing(release_run, checkout):
    _, out, state = release_run
    before = _index_files(state)
    again = _release("publish", cwd=checkout, out=out, state=state)
    assert again.returncode == 0, again.stderr
    assert "activekv 0.1.0 already exists on the index; nothing uploaded" in again.stdout
    assert _index_files(state) == before


def test_a_wheel_changed_after_its_gates_is_refused(release_run, checkout, tmp_path):
    _, out, state = release_run
    tampered_out = tmp_path / "out"
    shutil.copytree(out, tampered_out)
    wheel = sorted((tampered_out / "wheels").glob("*.whl"))[0]
    with wheel.open("ab") as stream:
        stream.write(b"\0")
    before = _index_files(state)
    refused = _release("publish", cwd=checkout, out=tampered_out, state=state)
    assert refused.returncode == 2
    assert "refuses to publish; nothing was uploaded" in refused.stderr
    assert re.search(
        rf"payload: no attestation in .* passes on the wheels being published.*names other "
        rf"wheels; changed since it was judged: {re.escape(wheel.name)}",
        " ".join(refused.stderr.split()),
    )
    assert _index_files(state) == before


def test_the_published_release_names_its_gate_attestations(release_run):
    result, out, state = release_run
    envelope = json.loads((out / "provenance" / "activekv-0.1.0.intoto.json").read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    named = {entry["annotations"]["gate"]: entry["digest"]["sha256"]
             for entry in statement["predicate"]["runDetails"]["byproducts"]}  # fmt: skip
    requires = statement["predicate"]["buildDefinition"]["externalParameters"]["gates"]
    assert set(named) == set(requires) == {"policy", "payload", "casters"}
    stored = state / "index" / "metadata" / "activekv-0.1.0.attestations"
    for gate, digest in named.items():
        assert sha256_file(out / "evidence" / f"{gate}.intoto.json") == digest
        assert sha256_file(stored / f"{gate}.intoto.json") == digest
        assert f"{gate}: attestation signed by" in result.stdout


def test_stable_refuses_dev_attestations_and_gpu_attestations_of_other_wheels(
    release_run, checkout, tmp_path
):
    _, out, state = release_run
    keys, manifest = tmp_path / "keys", tmp_path / "manifests" / "activekv.toml"
    # The checkout's own manifest, every parity cell kept; keygen --pin edits the copy.
    shutil.copytree(REPO / "manifests", manifest.parent)
    made = _release("keygen", "--manifest", str(manifest), "--channel", "stable", str(keys),
                    "--pin", cwd=checkout, out=None, state=None)  # fmt: skip
    assert made.returncode == 0, made.stderr
    # One wheel changed after the GPU runner judged this commit's wheels (tests/gpu/evidence).
    changed_out = tmp_path / "out"
    shutil.copytree(out, changed_out)
    wheel = sorted((changed_out / "wheels").glob("*.whl"))[0]
    with wheel.open("ab") as stream:
        stream.write(b"\0")
    before = _index_files(state)
    refused = _release("publish", "--manifest", str(manifest), "--channel", "stable",
                       "--key-dir", str(keys), cwd=checkout, out=changed_out,
                       state=state)  # fmt: skip
    assert refused.returncode == 2
    text = " ".join(refused.stderr.split())
    assert "channel 'stable' refuses to publish; nothing was uploaded" in text
    # The CPU gates ran on the dev channel: the dev key's attestations do not count for stable.
    assert re.search(r"policy: no attestation .* not by a key of .*attesters\.cpu", text)
    # The committed GPU attestations name the wheels as they were judged: the changed one is named.
    assert re.search(rf"warmup: no attestation .*tests/gpu/evidence.* changed since it was "
                     rf"judged: [^;]*{re.escape(wheel.name)}", text)  # fmt: skip
    assert _index_files(state) == before
