"""The verify step end to end: a fixture wheel published to a real embedded index, downloaded
with a clean pip, checked against the signed statement, installed into fresh venvs and imported."""

from __future__ import annotations

import copy
import hashlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from fixtures_wheels import build_wheel

from release.errors import VerifyError
from release.statement import Statement
from release.trust.index import EmbeddedIndex
from release.trust.publish import publish
from release.trust.sign import (
    build_statement,
    load_signer,
    read_and_verify_envelope,
    sign_statement,
    write_envelope,
)
from release.trust.verify import Verification, clean_pip_env, verify_from_index
from release.util.digests import sha256_file

pytestmark = pytest.mark.integration  # pip installs into fresh venvs from a real index

PYTHON_312 = Path("/root/.pyenv/versions/3.12.1/bin/python")
IMPORTS = ["activekv._probe"]


@dataclass(frozen=True)
class Published:
    index: EmbeddedIndex
    wheel: Path
    statement: dict[str, Any]  # read back from the stored envelope, signature verified


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Published]:
    root = tmp_path_factory.mktemp("verify")
    state_dir = root / "state"
    # The module prints when imported: the import probe's answer must still be read.
    wheel = build_wheel(root / "dist", module_text='print("{not json")\nVALUE = 42\n')
    signer, key = load_signer("generate", channel="dev", state_dir=state_dir)
    started = datetime.now(timezone.utc)
    statement = build_statement(
        [wheel],
        version="0.1.0",
        channel="dev",
        manifest_path=Path("manifests/activekv.toml"),
        manifest_sha256="0" * 64,
        source_commit=None,
        source_date_epoch=1_700_000_000,
        toolchain={"python": sys.version.split()[0]},
        started=started,
        finished=started + timedelta(seconds=1),
    )
    envelope = root / "activekv-0.1.0.intoto.json"
    write_envelope(sign_statement(statement, signer), envelope)
    with EmbeddedIndex(state_dir, "activekv-publisher") as index:
        report = publish([wheel], index, envelope=envelope, metadata_dir=state_dir / "metadata")
        # verification trusts the statement stored next to the index, after its signature
        trusted = read_and_verify_envelope(report.envelope_path, key)
        yield Published(index, wheel, trusted)


def _verify(
    published: Published, statement: dict[str, Any], workdir: Path, interpreters: list[Path]
) -> Verification:
    return verify_from_index(
        simple_url=published.index.simple_url,
        project="activekv",
        version="0.1.0",
        statement=Statement(statement),
        interpreters=interpreters,
        imports=IMPORTS,
        workdir=workdir,
    )


def test_verify_passes_for_what_was_signed(published: Published, tmp_path: Path) -> None:
    interpreters = [Path(sys.executable)]
    if PYTHON_312.exists():
        interpreters.append(PYTHON_312)
    verified = _verify(published, published.statement, tmp_path / "work", interpreters)
    checks = verified.checks

    digest = hashlib.sha256(published.wheel.read_bytes()).hexdigest()
    assert verified.files == {published.wheel.name: digest}  # every file, checked first
    assert [c.interpreter for c in checks] == interpreters
    assert checks[0].python_version == ".".join(map(str, sys.version_info[:3]))
    if PYTHON_312.exists():
        assert checks[1].python_version == "3.12.1"
    for check in checks:
        assert check.wheel == published.wheel.name
        assert check.sha256 == digest
        assert check.digest_ok
        assert check.imported == tuple(IMPORTS)
    # each check installed into its own fresh venv, from the downloaded file
    installed = sorted(
        (tmp_path / "work").glob("py*/venv/lib/python*/site-packages/activekv/_probe.py")
    )
    assert len(installed) == len(interpreters)


def test_verify_fails_when_the_statement_names_another_digest(
    published: Published, tmp_path: Path
) -> None:
    statement = copy.deepcopy(published.statement)
    statement["subject"][0]["digest"]["sha256"] = "0" * 64
    actual = hashlib.sha256(published.wheel.read_bytes()).hexdigest()
    with pytest.raises(VerifyError) as caught:
        _verify(published, statement, tmp_path / "work", [Path(sys.executable)])
    message = str(caught.value)
    assert published.wheel.name in message
    assert "0" * 64 in message and actual in message
    # refused before installing anything
    assert not list((tmp_path / "work").glob("py0/venv/lib/python*/site-packages/activekv"))


def test_verify_fails_when_the_file_is_not_in_the_statement(
    published: Published, tmp_path: Path
) -> None:
    statement = copy.deepcopy(published.statement)
    statement["subject"][0]["name"] = "activekv-0.1.0-cp312-abi3-manylinux_2_17_x86_64.whl"
    with pytest.raises(VerifyError, match="is not in the signed statement") as caught:
        _verify(published, statement, tmp_path / "work", [Path(sys.executable)])
    assert published.wheel.name in str(caught.value)


def test_verify_fails_when_an_import_fails(published: Published, tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match=r"activekv\._missing") as caught:
        verify_from_index(
            simple_url=published.index.simple_url,
            project="activekv",
            version="0.1.0",
            statement=Statement(published.statement),
            interpreters=[Path(sys.executable)],
            imports=["activekv._probe", "activekv._missing"],
            workdir=tmp_path / "work",
        )
    assert "ModuleNotFoundError" in str(caught.value)


def test_pip_takes_the_wheel_from_the_index_even_where_its_settings_name_a_better_one(
    published: Published, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine's pip settings point at another wheel source holding a wheel of 0.1.0 that pip
    prefers for this interpreter (a more specific tag, other bytes): verify still installs the
    index's signed wheel. Were the settings let in, pip would take the other one and verify
    would refuse it as not signed."""
    elsewhere = tmp_path / "elsewhere"
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}-none-any"
    build_wheel(elsewhere, tag=tag, salt="elsewhere")
    monkeypatch.setenv("PIP_FIND_LINKS", str(elsewhere))
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nfind-links = {elsewhere}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    verified = _verify(published, published.statement, tmp_path / "work", [Path(sys.executable)])
    (check,) = verified.checks
    assert check.wheel == published.wheel.name


def test_verify_fails_when_the_index_lacks_the_version(
    published: Published, tmp_path: Path
) -> None:
    """A statement of 9.9.9 whose wheel the index does not serve: refused, naming the wheel,
    before pip runs (its config would not matter)."""
    absent = build_wheel(tmp_path / "absent", version="9.9.9")
    statement = copy.deepcopy(published.statement)
    statement["subject"] = [{"name": absent.name, "digest": {"sha256": sha256_file(absent)}}]
    with pytest.raises(VerifyError, match=rf"does not serve {absent.name}: expected every file"):
        verify_from_index(
            simple_url=published.index.simple_url,
            project="activekv",
            version="9.9.9",
            statement=Statement(statement),
            interpreters=[Path(sys.executable)],
            imports=IMPORTS,
            workdir=tmp_path / "work",
        )
    assert not (tmp_path / "work" / "py0").exists()


def test_pip_environment_is_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///elsewhere")
    monkeypatch.setenv("PIP_INDEX_URL", "file:///elsewhere")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = clean_pip_env()
    assert env["PIP_CONFIG_FILE"] == "/dev/null"
    assert {k for k in env if k.startswith("PIP_")} == {
        "PIP_CONFIG_FILE",
        "PIP_DISABLE_PIP_VERSION_CHECK",
        "PIP_NO_INPUT",
        "PIP_NO_CACHE_DIR",
    }
    assert "PYTHONPATH" not in env
