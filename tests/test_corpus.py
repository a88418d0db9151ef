"""The bad-input corpus (tests/corpus/*.toml): malformed evidence, envelopes, keys, TUF metadata,
manifests and command-line arguments, each refused with its expected message and nothing left
written. (tests/test_manifest.py holds the larger corpus of malformed manifests.)"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures_sign import gated_out
from securesystemslib.signer import CryptoSigner

from release.cli import main
from release.errors import PublishError
from release.statement import PAYLOAD_TYPE
from release.trust.sign import load_signer, sign_statement
from release.trust.tuf_metadata import TufRepository
from release.util.paths import DEFAULT_MANIFEST
from release.util.pins import project_version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CORPUS = Path(__file__).resolve().parent / "corpus"
VERSION = project_version()
TAGS = ("py3-none-any", "cp311-cp311-manylinux_2_28_x86_64")


def _cases(kind: str) -> list[Any]:
    document = tomllib.loads((CORPUS / f"{kind}.toml").read_text(encoding="utf-8"))
    return [pytest.param(case, id=case["name"]) for case in document["case"]]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace where `publish` would get as far as starting the index, and `sign` would
    sign: every case breaks exactly one thing in a copy of it."""
    ws = tmp_path_factory.mktemp("corpus-template")
    out, state = ws / "out", ws / "state"
    _, digests = gated_out(out, TAGS, VERSION, state)
    assert main(["sign", "--out", str(out), "--state-dir", str(state)]) == 0
    TufRepository(ws / "tuf").add_targets({})
    (ws / "artefacts.json").write_text(json.dumps(digests))
    return ws


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _resign_with_other_key(path: Path) -> None:
    document = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(document["payload"]))
    envelope = sign_statement(statement, CryptoSigner.generate_ed25519())
    path.write_text(json.dumps(envelope.to_dict()))
    assert envelope.payload_type == PAYLOAD_TYPE


def _edited_statement(path: Path, edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    statement = json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))
    edit(statement)
    return statement


def _edit_payload(path: Path, key: str, value: Any) -> None:
    """Changes the attested predicate and keeps the old signatures (a hand edit)."""
    document = json.loads(path.read_text())
    statement = _edited_statement(path, lambda s: s["predicate"].__setitem__(key, value))
    document["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(document))


def _reattest(path: Path, state: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Signs an edited statement again with the dev key: what a gate that judged so writes."""
    signer, _ = load_signer("generate", channel="dev", state_dir=state)
    path.write_text(json.dumps(sign_statement(_edited_statement(path, edit), signer).to_dict()))


def _subjects(digests: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": name, "digest": {"sha256": digest}} for name, digest in digests.items()]


def _apply(ws: Path, ops: list[list[Any]]) -> None:
    artefacts = (ws / "artefacts.json").read_text()

    def at(relative: str) -> Path:
        return ws / relative.replace("{version}", VERSION)

    actions: dict[str, Callable[..., None]] = {
        "write": lambda p, text: at(p).write_text(text.replace("{artefacts}", artefacts)),
        "append": lambda p, text: at(p).open("a").write(text),
        "delete": lambda p: at(p).unlink(),
        "copy": lambda src, dst: shutil.copyfile(at(src), at(dst)),
        "chmod": lambda p, mode: os.chmod(at(p), int(mode, 8)),
        "json_set": lambda p, key, value: at(p).write_text(
            json.dumps({**json.loads(at(p).read_text()), key: value})
        ),
        "resign_other_key": lambda p: _resign_with_other_key(at(p)),
        "edit_payload": lambda p, key, value: _edit_payload(at(p), key, value),
        "reattest": lambda p, key, value: _reattest(
            at(p), ws / "state", lambda s: s["predicate"].__setitem__(key, value)
        ),
        "reattest_subjects": lambda p, digests: _reattest(
            at(p), ws / "state", lambda s: s.__setitem__("subject", _subjects(digests))
        ),
        "manifest_replace": lambda old, new: (ws / "bad.toml").write_text(
            _replaced(DEFAULT_MANIFEST.read_text(encoding="utf-8"), old, new)
        ),
    }
    for name, *arguments in ops:
        actions[name](*arguments)


def _replaced(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the manifest no longer holds {old!r} once"
    return text.replace(old, new)


@pytest.fixture
def workspace(template: Path, tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(template, ws, symlinks=True)
    return ws


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("case", _cases("cli"))
def test_cli_bad_input(
    case: dict[str, Any], workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _apply(workspace, case.get("ops", []))
    # the consumer's TUF cache is meant to be written: it lies outside the workspace
    cache = str(workspace.parent / "tuf-cache")
    args = [a.replace("{ws}", str(workspace)).replace("{cache}", cache) for a in case["args"]]
    if not case.get("bare", False):
        args += ["--out", str(workspace / "out"), "--state-dir", str(workspace / "state")]
    capsys.readouterr()
    before = _snapshot(workspace)
    try:
        status = main(args)
    except SystemExit as exit_:  # argparse's own refusals
        status = exit_.code
    stderr = capsys.readouterr().err
    assert status == case.get("exit", 2), stderr
    expected = case["expected"].replace("{version}", re.escape(VERSION))
    assert re.search(expected, _one_line(stderr)), f"{expected!r} not in:\n{stderr}"
    assert "Traceback" not in stderr
    assert _snapshot(workspace) == before, "the refused command left files changed"
    assert not (workspace / "state" / "index").exists(), "the index was started"


@pytest.mark.parametrize("case", _cases("tuf"))
def test_tuf_repository_bad_state(case: dict[str, Any], workspace: Path) -> None:
    _apply(workspace, case["ops"])
    before = _snapshot(workspace)
    repository = TufRepository(workspace / "tuf")
    with pytest.raises(PublishError) as refused:
        repository.check()
    assert re.search(case["expected"], _one_line(str(refused.value))), str(refused.value)
    with pytest.raises(PublishError):
        repository.add_targets({"x.whl": workspace / "artefacts.json"})
    after = _snapshot(workspace)
    assert after == before, "the refused update left files changed"


def test_the_corpus_has_at_least_40_cases() -> None:
    ours = len(_cases("cli")) + len(_cases("tuf"))
    assert ours >= 40, f"the corpus has {ours} cases"
    names = [c.id for c in _cases("cli") + _cases("tuf")]
    assert len(names) == len(set(names)), "case names must be unique"
