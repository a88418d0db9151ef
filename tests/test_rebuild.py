"""The consumer's rebuild check (`python -m release rebuild`, release/trust/rebuild.py) end to end.

A publisher builds the real wheel from a git repository of these sources, signs it and publishes
it to the embedded index with TUF; a consumer, knowing only the index, the trusted root, the
provenance key and where the source lives, rebuilds it cold from the commit the statement names.
A statement that says its tree had uncommitted changes has no commit to be rebuilt from (checked
on the statement, below); the negative control is a publisher that lies about its tree (it builds
with one byte of DESCRIPTION.md changed from its commit, puts the byte back and edits its build
record before signing): the rebuild must refuse its wheel, naming the member.

Each publisher's build is the checkout's cached wheel (the honest one builds the released sources
at their commit; the liar's commit changes one byte, which its tree has back as released); only
the consumers' rebuilds compile, cold, as a consumer's would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fixtures_checkout import committed_snapshot, dated_commit
from fixtures_sign import attest_passing_gates

from release.errors import VerifyError
from release.manifest import load_manifest
from release.trust import consumer_steps
from release.trust.build_inputs import LATEST_EPOCH, build_inputs
from release.trust.index import EmbeddedIndex
from release.trust.rebuild import RebuildResult, rebuild_release, toolchain_differences
from release.trust.rebuild_workdir import check_apart, fresh_workdir, git_source
from release.trust.tuf_client import TrustedIndex
from release.trust.verify import parse_requirement
from release.util.digests import sha256_file
from release.util.paths import DEFAULT_MANIFEST
from release.util.pins import project_version

REPO = Path(__file__).resolve().parent.parent
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# The publisher's builds share the checkout's compiler cache; the consumer's rebuild never does.
PUBLISHER_ENV = dict(os.environ, ACTIVEKV_CACHE_DIR=str(REPO / ".activekv" / "cache"))


def _release(cwd: Path, *args: str | Path, env: dict[str, str] | None = None):
    command = [sys.executable, "-m", "release", *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


def _git(*args: str | Path, env: dict[str, str] | None = None) -> str:
    command = ["git", "-c", "user.name=publisher", "-c", "user.email=publisher@example.org"]
    return subprocess.run(
        [*command, *map(str, args)], check=True, capture_output=True, text=True,
        env={**os.environ, **(env or {})},
    ).stdout.strip()  # fmt: skip


@pytest.fixture(scope="module")
def source_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git repository holding these sources in one commit: where the consumer rebuilds from.

    The commit is dated at the checkout's SOURCE_DATE_EPOCH, so the publisher's build of it is
    the checkout's own wheel (the same sources, epoch and toolchain: the wheel cache's key) and
    costs no compilation once built_wheel has run; the consumer's rebuild stays cold."""
    return committed_snapshot(tmp_path_factory.mktemp("upstream") / "activekv",
                              "the released sources")  # fmt: skip


def _publish_from(
    source: Path, work: Path, after_build: Callable[[Path], None] = lambda out: None
) -> tuple[Path, Path, Path]:
    """Build, attest, sign and publish the wheel for this Python from `source` as a publisher
    would (`after_build(out)` runs between the build and the signing); (out, state, wheel)."""
    out, state = work / "out", work / "state"
    for step in (("build", "--python", PYTHON), ("sign",), ("publish",)):
        done = _release(source, *step, "--out", out, "--state-dir", state, env=PUBLISHER_ENV)
        assert done.returncode == 0, f"{step}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        if step[0] == "build":
            (wheel,) = sorted((out / "wheels").glob("*.whl"))
            attest_passing_gates(out, [wheel], state)
            after_build(out)
    return out, state, wheel


def _one_byte_changed(description: Path) -> bytes:
    """Changes one byte of DESCRIPTION.md (the wheels' long description); its bytes before."""
    text = description.read_bytes()
    at = text.index(b"KV-cache")  # "KV-cache" becomes "kV-cache"
    description.write_bytes(text[:at] + b"k" + text[at + 1 :])
    assert sum(a != b for a, b in zip(text, description.read_bytes(), strict=True)) == 1
    return text


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
def test_a_wheel_whose_statement_lies_about_its_tree_is_refused_naming_the_member(
    source_repo, tmp_path
):
    """A publisher that builds from a changed tree, then puts the tree back and edits the build
    record to say it was clean: signing believes the record, only the rebuild can tell. Its
    commit (on top of the released sources, where the consumer rebuilds from) changes one byte
    of DESCRIPTION.md; the tree it builds has that byte as released (module docstring)."""
    changed = tmp_path / "changed"
    _git("clone", "--quiet", source_repo, changed)
    description = changed / "DESCRIPTION.md"
    released = _one_byte_changed(description)
    _git("-C", changed, "add", "DESCRIPTION.md")
    dated_commit(changed, "one byte of the description changed")
    committed = description.read_bytes()
    description.write_bytes(released)  # the byte changed from the commit, in the built tree
    assert _git("-C", changed, "status", "--porcelain") == "M DESCRIPTION.md"

    def lie(out: Path) -> None:
        description.write_bytes(committed)
        record = json.loads((out / "build.json").read_text())
        assert record["source"]["uncommitted"] == ["DESCRIPTION.md"]  # what the lie hides
        record["source"] = {"commit": _git("-C", changed, "rev-parse", "HEAD"),
                            "uncommitted": [], "uncommitted_sha256": None}  # fmt: skip
        (out / "build.json").write_text(json.dumps(record))

    out, state, wheel = _publish_from(changed, tmp_path / "publisher", after_build=lie)
    done = _rebuild(out, state, changed, tmp_path / "consumer")
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
        build_inputs(statement)


def test_a_statement_of_uncommitted_changes_has_nothing_to_rebuild_from():
    dirty = {"dirty": True, "uncommittedChangesSha256": "ab" * 32, "uncommittedPaths": ["engine"]}
    statement = {"predicate": {"buildDefinition": {
        "resolvedDependencies": [{"uri": "git+file:///x", "digest": {"gitCommit": "a" * 40},
                                  "annotations": dirty}],
        "internalParameters": {"source_date_epoch": 1}}}}  # fmt: skip
    with pytest.raises(VerifyError, match=rf"built from commit a{{40}} with uncommitted changes "
                       rf"\(sha256 {'ab' * 32}\); no commit holds"):  # fmt: skip
        build_inputs(statement)


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
        build_inputs(statement)


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


# ----------------------------------------------------------------------------- the work folder


def _rebuild_into(workdir: Path, **overrides: object) -> RebuildResult:
    """rebuild_release with inputs that reach the work-folder checks and stop at the first
    network or trust step (the root does not exist)."""
    arguments: dict[str, Any] = {
        "index_url": "http://127.0.0.1:9/simple/",
        "requirement": "activekv==0.1.0",
        "trusted_root": workdir.parent / "absent-root.json",
        "provenance_key": workdir.parent / "absent-key.json",
        "source": "https://example.org/x",
        "python": PYTHON,
        "workdir": workdir,
        "build_cache": workdir.parent / "cache",
    }
    arguments.update(overrides)
    return rebuild_release(**arguments)


def _git_repo(folder: Path) -> Path:
    folder.mkdir(parents=True)
    _git("-C", folder, "init", "--quiet")
    (folder / "file").write_text("the consumer's own work\n")
    return folder


@pytest.mark.parametrize("where", ["rebuild", "rebuild/inner", "."])
def test_a_source_in_the_work_folder_is_refused_and_left_alone(tmp_path, where):
    workdir = tmp_path / "out" / "rebuild"
    source = _git_repo((workdir / where).resolve() if where != "." else workdir)
    for given in (str(source), f"file://{source}"):
        with pytest.raises(VerifyError, match=r"--source .*: expected a git repository outside"):
            _rebuild_into(workdir, source=given)
    assert (source / "file").read_text() == "the consumer's own work\n"
    assert (source / ".git").is_dir()


def test_a_source_that_holds_the_work_folder_is_given_to_git_as_an_absolute_path(
    tmp_path, monkeypatch
):
    source = _git_repo(tmp_path / "checkout")  # `--source .` with the default --out
    monkeypatch.chdir(source)
    workdir = source / "out" / "rebuild"
    assert git_source(".", workdir) == str(source)
    assert git_source("https://example.org/activekv.git", workdir) == (
        "https://example.org/activekv.git"
    )


@pytest.mark.parametrize("where", ["out/rebuild", "out/rebuild/tuf", "out", "."])
def test_a_tuf_cache_in_or_around_the_work_folder_is_refused_before_it_is_opened(tmp_path, where):
    workdir = tmp_path / "out" / "rebuild"
    cache = tmp_path / where
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "timestamp.json").write_text("{}")
    with pytest.raises(VerifyError, match=r"--tuf-cache .*: expected a folder apart from"):
        _rebuild_into(workdir, tuf_cache=cache)
    assert (cache / "timestamp.json").read_text() == "{}"


def test_a_tuf_cache_apart_from_the_work_folder_is_accepted(tmp_path):
    check_apart(tmp_path / "tuf-cache", "--tuf-cache", tmp_path / "out" / "rebuild")
    check_apart(tmp_path / "out" / "rebuilt", "--tuf-cache", tmp_path / "out" / "rebuild")


@pytest.mark.parametrize("file", ["out", "out/rebuild"])
def test_an_out_or_work_folder_that_is_a_file_is_named(tmp_path, file):
    if file != "out":
        (tmp_path / "out").mkdir()
    (tmp_path / file).write_text("a file\n")
    with pytest.raises(VerifyError, match=rf"--out: expected {tmp_path / file} to be a folder"):
        _rebuild_into(tmp_path / "out" / "rebuild")
    assert (tmp_path / file).read_text() == "a file\n"


def test_a_work_folder_someone_else_made_is_not_deleted(tmp_path):
    workdir = tmp_path / "rebuild"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine\n")
    with pytest.raises(VerifyError, match=r"is a folder this command did not make"):
        fresh_workdir(workdir)
    assert (workdir / "notes.txt").read_text() == "mine\n"


def test_the_work_folder_of_an_earlier_rebuild_is_emptied_and_marked(tmp_path):
    workdir = tmp_path / "rebuild"
    fresh_workdir(workdir)  # none there: made
    (workdir / "published").mkdir()
    (workdir / "published" / "old.whl").write_bytes(b"old")
    fresh_workdir(workdir)  # its own mark: emptied
    assert sorted(p.name for p in workdir.iterdir()) == [".activekv-rebuild"]
    (tmp_path / "empty").mkdir()
    fresh_workdir(tmp_path / "empty")  # an empty folder is nobody's work
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(VerifyError, match=r"is a symbolic link"):
        fresh_workdir(tmp_path / "link")


# ----------------------------------------------------------------------------- rebuild.json


def _step(out: Path, run: Callable[..., RebuildResult], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(consumer_steps, "rebuild_release", run)
    context = SimpleNamespace(out_dir=out, cache_dir=out / "cache",
                              manifest=load_manifest(DEFAULT_MANIFEST))  # fmt: skip
    args = SimpleNamespace(
        index="http://127.0.0.1:9/simple/",
        requirement="activekv==0.1.0",
        root=out / "root.json",
        provenance_key=out / "key.json",
        source="https://example.org/x",
        python=PYTHON,
        tuf_url=None,
        tuf_cache=None,
    )
    return consumer_steps.step_rebuild(context, args)  # type: ignore[arg-type]


IDENTICAL = RebuildResult(
    wheel="activekv-0.1.0-cp312-abi3-linux_x86_64.whl",
    commit="a" * 40,
    published_sha256="b" * 64,
    rebuilt_sha256="b" * 64,
    differences=(),
    toolchain_differences=(),
)


def test_a_failed_rerun_leaves_no_earlier_record_behind(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    assert _step(out, lambda **_: IDENTICAL, monkeypatch) == 0
    assert json.loads((out / "rebuild.json").read_text())["rebuilt_sha256"] == "b" * 64
    assert sorted(p.name for p in out.iterdir()) == ["rebuild.json"]  # no temporary file

    def fails(**_: object) -> RebuildResult:
        assert not (out / "rebuild.json").exists()  # removed before the work starts
        raise VerifyError("--source x: has no commit")

    with pytest.raises(VerifyError, match="has no commit"):
        _step(out, fails, monkeypatch)
    assert not (out / "rebuild.json").exists()


def test_a_folder_at_the_record_path_is_named_before_any_work(tmp_path, monkeypatch):
    out = tmp_path / "out"
    (out / "rebuild.json").mkdir(parents=True)

    def never(**_: object) -> RebuildResult:
        raise AssertionError("the rebuild started")

    with pytest.raises(VerifyError, match=r"rebuild.json: expected the rebuild's record"):
        _step(out, never, monkeypatch)
    (out / "rebuild.json").rmdir()
    (tmp_path / "file").write_text("")
    with pytest.raises(VerifyError, match=r"--out .*file: expected a folder"):
        _step(tmp_path / "file", never, monkeypatch)


# ----------------------------------------------------------------------------- the statement


def _statement(
    dependencies: object = None, internal: object = None, **definition: object
) -> dict[str, Any]:
    """A statement whose build definition is well formed except where told."""
    good = {
        "resolvedDependencies": [{"uri": "git+file:///x", "digest": {"gitCommit": "a" * 40}}],
        "internalParameters": {"source_date_epoch": 1700000000, "toolchain": {"zig": "0.15.1"}},
    }
    if dependencies is not None:
        good["resolvedDependencies"] = dependencies
    if internal is not None:
        good["internalParameters"] = internal
    good.update(definition)
    return {"predicate": {"buildDefinition": good}}


def test_a_well_formed_statement_gives_its_build_inputs():
    assert build_inputs(_statement()) == ("a" * 40, 1700000000, {"zig": "0.15.1"})
    assert build_inputs(_statement(internal={"source_date_epoch": LATEST_EPOCH}))[1] == (
        LATEST_EPOCH
    )


def _commit_entry(commit: object) -> list[dict[str, Any]]:
    return [{"uri": "git+file:///x", "digest": {"gitCommit": commit}}]


@pytest.mark.parametrize(
    ("statement", "named"),
    [
        (_statement(_commit_entry(123)), r"gitCommit: expected a commit id .*; got 123"),
        (_statement(_commit_entry(None)), r"gitCommit: expected a commit id .*; got None"),
        (_statement(_commit_entry(["a" * 40])), r"gitCommit: expected a commit id"),
        (
            _statement(_commit_entry("a" * 40) + _commit_entry("b" * 40)),
            r"resolvedDependencies\[\].digest.gitCommit: expected one source commit; got \['a",
        ),
        (
            _statement({"gitCommit": "a" * 40}),
            r"resolvedDependencies: expected a list of resource descriptors; got \{",
        ),
        (_statement(["git+file:///x"]), r"resolvedDependencies\[0\]: expected an object"),
        (_statement([None]), r"resolvedDependencies\[0\]: expected an object; got None"),
        (
            _statement([{"digest": "a" * 40}]),
            r"resolvedDependencies\[0\].digest: expected an object; got 'aaa",
        ),
        (_statement(internal=[1700000000]), r"internalParameters: expected an object; got \["),
        (
            _statement(internal={"source_date_epoch": 1, "toolchain": ["zig"]}),
            r"internalParameters.toolchain: expected an object; got \['zig'\]",
        ),
        (
            _statement(internal={"source_date_epoch": 1, "toolchain": "zig"}),
            r"internalParameters.toolchain: expected an object; got 'zig'",
        ),
        (
            _statement(internal={"source_date_epoch": 1, "toolchain": {"zig": 15}}),
            r"internalParameters.toolchain.zig: expected a string; got 15",
        ),
        ({"predicate": {}}, r"predicate.buildDefinition: expected an object; got None"),
        ({"predicate": []}, r"predicate: expected an object; got \[\]"),
        ({}, r"predicate: expected an object; got None"),
        ([], r"statement: expected an object; got \[\]"),
    ],
)
def test_a_malformed_statement_field_is_named(statement, named):
    with pytest.raises(VerifyError, match=rf"the signed statement's .*{named}"):
        build_inputs(statement)


@pytest.mark.parametrize("epoch", [-1, 0, LATEST_EPOCH + 1, 10**30, 1.5, True, "1700000000"])
def test_a_source_date_epoch_the_build_cannot_take_is_refused(epoch):
    with pytest.raises(VerifyError, match=r"source_date_epoch: expected seconds since 1970, 1 to"):
        build_inputs(_statement(internal={"source_date_epoch": epoch}))


# ----------------------------------------------------------------------------- NAME==VERSION


@pytest.mark.parametrize(
    "text",
    [
        "activekv==1.0; python_version<'3'",
        "activekv==0.1.0,<2",
        "activekv==0.1.*",
        "activekv==1.0 --index-url http://evil/",
        "activekv==0.1.0\n",
        "activekv==0.1.0\n-e x",
        "-e==1",
        "activekv[extra]==0.1.0",
        "activekv @ https://evil/activekv.whl",
        "activekv===0.1.0",
        "activekv>=0.1",
        "activekv",
        "activekv==",
        "==0.1.0",
    ],
)
def test_a_requirement_that_is_not_one_exact_pin_is_refused(text):
    with pytest.raises(VerifyError) as refused:
        parse_requirement(text)
    message = str(refused.value)
    assert message.startswith(
        f"requirement {text!r}: expected exactly one pinned version, "
        "NAME==VERSION (e.g. activekv==0.1.0); got "
    )


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("activekv==0.1.0", ("activekv", "0.1.0")),
        ("Active_KV==0.1.0", ("active-kv", "0.1.0")),
        ("activekv == 1.0+local", ("activekv", "1.0+local")),
    ],
)
def test_one_exact_pin_is_accepted(text, parsed):
    assert parse_requirement(text) == parsed


# ----------------------------------------------------------------------------- the index


def test_an_index_that_cannot_be_reached_is_named_with_the_reason(tmp_path):
    from securesystemslib.signer import CryptoSigner
    from tuf.api.metadata import Metadata, Root

    signer = CryptoSigner.generate_ed25519()
    root = Metadata(Root())
    for role in ("root", "timestamp", "snapshot", "targets"):
        root.signed.add_key(signer.public_key, role)
    root.sign(signer)
    root.to_file(str(tmp_path / "root.json"))
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/tuf/"
    trusted = TrustedIndex(url, tmp_path / "root.json", tmp_path / "cache")
    with pytest.raises(VerifyError) as refused:
        trusted.refresh()
    message = str(refused.value)
    assert f"cannot be downloaded from {url}metadata/" in message
    assert "Connection refused" in message and f"127.0.0.1:{port}" in message
