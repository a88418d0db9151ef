"""Gate attestations (release/trust/attestation.py) and the keys behind them
(release/trust/keys.py): a verdict counts only when a key the manifest lists for the gate's
runner class signed it over exactly the published digests; an altered, unsigned or unreadable
envelope refuses the publish by itself; an operator's stable keys are made by `keygen`
(tests/test_pinned_keys.py: stable takes only the keys its manifest pins)."""

from __future__ import annotations

import base64
import json
import shutil
import stat
from pathlib import Path

import pytest
from fixtures_wheels import build_wheel
from securesystemslib.signer import CryptoSigner

from release.cli import main
from release.context import Context
from release.errors import ManifestError, PublishError, SigningError
from release.evidence import Evidence
from release.manifest import load_manifest
from release.statement import Statement, gate_statement
from release.trust.attestation import (
    GateKeys,
    attest,
    attestation_path,
    check_release,
    choose,
    provenance_entry,
    read_attestation,
)
from release.trust.keys import (
    attesting_signer,
    make_channel_keys,
    run_keys,
    tuf_keys_spec,
)
from release.trust.sign import (
    load_public_key,
    load_signer,
    sign_statement,
    write_envelope,
)
from release.trust.steps import channel_attestations
from release.util.digests import sha256_file
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT

# The runner key stable lists for its GPU gates (manifests/keys/).
(GPU_ATTESTER,) = load_manifest(DEFAULT_MANIFEST).channel("stable").attesters["gpu"]


@pytest.fixture
def digests(tmp_path: Path) -> dict[str, str]:
    tags = ("py3-none-any", "cp311-cp311-manylinux_2_28_x86_64")
    wheels = [build_wheel(tmp_path / "dist", tag=tag) for tag in tags]
    return {wheel.name: sha256_file(wheel) for wheel in wheels}


def _runner() -> tuple[CryptoSigner, dict]:
    signer = CryptoSigner.generate_ed25519()
    return signer, {signer.public_key.keyid: signer.public_key}


def _attested(out: Path, gate: str, digests: dict[str, str], signer, verdict="pass") -> Path:
    evidence = Evidence(gate=gate, verdict=verdict, artefacts=dict(digests), figures={"n": 1},
                        reason="" if verdict == "pass" else "it broke")  # fmt: skip
    return attest(evidence, signer, out)


def test_an_attestation_is_an_in_toto_statement_over_the_judged_digests(tmp_path, digests):
    signer, keys = _runner()
    path = _attested(tmp_path, "warmup", digests, signer)
    assert path == attestation_path(tmp_path, "warmup")
    envelope = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert {s["name"]: s["digest"]["sha256"] for s in statement["subject"]} == digests
    assert (
        statement["predicate"]["gate"] == "warmup" and statement["predicate"]["verdict"] == "pass"
    )
    read = read_attestation(path, keys, "the runner's key")
    assert read.evidence.artefacts == digests and read.evidence.figures == {"n": 1}
    assert read.key.keyid == signer.public_key.keyid and read.sha256 == sha256_file(path)


def test_a_gate_takes_the_attestation_that_names_exactly_the_published_digests(tmp_path, digests):
    signer, keys = _runner()
    committed = tmp_path / "committed"
    committed.mkdir()
    old = {name: "0" * 64 for name in digests}  # the same wheels at an earlier commit
    for name, judged in (("old", old), ("new", digests)):
        made = _attested(tmp_path / name, "warmup", judged, signer)
        shutil.move(made, committed / f"warmup-{name}.intoto.json")
    chosen, problems = choose([GateKeys("warmup", keys, "gpu keys")], [committed], digests)
    assert problems == [] and chosen["warmup"].path.name == "warmup-new.intoto.json"


def test_changed_wheels_are_named_when_no_attestation_matches(tmp_path, digests):
    signer, keys = _runner()
    changed = dict(digests)
    name = sorted(changed)[0]
    changed[name] = "f" * 64  # this wheel was judged with other bytes (the README changed, say)
    _attested(tmp_path, "warmup", changed, signer)
    _, problems = choose([GateKeys("warmup", keys, "gpu keys")], [tmp_path / "evidence"], digests)
    (problem,) = problems
    assert "warmup: no attestation in" in problem
    assert f"changed since it was judged: {name} (attested ffffffffffff" in problem
    assert sorted(changed)[1] not in problem.split("changed since it was judged:")[1]


@pytest.mark.parametrize("verdict", ["fail", "not-run"])
def test_a_verdict_other_than_pass_is_not_taken(tmp_path, digests, verdict):
    signer, keys = _runner()
    _attested(tmp_path, "warmup", digests, signer, verdict)
    _, (problem,) = choose([GateKeys("warmup", keys, "gpu keys")], [tmp_path / "evidence"], digests)
    assert f"verdict is {verdict} (it broke)" in problem


def test_an_unlisted_key_is_not_taken_and_is_named(tmp_path, digests):
    signer, _ = _runner()
    _, listed = _runner()
    _attested(tmp_path, "warmup", digests, signer)
    _, (problem,) = choose([GateKeys("warmup", listed, "a key of attesters.gpu")],
                           [tmp_path / "evidence"], digests)  # fmt: skip
    assert f"signed by key(s) {signer.public_key.keyid}, not by a key of attesters.gpu" in problem


def _edit(path: Path, change) -> None:
    document = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(document["payload"]))
    change(statement, document)
    document["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(document))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s, d: s["predicate"].update(verdict="pass"), "does not verify"),
        (lambda s, d: s["subject"].pop(), "does not verify"),
        (lambda s, d: d.update(signatures=[]), "the envelope has no signature"),
    ],
    ids=["verdict-edited", "subject-dropped", "signature-removed"],
)
def test_an_altered_or_unsigned_attestation_refuses_by_itself(tmp_path, digests, change, message):
    signer, keys = _runner()
    path = _attested(tmp_path, "warmup", digests, signer, "fail")
    _edit(path, change)
    with pytest.raises(SigningError, match=message) as raised:
        choose([GateKeys("warmup", keys, "gpu keys")], [tmp_path / "evidence"], digests)
    assert str(path) in str(raised.value)


@pytest.mark.parametrize(
    ("predicate", "named"),
    [
        ({"figures": "nope"}, "predicate: figures: expected"),
        ({"runner": None}, "predicate: runner: expected field required"),
        ({"verdict": "PASSED"}, "predicate: verdict: expected"),
    ],
)
def test_a_signed_predicate_missing_or_mistyping_a_field_is_named(
    tmp_path, digests, predicate, named
):
    signer, keys = _runner()
    statement = gate_statement(Evidence(gate="warmup", verdict="pass", artefacts=dict(digests)))
    for key, value in predicate.items():
        if value is None:
            del statement["predicate"][key]
        else:
            statement["predicate"][key] = value
    path = attestation_path(tmp_path, "warmup")
    path.parent.mkdir(parents=True)
    write_envelope(sign_statement(statement, signer), path)
    with pytest.raises(SigningError, match=named) as raised:
        read_attestation(path, keys, "the runner's key")
    assert str(path) in str(raised.value)


def test_the_consumer_checks_what_the_provenance_names(tmp_path, digests):
    signer, keys = _runner()
    path = _attested(tmp_path, "warmup", digests, signer)
    attestation = read_attestation(path, keys, "gpu keys")
    statement = {
        "subject": [{"name": n, "digest": {"sha256": d}} for n, d in digests.items()],
        "predicate": {
            "buildDefinition": {"externalParameters": {"gates": ["warmup"]}},
            "runDetails": {"byproducts": [provenance_entry(attestation, "gpu")]},
        },
    }
    fetched: list[str] = []

    def fetch(target: str) -> Path:
        fetched.append(target)
        return path

    assert [
        a.evidence.gate for a in check_release(Statement(statement), fetch, "activekv", "0.1.0")
    ] == ["warmup"]
    assert fetched == ["provenance/activekv-0.1.0.attestations/warmup.intoto.json"]
    statement["predicate"]["buildDefinition"]["externalParameters"]["gates"].append("parity")
    with pytest.raises(SigningError, match="requires gates parity but names no attestation"):
        check_release(Statement(statement), fetch, "activekv", "0.1.0")
    statement["predicate"]["buildDefinition"]["externalParameters"]["gates"].pop()
    path.write_text(path.read_text().replace('"sig"', '"sig" '))  # other bytes, same meaning
    with pytest.raises(SigningError, match="its sha256 is not the one the signed provenance names"):
        check_release(Statement(statement), fetch, "activekv", "0.1.0")


# --- keys ---


def test_keygen_makes_the_stable_keys_private_and_never_replaces_them(tmp_path, capsys):
    keys = tmp_path / "keys"
    assert main(["keygen", "--channel", "stable", str(keys)]) == 0
    names = {"stable-signing-key", "tuf-root", "tuf-targets", "tuf-snapshot", "tuf-timestamp"}
    assert {p.name for p in keys.iterdir()} == {f"{n}{s}" for n in names
                                               for s in (".pem", ".pub.json")}  # fmt: skip
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    for name in names:
        assert stat.S_IMODE((keys / f"{name}.pem").stat().st_mode) == 0o600
    before = (keys / "tuf-root.pem").read_bytes()
    assert main(["keygen", "--channel", "stable", str(keys)]) == 2
    assert "keys are never replaced" in capsys.readouterr().err
    assert (keys / "tuf-root.pem").read_bytes() == before
    assert main(["keygen", "--channel", "dev", str(tmp_path / "dev")]) == 2
    assert "expected stable" in capsys.readouterr().err
    assert main(["keygen", "--runner", "Bad Name", str(tmp_path / "r")]) == 2
    assert main(["keygen", str(tmp_path / "r")]) == 2
    assert "expected one of --channel stable or --runner NAME" in capsys.readouterr().err


def _context(tmp_path: Path, **given) -> Context:
    manifest = load_manifest(DEFAULT_MANIFEST)
    return Context(manifest, REPO_ROOT, tmp_path / "out", tmp_path / "state", **given)


def test_a_key_dir_without_a_role_key_is_named(tmp_path):
    keys = tmp_path / "keys"
    make_channel_keys("stable", keys)
    (keys / "tuf-root.pem").unlink()
    with pytest.raises(SigningError, match=r"--key-dir .*: expected tuf-root\.pem"):
        tuf_keys_spec(keys)


def test_gate_runs_sign_with_the_runner_key_or_the_channel_key(tmp_path):
    runner = tmp_path / "runner"
    assert main(["keygen", "--runner", "h200", str(runner)]) == 0
    context = _context(tmp_path, attest_key=runner / "h200.pem")
    _, key = attesting_signer(context)
    assert key.keyid == json.loads((runner / "h200.pub.json").read_text())["keyid"]
    _, dev = attesting_signer(_context(tmp_path))  # the default channel's (dev) generated key
    assert (tmp_path / "state" / "keys" / "dev-signing-key.pem").exists()
    assert dev.keyid != key.keyid


def test_a_run_loads_its_keys_once_and_attests_with_the_runner_key_when_given(tmp_path):
    dev = _context(tmp_path)
    keys = run_keys(dev, "dev", dev.manifest.channel("dev"))
    assert keys.attesting is keys.signing  # the channel's key signs both: loaded once
    runner = tmp_path / "runner"
    assert main(["keygen", "--runner", "h200", str(runner)]) == 0
    given = _context(tmp_path, attest_key=runner / "h200.pem")
    keys = run_keys(given, "dev", given.manifest.channel("dev"))
    assert keys.attesting[1].keyid == json.loads((runner / "h200.pub.json").read_text())["keyid"]
    assert keys.signing[1].keyid != keys.attesting[1].keyid


def test_attester_keys_are_files_beside_the_manifest(tmp_path):
    text = DEFAULT_MANIFEST.read_text(encoding="utf-8")
    listed = f'"{GPU_ATTESTER}"'
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace(listed, '"/etc/k.pem"'))
    with pytest.raises(ManifestError, match=r'attesters\.gpu\[0\]: expected "signing-key"'):
        load_manifest(bad)
    bad.write_text(text.replace(listed, '"keys/none.pub.json"'))
    context = Context(load_manifest(bad), REPO_ROOT, tmp_path / "out", tmp_path / "state")
    _, signing = CryptoSigner.generate_ed25519(), CryptoSigner.generate_ed25519().public_key
    with pytest.raises(PublishError, match=r"stable\.attesters\.gpu\[0\]: expected a public "
                       r"key file beside the manifest; .*none\.pub\.json"):  # fmt: skip
        channel_attestations(context, "stable", context.manifest.channel("stable"), {}, signing)


def test_key_material_that_others_may_write_is_refused(tmp_path):
    """A public key of mode 0666, or a private key in a folder of mode 0777: whoever may write
    them may put their own key in place, so neither is read."""
    keys = tmp_path / "keys"
    make_channel_keys("stable", keys)
    public = keys / "stable-signing-key.pub.json"
    public.chmod(0o666)
    with pytest.raises(SigningError, match=r"public key .* has mode 0666: group or others may"):
        load_public_key(public)
    public.chmod(0o644)
    keys.chmod(0o777)
    with pytest.raises(SigningError, match=r"the folder of signing key .*keys has mode 0777"):
        load_signer(f"file:{keys / 'stable-signing-key.pem'}", channel="stable",
                    state_dir=tmp_path / "state")  # fmt: skip
