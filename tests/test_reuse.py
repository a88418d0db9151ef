"""The reuse store and its keys (docs/reuse.md): an entry is found by the key of exactly its
inputs, and one byte changed in anything a verdict depends on (a wheel, the gate's code, the
manifest table it reads, the checkout for the sdist's gate, a tool) is another key; what a gate
does not read (another gate's code or table, [publish], a channel's requirements, the README for
a gate of the wheels alone) is not. Then the steps: `judge` takes a stored pass (its signature
checked) instead of running the gate, and runs it where the store is not read or holds nothing
usable; `run` reads nothing with --fresh, on the stable channel or in CI."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fixtures_wheels import build_wheel, wheel_set

from release import catalogue, steps
from release.cli_options import parser
from release.context import Context
from release.evidence import evidence_path
from release.gates import registry
from release.gates import reuse as gate_reuse
from release.gates.contract import GateInputs
from release.gates.options import GateOptions
from release.manifest import Manifest, load_manifest
from release.trust.attestation import attestation_path
from release.trust.reuse import (
    checks_payload,
    statement_key_inputs,
    stored_checks,
    verify_key_inputs,
)
from release.trust.verify import InstallCheck
from release.util import reuse as store_module
from release.util import tool_facts
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.util.reuse import ReuseStore, canonical, changed, refusal, reuse_key
from release.util.sources import checkout_digest, folder_sources, module_sources

# --- the store ---


def test_an_entry_is_found_by_the_key_of_its_inputs_and_only_where_the_store_is_read(
    tmp_path: Path,
) -> None:
    inputs = {"b": [1, 2], "a": {"path": "x"}}
    assert reuse_key(inputs) == reuse_key({"a": {"path": "x"}, "b": [1, 2]})  # sorted keys
    assert reuse_key(inputs) != reuse_key({**inputs, "b": [2, 1]})
    key = reuse_key(inputs)
    store = ReuseStore(tmp_path / "reuse")
    assert store.get("gate", "policy", inputs) is None
    assert store.put("gate", "policy", inputs, {"attestation": "signed"}) == ""
    hit = store.get("gate", "policy", inputs)
    assert hit is not None and hit.payload == {"attestation": "signed"} and hit.inputs == inputs
    assert hit.note().startswith(f"reused: key {key[:12]}, from the run at ")
    assert store.get("gate", "payload", inputs) is None  # kept per gate
    path = tmp_path / "reuse" / "gate" / "policy" / f"{key}.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert ReuseStore(tmp_path / "reuse", refused="--fresh").get("gate", "policy", inputs) is None


def test_an_edited_or_unreadable_entry_is_a_miss_never_an_error(tmp_path: Path) -> None:
    inputs = {"gate": "policy"}
    key = reuse_key(inputs)
    store = ReuseStore(tmp_path / "reuse")
    store.put("gate", "policy", inputs, {"attestation": "signed"})
    path = tmp_path / "reuse" / "gate" / "policy" / f"{key}.json"
    entry = json.loads(path.read_text())
    entry["inputs"]["gate"] = "payload"  # no longer what its name says
    path.write_text(json.dumps(entry))
    assert store.get("gate", "policy", inputs) is None
    path.write_text("{not json")
    assert store.get("gate", "policy", inputs) is None
    with pytest.raises(TypeError, match="expected JSON data in a reuse key; got object"):
        canonical({"x": object()})


def test_only_the_newest_entries_of_a_gate_are_kept(tmp_path: Path) -> None:
    store = ReuseStore(tmp_path / "reuse")
    keys = []
    for number in range(store_module.KEEP + 3):
        inputs = {"number": number}
        keys.append(reuse_key(inputs))
        store.put("gate", "parity", inputs, {})
        path = tmp_path / "reuse" / "gate" / "parity" / f"{keys[-1]}.json"
        stamp = 1_700_000_000 + number  # the order they were made in, whatever the clock's grain
        os.utime(path, (stamp, stamp))
    kept = {p.stem for p in (tmp_path / "reuse" / "gate" / "parity").glob("*.json")}
    assert len(kept) <= store_module.KEEP + 1 and keys[-1] in kept and keys[0] not in kept
    latest = store.latest("gate", "parity")
    assert latest is not None and latest.key == keys[-1]


def test_a_miss_names_the_inputs_that_changed() -> None:
    before = {"code": {"release/gates/parity.py": "1", "release/util/x.py": "2"}, "gate": "p"}
    now = {"code": {"release/gates/parity.py": "3", "release/util/x.py": "2"}, "gate": "p",
           "new": 1}  # fmt: skip
    assert changed(before, now) == ["code.release/gates/parity.py", "new"]


@pytest.mark.parametrize(
    ("fresh", "operator", "environ", "why"),
    [
        (False, False, {}, ""),
        (False, False, {"CI": ""}, ""),
        (False, False, {"CI": "true"}, "CI is set"),
        (True, False, {}, "--fresh"),
        (False, True, {}, "the channel signs with an operator's key"),
    ],
)
def test_the_store_is_not_read_with_fresh_on_an_operator_signed_channel_or_in_ci(
    fresh: bool, operator: bool, environ: dict[str, str], why: str
) -> None:
    assert refusal(fresh=fresh, operator_signed=operator, environ=environ) == why


def test_run_reads_the_store_on_dev_but_not_on_stable_in_ci_or_with_fresh(tmp_path: Path) -> None:
    context = Context(load_manifest(DEFAULT_MANIFEST), REPO_ROOT, tmp_path / "out", tmp_path / "s")
    dev, stable = (context.manifest.channel(name) for name in ("dev", "stable"))
    assert steps.run_store(context, dev, fresh=False, environ={}).reads
    assert steps.run_store(context, dev, fresh=False, environ={"CI": "true"}).refused == "CI is set"
    assert steps.run_store(context, dev, fresh=True, environ={}).refused == "--fresh"
    assert not steps.run_store(context, stable, fresh=False, environ={}).reads
    assert steps.run_store(context, dev, fresh=False, environ={}).root == tmp_path / "s" / "reuse"


def test_run_takes_fresh_and_build_keeps_its_own() -> None:
    assert parser().parse_args(["run", "--fresh"]).fresh is True
    assert parser().parse_args(["run"]).fresh is False
    assert parser().parse_args(["build", "--fresh"]).fresh is True


# --- what a gate's code is ---


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_modules_code_is_itself_and_every_first_party_module_it_imports(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "release/__init__.py": "",
        "release/gates/__init__.py": "",
        "release/gates/mine.py": "from . import helper\nimport numpy\n\n"
                                 "def late():\n    from release.util.deep import X\n",
        "release/gates/helper.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from release.typed import T\n",
        "release/util/__init__.py": "",
        "release/util/deep.py": "from reference.model import M\n",
        "release/typed.py": "",
        "release/other.py": "",
        "reference/__init__.py": "",
        "reference/model.py": "",
    })  # fmt: skip
    found = module_sources(["release.gates.mine"], root)
    assert sorted(found) == [
        "reference/__init__.py", "reference/model.py", "release/__init__.py",
        "release/gates/__init__.py", "release/gates/helper.py", "release/gates/mine.py",
        "release/typed.py", "release/util/__init__.py", "release/util/deep.py",
    ]  # fmt: skip
    (root / "release/util/deep.py").write_text("from reference.model import N\n")  # one byte
    assert module_sources(["release.gates.mine"], root) != found


def test_the_real_gates_code_holds_what_it_imports_and_not_another_gate() -> None:
    parity = module_sources(["release.gates.parity"])
    casters = module_sources(["release.gates.casters"])
    assert {"release/gates/trace.py", "release/gates/per_wheel.py", "release/evidence.py"} <= set(
        parity
    )
    assert "release/gates/parity.py" not in casters and "release/gates/payload.py" in casters
    scripts = folder_sources()
    assert "release/scripts/parity_replay.py" in scripts and "shims/activekv/vllm_connector.py" in (
        scripts
    )


# --- a gate's key ---

TAGS = ("cp310-cp310-manylinux_2_28_x86_64", "cp312-abi3-manylinux_2_28_x86_64")


def _checkout(root: Path) -> Path:
    _tree(root, {"README.md": "# readme\n", "pyproject.toml": "[project]\n"})
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def _inputs(tmp_path: Path, manifest: Manifest, salt: str = "") -> GateInputs:
    wheels = wheel_set(*(build_wheel(tmp_path / f"dist{salt}", tag=tag, salt=salt) for tag in TAGS))
    source = tmp_path / "checkout"
    if not source.exists():
        _checkout(source)
    return GateInputs(manifest=manifest, wheels=wheels, out_dir=tmp_path / "out",
                      source_dir=source, cache_dir=tmp_path / "cache", gpu=None)  # fmt: skip


def _keys(inputs: GateInputs, names: tuple[str, ...] = ("casters", "parity", "payload")) -> dict:
    found = {name: gate_reuse.gate_key_inputs(name, inputs) for name in names}
    return {name: reuse_key(value) for name, value in found.items() if value is not None}


def _manifest_with(path: Path, old: str, new: str) -> Manifest:
    text = DEFAULT_MANIFEST.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return load_manifest(path)


@pytest.fixture
def manifest_path(tmp_path: Path) -> Path:
    path = tmp_path / "manifests" / "activekv.toml"
    path.parent.mkdir()
    shutil.copytree(DEFAULT_MANIFEST.parent / "keys", path.parent / "keys")
    return path


def test_the_same_inputs_give_the_same_key_and_one_byte_of_a_wheel_another(
    tmp_path: Path,
) -> None:
    manifest = load_manifest(DEFAULT_MANIFEST)
    first = _keys(_inputs(tmp_path, manifest))
    assert first == _keys(_inputs(tmp_path, manifest))
    salted = _keys(_inputs(tmp_path, manifest, salt="x"))  # one wheel byte differs
    assert all(salted[name] != first[name] for name in first)
    assert gate_reuse.gate_key_inputs("reproducible", _inputs(tmp_path, manifest)) is None


def test_a_gates_table_reaches_that_gate_and_no_other(tmp_path: Path, manifest_path: Path) -> None:
    first = _keys(_inputs(tmp_path, _manifest_with(manifest_path, "x", "x")))
    cell = "fence_faults = 0, seed = 1 }"
    parity = _keys(_inputs(tmp_path, _manifest_with(manifest_path, cell, cell.replace("1", "2"))))
    assert parity["parity"] != first["parity"]
    assert parity["casters"] == first["casters"] and parity["payload"] == first["payload"]
    gpu = gate_reuse.gate_key_inputs("gpu-parity", _inputs(tmp_path, load_manifest(manifest_path)))
    assert gpu is not None and "parity" in gpu["manifest"]["gates"]  # it replays parity's cells


def test_payload_reaches_its_gate_and_publish_or_a_channel_none(
    tmp_path: Path, manifest_path: Path
) -> None:
    first = _keys(_inputs(tmp_path, _manifest_with(manifest_path, "x", "x")))
    sbom = 'sbom = "activekv.cdx.json"'
    renamed = _manifest_with(manifest_path, sbom, sbom.replace("activekv", "kv"))
    kinds = _keys(_inputs(tmp_path, renamed))
    assert kinds["payload"] != first["payload"]
    unread = _manifest_with(manifest_path, 'username = "activekv-publisher"', 'username = "other"')
    assert _keys(_inputs(tmp_path, unread)) == first
    channel = _manifest_with(manifest_path, 'requires = ["policy", "payload", "casters"]',
                             'requires = ["policy", "payload"]')  # fmt: skip
    assert _keys(_inputs(tmp_path, channel)) == first


def test_a_readme_change_reaches_the_sdists_gate_and_not_those_of_the_wheels(
    tmp_path: Path,
) -> None:
    manifest = load_manifest(DEFAULT_MANIFEST)
    first = _keys(_inputs(tmp_path, manifest))
    before = checkout_digest(tmp_path / "checkout")
    (tmp_path / "checkout" / "README.md").write_text("# readme.\n")
    assert checkout_digest(tmp_path / "checkout") != before
    after = _keys(_inputs(tmp_path, manifest))
    assert after["payload"] != first["payload"]
    assert after["casters"] == first["casters"] and after["parity"] == first["parity"]


def test_one_byte_of_a_gates_code_runs_that_gate_again_and_a_shared_module_every_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real code, copied: the key follows the copy's bytes."""
    root = tmp_path / "code"
    for folder in ("release", "reference", "shims"):
        shutil.copytree(REPO_ROOT / folder, root / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    monkeypatch.setattr(gate_reuse, "module_sources", lambda m: module_sources(m, root))
    monkeypatch.setattr(gate_reuse, "folder_sources", lambda: folder_sources(root=root))
    inputs = _inputs(tmp_path, load_manifest(DEFAULT_MANIFEST))
    first = _keys(inputs)

    def touch(name: str) -> dict[str, str]:
        path = root / name
        path.write_bytes(path.read_bytes() + b"\n")
        return _keys(inputs)

    parity = touch("release/gates/parity.py")
    assert parity["parity"] != first["parity"]
    assert parity["casters"] == first["casters"] and parity["payload"] == first["payload"]
    replay = touch("release/scripts/parity_replay.py")  # run by path: every gate holds it
    assert all(replay[name] != parity[name] for name in first)
    shared = touch("release/evidence.py")
    assert all(shared[name] != replay[name] for name in first)


def test_the_tools_are_in_the_key_and_a_variables_value_is_never_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = _inputs(tmp_path, load_manifest(DEFAULT_MANIFEST))
    found = gate_reuse.gate_key_inputs("casters", inputs)
    assert found is not None
    tools = found["tools"]
    assert tools["running"]["distributions"] and tools["interpreters"]
    assert all("version" in each for each in tools["interpreters"])
    monkeypatch.setenv("ACTIVEKV_SECRET_SETTING", "hunter2")
    again = gate_reuse.gate_key_inputs("casters", inputs)
    assert again is not None and reuse_key(again) != reuse_key(found)
    assert "hunter2" not in canonical(again).decode()
    options = dataclasses.replace(inputs, options=GateOptions(cells=("one",)))
    assert reuse_key(gate_reuse.gate_key_inputs("casters", options) or {}) != reuse_key(again)


# --- signature and verify keys ---


def _statement(**predicate: Any) -> dict[str, Any]:
    return {"subject": [{"name": "a.whl", "digest": {"sha256": "1" * 64}}],
            "predicate": {"runDetails": {"metadata": {"invocationId": "x", "startedOn": "t"},
                                         "byproducts": []}, **predicate}}  # fmt: skip


def test_a_signature_is_keyed_by_the_statement_but_its_invocation_and_clock() -> None:
    first = reuse_key(statement_key_inputs(_statement(), "key-1"))
    other_run = _statement()
    other_run["predicate"]["runDetails"]["metadata"] = {"invocationId": "y", "startedOn": "u"}
    assert reuse_key(statement_key_inputs(other_run, "key-1")) == first
    other_subject = _statement()
    other_subject["subject"][0]["digest"]["sha256"] = "2" * 64
    assert reuse_key(statement_key_inputs(other_subject, "key-1")) != first
    assert reuse_key(statement_key_inputs(_statement(), "key-2")) != first
    assert _statement()["predicate"]["runDetails"]["metadata"]  # the statement is left as it was


def test_a_verify_is_keyed_by_what_the_index_serves_its_tuf_metadata_and_interpreters(
    tmp_path: Path,
) -> None:
    cache, root, statement = tmp_path / "cache", tmp_path / "root.json", tmp_path / "s.json"
    cache.mkdir()
    for path in (cache / "timestamp.json", root, statement):
        path.write_text("{}")
    python = Path(tool_facts.running_interpreter()["executable"])

    def key(served: dict[str, str], interpreters: list[Path] | None = None) -> str:
        return reuse_key(verify_key_inputs(
            index="embedded /state/index/packages", served=served, tuf_cache=cache,
            trusted_root=root, statement=statement, interpreters=interpreters or [python],
            imports=["activekv._engine"],
        ))  # fmt: skip

    first = key({"a.whl": "1" * 64})
    assert key({"a.whl": "1" * 64}) == first
    assert key({"a.whl": "2" * 64}) != first  # another file under the same name
    assert key({"a.whl": "1" * 64, "b.whl": "1" * 64}) != first  # one file more
    (cache / "timestamp.json").write_text('{"version": 2}')
    assert key({"a.whl": "1" * 64}) != first
    assert key({"a.whl": "1" * 64}, [python, python.with_name("elsewhere")]) != key(
        {"a.whl": "1" * 64}
    )


def test_stored_installs_are_taken_only_for_the_same_interpreters_and_served_files() -> None:
    check = InstallCheck(Path("/py"), "3.12.1", "a.whl", "1" * 64, True, ("activekv._engine",))
    payload = json.loads(json.dumps(checks_payload([check])))
    assert stored_checks(payload, {"a.whl": "1" * 64}, [Path("/py")]) == (check,)
    assert stored_checks(payload, {"a.whl": "2" * 64}, [Path("/py")]) is None
    assert stored_checks(payload, {"a.whl": "1" * 64}, [Path("/other")]) is None
    assert stored_checks({"checks": [{}]}, {"a.whl": "1" * 64}, [Path("/py")]) is None


# --- judge: the store in the gate loop ---


@pytest.fixture
def gate_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Context:
    """A context whose manifest declares the fixture gate `non-empty` (tests/fixtures_gate.py),
    registered as a newcomer would register one."""
    monkeypatch.setitem(registry._GATES, "non-empty", catalogue.Entry("fixtures_gate", "cpu"))
    # Its code, held still: the checkout may be edited while the tests run.
    monkeypatch.setattr(gate_reuse, "module_sources", lambda modules: {"fixtures_gate.py": "1"})
    monkeypatch.setattr(gate_reuse, "folder_sources", dict)
    path = tmp_path / "activekv.toml"
    path.write_text(DEFAULT_MANIFEST.read_text() + '\n[gates.non-empty]\nrunner = "cpu"\n')
    _checkout(tmp_path / "checkout")
    return Context(load_manifest(path), tmp_path / "checkout", tmp_path / "out", tmp_path / "state")


class Spy:
    """How often the registry really ran a gate."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs = 0
        real = steps.run_gate

        def counted(name: str, inputs: GateInputs) -> Any:
            self.runs += 1
            return real(name, inputs)

        monkeypatch.setattr(steps, "run_gate", counted)


def _judge(context: Context, wheels: Any, store: ReuseStore) -> steps.Judged:
    return steps.judge(context, "non-empty", steps.gate_inputs(context, wheels, gpu=None), store)


def test_a_stored_pass_is_taken_again_signed_and_byte_for_byte(
    gate_context: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    store = steps.reuse_store(gate_context)
    wheels = wheel_set(build_wheel(tmp_path / "dist", tag="py3-none-any"))
    first = _judge(gate_context, wheels, store)
    assert (first.evidence.verdict, first.reused, spy.runs) == ("pass", "", 1)
    attested = attestation_path(gate_context.out_dir, "non-empty").read_bytes()
    evidence = evidence_path(gate_context.out_dir, "non-empty").read_bytes()
    shutil.rmtree(gate_context.out_dir)  # as `run` sets the earlier evidence aside

    again = _judge(gate_context, wheels, store)
    assert spy.runs == 1 and again.reused.startswith("reused: key ")
    assert again.evidence == first.evidence
    assert attestation_path(gate_context.out_dir, "non-empty").read_bytes() == attested
    assert evidence_path(gate_context.out_dir, "non-empty").read_bytes() == evidence

    other = wheel_set(build_wheel(tmp_path / "dist2", tag="py3-none-any", salt="1"))
    assert _judge(gate_context, other, store).reused == "" and spy.runs == 2
    refused = steps.reuse_store(gate_context, "CI is set")
    assert _judge(gate_context, wheels, refused).reused == "" and spy.runs == 3


def test_a_gate_whose_code_changed_runs_again_and_says_what_changed(
    gate_context: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    store = steps.reuse_store(gate_context)
    wheels = wheel_set(build_wheel(tmp_path / "dist", tag="py3-none-any"))
    code = {"release/gates/fixture.py": "1"}
    monkeypatch.setattr(gate_reuse, "module_sources", lambda modules: dict(code))
    _judge(gate_context, wheels, store)
    code["release/gates/fixture.py"] = "2"
    again = _judge(gate_context, wheels, store)
    assert spy.runs == 2 and again.reused == ""
    assert again.ran_again == "code.release/gates/fixture.py"


def test_a_failure_is_never_stored(
    gate_context: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    store = steps.reuse_store(gate_context)
    empty = tmp_path / "dist" / "activekv-0.1.0-py3-none-any.whl"
    empty.parent.mkdir()
    empty.write_bytes(b"")
    wheels = wheel_set(empty)
    assert _judge(gate_context, wheels, store).evidence.verdict == "fail"
    assert _judge(gate_context, wheels, store).evidence.verdict == "fail" and spy.runs == 2
    assert not (gate_context.state_dir / "reuse" / "gate" / "non-empty").exists()


def test_a_stored_attestation_that_does_not_verify_is_not_taken(
    gate_context: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    spy = Spy(monkeypatch)
    store = steps.reuse_store(gate_context)
    wheels = wheel_set(build_wheel(tmp_path / "dist", tag="py3-none-any"))
    _judge(gate_context, wheels, store)
    (entry,) = (gate_context.state_dir / "reuse" / "gate" / "non-empty").glob("*.json")
    data = json.loads(entry.read_text())
    envelope = json.loads(data["payload"]["attestation"])
    envelope["signatures"][0]["sig"] = "00" * 64  # a verdict no one signed
    data["payload"]["attestation"] = json.dumps(envelope)
    entry.write_text(json.dumps(data))  # the key is over the inputs, which are unchanged
    again = _judge(gate_context, wheels, store)
    assert spy.runs == 2 and again.reused == "" and again.evidence.verdict == "pass"
    assert "is not taken" in capsys.readouterr().out


# --- the bench's reading of a run ---


def test_the_warm_run_bench_reads_what_a_run_reused_and_ran(tmp_path: Path) -> None:
    from release.bench.warm_runs import Run

    output = "\n".join([
        "policy: pass (reused: key f84824b0092c, from the run at 2026-12-06T22:06:42+00:00)",
        "payload: pass",
        "  ran again: changed since it last passed: files.checkout",
        "served-path: not-run",
        "signed 3 wheel(s), the sdist activekv-0.1.0.tar.gz and the 3 gate attestations they rest "
        "on: out/provenance/activekv-0.1.0.intoto.json (key ff63ff86e7f27654)",
        "  python 3.10.13: activekv-0.1.0-cp310.whl digest matches its TUF target and the signed "
        "statement; imported activekv._engine",
    ])  # fmt: skip
    run = Run("README-only change", 1.0, 0, tmp_path / "log")
    run.read(output)
    assert run.reused == ["policy"]
    assert run.ran == ["payload", "served-path (not-run)", "the signature", "verify's installs"]
    again = Run("no-change re-run", 1.0, 0, tmp_path / "log")
    again.read(
        "signed 3 wheel(s) … (key ff63; reused: key 1600352994a5, from the run at x)\n"
        "  the installs below are those of a verify of the same files (reused: key 6e)\n"
        "  python 3.10.13: a.whl digest matches its TUF target and the signed statement"
    )
    assert again.reused == ["the signature", "verify's installs"] and again.ran == []
