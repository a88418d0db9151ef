"""The verify step's inputs, refused naming what is wrong before anything is downloaded: a
declared Python without an interpreter (the publisher's verify), a `--python` that is not an
interpreter, credentials in `--index` or `--tuf-url` (never echoed), a `--provenance-key` that
is not a public key. Real interpreters, real processes, the real manifest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from release.errors import VerifyError
from release.manifest import load_manifest
from release.trust.steps import declared_interpreters
from release.trust.tuf_client import TrustedIndex
from release.trust.verify import check_interpreter, tuf_url_for, verify_release
from release.util.interpreters import find_interpreter, version_of
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.util.urls import masked_url

SECRET = "s3cret-Pw"
WITH_PASSWORD = f"http://reader:{SECRET}@127.0.0.1:9/simple/"


def _release(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "release", *map(str, args)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


# ------------------------------------------------------------- the publisher's interpreters


def test_a_declared_python_without_an_interpreter_fails_the_publishers_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PATH holds every declared interpreter but the last and pyenv none: the verify is refused
    naming that version, where it used to check the others and pass."""
    manifest = load_manifest(DEFAULT_MANIFEST)
    found = {version: find_interpreter(version) for version in manifest.build.python}
    if None in found.values():
        pytest.skip(f"needs an interpreter of each of {list(found)} here")
    *present, absent = manifest.build.python
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for version in present:
        (bin_dir / f"python{version}").symlink_to(found[version])  # type: ignore[arg-type]
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(VerifyError, match=rf"build\.python: expected an interpreter of every "
                       rf"declared version .*got none for Python {absent} "):  # fmt: skip
        declared_interpreters(manifest)
    # the control: with that one there too, one interpreter of each declared version
    (bin_dir / f"python{absent}").symlink_to(found[absent])  # type: ignore[arg-type]
    interpreters = declared_interpreters(manifest)
    assert [version_of(path) for path in interpreters] == list(manifest.build.python)


# ------------------------------------------------------------------------------ --python


def _script(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("make", "got"),
    [
        (lambda tmp: tmp, "a folder"),
        (lambda tmp: _script(tmp / "notes.txt", "not a program\n", 0o644), "permission denied"),
        (lambda tmp: _script(tmp / "no", "#!/bin/sh\nexit 3\n", 0o755),
         "a program that exits with status 3 when asked its version"),
        (lambda tmp: tmp / "missing", "no such file or directory"),
        (lambda tmp: _script(tmp / "true", "#!/bin/sh\necho ok\n", 0o755),
         "a program that answers 'ok' when asked its Python version"),
    ],
)  # fmt: skip
def test_a_python_that_is_not_an_interpreter_is_named(
    tmp_path: Path, make: object, got: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(VerifyError) as caught:
        check_interpreter(path)
    assert str(caught.value) == (
        f"--python {path}: expected an executable Python interpreter; got {got}"
    )


def test_a_python_interpreter_passes_the_check() -> None:
    check_interpreter(Path(sys.executable))  # the control of the test above


@pytest.mark.parametrize("python", ["/tmp", "/etc/passwd"])
def test_verify_cli_names_a_bad_python_without_a_traceback(tmp_path: Path, python: str) -> None:
    result = _release(
        "verify", "--index", "http://127.0.0.1:9/simple/", "activekv==0.1.0", "--root",
        tmp_path / "1.root.json", "--provenance-key", tmp_path / "key.pub.json", "--python",
        python, "--out", tmp_path / "out",
    )  # fmt: skip
    assert result.returncode != 0
    assert f"--python {python}: expected an executable Python interpreter; got" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


# ---------------------------------------------------------------------- URL credentials


def _verify(tmp_path: Path, **overrides: object) -> None:
    arguments: dict[str, object] = {
        "index_url": "http://127.0.0.1:9/simple/", "requirement": "activekv==0.1.0",
        "trusted_root": tmp_path / "1.root.json", "provenance_key": tmp_path / "key.pub.json",
        "interpreters": [Path(sys.executable)], "imports": ["activekv._probe"],
        "workdir": tmp_path / "work", "cache_dir": tmp_path / "cache",
    }  # fmt: skip
    arguments.update(overrides)
    verify_release(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("flag", ["--index", "--tuf-url"])
@pytest.mark.parametrize(
    ("url", "shown", "got"),
    [
        (WITH_PASSWORD, "http://***@127.0.0.1:9/simple/", "user information (***@)"),
        (f"http://127.0.0.1:9/simple/?token={SECRET}", "http://127.0.0.1:9/simple/?***",
         "a query"),
        (f"http://{SECRET}@127.0.0.1:9/simple/#{SECRET}", "http://***@127.0.0.1:9/simple/#***",
         "user information (***@) and a fragment"),
    ],
)  # fmt: skip
def test_a_url_that_may_carry_a_secret_is_refused_without_echoing_it(
    tmp_path: Path, flag: str, url: str, shown: str, got: str
) -> None:
    """As the manifest refuses such a URL for an index, and masks it in its errors."""
    given = {"index_url": url} if flag == "--index" else {"tuf_url": url}
    with pytest.raises(VerifyError) as caught:
        _verify(tmp_path, **given)
    assert str(caught.value) == (
        f"{flag} {shown}: expected a URL without credentials, query or fragment (listing, "
        f"downloading and the TUF metadata need none); got {got}"
    )


def test_a_url_without_credentials_passes_that_check(tmp_path: Path) -> None:
    """The control: the same call with a plain URL gets past the URLs to the next input, the
    trusted root (here missing)."""
    with pytest.raises(VerifyError, match=r"--root .*1\.root\.json: the trusted TUF root cannot"):
        _verify(tmp_path, tuf_url="http://127.0.0.1:9/tuf/")
    assert masked_url("http://127.0.0.1:9/simple/") == "http://127.0.0.1:9/simple/"


def test_credentials_are_refused_wherever_a_tuf_url_is_made(tmp_path: Path) -> None:
    for call in (lambda: tuf_url_for(WITH_PASSWORD),
                 lambda: TrustedIndex(WITH_PASSWORD, tmp_path / "1.root.json")):  # fmt: skip
        with pytest.raises(VerifyError, match=r"http://\*\*\*@127\.0\.0\.1:9/") as caught:
            call()
        assert SECRET not in str(caught.value)
    assert masked_url(f"https://{SECRET}@host/simple/") == "https://***@host/simple/"  # a token
    assert masked_url(f"https://host/simple/?t={SECRET}#x") == "https://host/simple/?***#***"


def test_verify_cli_never_prints_a_password_of_its_index(tmp_path: Path) -> None:
    asked = _release("verify", "--index", WITH_PASSWORD, "activekv==0.1.0", "--out", tmp_path)
    assert asked.returncode != 0 and "also give --root, --provenance-key" in asked.stderr
    refused = _release("verify", "--index", WITH_PASSWORD, "activekv==0.1.0", "--root",
                       tmp_path / "root.json", "--provenance-key", tmp_path / "key.pub.json",
                       "--out", tmp_path)  # fmt: skip
    assert refused.returncode != 0 and "expected a URL without credentials" in " ".join(
        refused.stderr.split()
    )
    for result in (asked, refused):
        assert SECRET not in result.stdout + result.stderr
        assert "http://***@127.0.0.1:9/simple/" in " ".join(result.stderr.split())
