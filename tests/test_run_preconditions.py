"""`python -m release run` checks every input it can check in a moment before it changes
anything: refused there (a host compiler not on PATH, a declared Python missing, a signing key or
TUF key that does not load, a remote index without credentials), it says so in one line and
`<out>` is as it was, byte for byte. An earlier run's evidence, records and report are moved
aside, not deleted, when a run starts: a build that fails puts them back."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from release.trust.sign import key_paths, load_signer
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.util.set_aside import SetAside, restore_leftovers

pytestmark = pytest.mark.integration  # real `python -m release run` processes

EARLIER_RUN = {
    "evidence/policy.json": b'{"gate": "policy"}\n',
    "evidence/policy.intoto.json": b"{}\n",
    "build.json": b"{}\n",
    "sign.json": b"{}\n",
    "publish.json": b"{}\n",
    "verify.json": b"{}\n",
    "report.md": b"# the earlier run\n",
    "report.html": b"<p>the earlier run</p>\n",
    "wheels/activekv-0.1.0-cp312-abi3-manylinux_2_28_x86_64.whl": b"PK\x05\x06" + b"\0" * 18,
    "sdist/activekv-0.1.0.tar.gz": b"the earlier run's sdist\n",
    "provenance/activekv-0.1.0.intoto.json": b"{}\n",
    "notes.txt": b"the operator's own file\n",
}


def _earlier_out(out: Path) -> Path:
    for name, data in EARLIER_RUN.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return out


def tree_digest(root: Path) -> str:
    """One sha256 over every path under ``root``: its name, type, mode and bytes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest.update(f"{path.relative_to(root)}\0{stat.filemode(info.st_mode)}\0".encode())
        if path.is_file() and not path.is_symlink():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _manifest(tmp_path: Path, replace: tuple[str, str] | None = None, extra: str = "") -> Path:
    text = DEFAULT_MANIFEST.read_text()
    if replace is not None:
        assert replace[0] in text
        text = text.replace(*replace)
    path = tmp_path / "manifest" / "activekv.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text + extra)
    return path


def _run(manifest: Path, out: Path, state: Path, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "release", "run", "--manifest", str(manifest), "--out", str(out),
         "--state-dir", str(state)],
        cwd=REPO_ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def _refused(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # one line
    return result.stderr


def _missing_tuf_key(tmp_path: Path) -> str:
    tables = [f'[publish.tuf_keys.{role}]\nkey = "file:{tmp_path / "keys" / role}.pem"\n'
              for role in ("root", "targets", "snapshot", "timestamp")]  # fmt: skip
    return "\n" + "\n".join(tables)


CASES = {
    "host compiler": (
        ('cuda_host_compiler = "g++"', 'cuda_host_compiler = "no-such-g++-anywhere"'), "",
        "build.toolchain.cuda_host_compiler: expected a program on PATH; "
        "'no-such-g++-anywhere' was not found",
    ),
    "remote index credentials": (
        ('index = "embedded"', 'index = "http://127.0.0.1:9/simple/"\ntuf_dir = "served-tuf"\n'
         'tuf_url = "http://127.0.0.1:9/tuf/"'), "",
        "needs credentials",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_refused_on_a_precondition_leaves_out_byte_for_byte(
    case: str, tmp_path: Path
) -> None:
    replace, extra, expected = CASES[case]
    out = _earlier_out(tmp_path / "out")
    before = tree_digest(out)
    env = {"PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}
    env.update({name: "" for name in os.environ if name.startswith("ACTIVEKV_INDEX_")})
    refused = _run(_manifest(tmp_path, replace, extra), out, tmp_path / "state", env)
    assert expected in _refused(refused)
    assert tree_digest(out) == before


def test_a_missing_tuf_key_file_refuses_the_run_before_anything_changes(tmp_path: Path) -> None:
    out = _earlier_out(tmp_path / "out")
    before = tree_digest(out)
    refused = _run(_manifest(tmp_path, extra=_missing_tuf_key(tmp_path)), out, tmp_path / "state")
    message = _refused(refused)
    assert "publish.tuf_keys.root: " in message and str(tmp_path / "keys" / "root.pem") in message
    assert tree_digest(out) == before


def test_a_lost_signing_key_refuses_the_run_before_anything_changes(tmp_path: Path) -> None:
    """The dev signing key's public half is in the state directory, its private key is gone."""
    out = _earlier_out(tmp_path / "out")
    before = tree_digest(out)
    state = tmp_path / "state"
    load_signer("generate", channel="dev", state_dir=state)
    private, public = key_paths(state, "dev")
    private.unlink()
    refused = _run(_manifest(tmp_path), out, state)
    assert f"{public} exists but its private key {private} does not" in _refused(refused)
    assert tree_digest(out) == before


def test_a_missing_declared_interpreter_refuses_the_run_before_anything_changes(
    tmp_path: Path,
) -> None:
    """No Python but this machine's /usr/bin one: verify could not install on 3.10, 3.12, 3.13."""
    out = _earlier_out(tmp_path / "out")
    before = tree_digest(out)
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("g++", "git"):
        found = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        if found:
            (bare / tool).symlink_to(found)
    env = {"PATH": str(bare), "PYENV_ROOT": str(tmp_path / "no-pyenv")}
    refused = _run(_manifest(tmp_path), out, tmp_path / "state", env)
    message = _refused(refused)
    assert "build.python: expected an interpreter of every declared version" in message
    assert tree_digest(out) == before


def test_a_build_that_fails_puts_the_earlier_run_back(tmp_path: Path) -> None:
    """Past the checks, the build fails once its sdist is made (an ACTIVEKV_CUDA_COMPILER the
    wheel build does not know): the earlier run's evidence, records, report, wheels and sdist
    are back as they were; the failed build's logs stay beside them, to be read."""
    out = _earlier_out(tmp_path / "out")
    before = tree_digest(out)
    failed = _run(_manifest(tmp_path), out, tmp_path / "state", {"ACTIVEKV_CUDA_COMPILER": "?"})
    assert "ACTIVEKV_CUDA_COMPILER: expected 'auto' or 'wheels'" in _refused(failed)
    assert (out / "logs" / "build-sdist.log").is_file()
    shutil.rmtree(out / "logs")
    assert tree_digest(out) == before


# ----------------------------------------------------------------------------- SetAside itself


def test_set_aside_outputs_are_removed_once_the_new_ones_stand(tmp_path: Path) -> None:
    out = _earlier_out(tmp_path / "out")
    with SetAside(out, ["evidence", "report.md", "absent.json"]) as aside:
        assert not (out / "evidence").exists() and not (out / "report.md").exists()
        (out / "report.md").write_text("# the new run\n")
        aside.discard()
    assert not (out / "evidence").exists()
    assert (out / "report.md").read_text() == "# the new run\n"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_set_aside_outputs_replace_what_a_failed_run_left(tmp_path: Path) -> None:
    out = _earlier_out(tmp_path / "out")
    before = tree_digest(out)
    with pytest.raises(RuntimeError), SetAside(out, ["evidence", "sign.json"]):
        (out / "evidence").mkdir()
        (out / "evidence" / "half.json").write_text("{")
        raise RuntimeError("the build failed")
    assert tree_digest(out) == before


def test_what_a_killed_run_set_aside_is_put_back_by_the_next(tmp_path: Path) -> None:
    out = _earlier_out(tmp_path / "out")
    before = tree_digest(out)
    killed = out / ".set-aside-killed"
    killed.mkdir()
    (out / "evidence").rename(killed / "evidence")
    (out / ".discarded-killed").mkdir()  # a removal a kill interrupted
    restore_leftovers(out)
    assert tree_digest(out) == before
