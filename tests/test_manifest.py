"""The manifest schema: the real manifest loads, and each malformed variant fails for its reason."""

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from release import catalogue
from release.errors import ManifestError
from release.manifest import Manifest, load_manifest

REAL = Path(__file__).resolve().parents[1] / "manifests" / "activekv.toml"
# The GPU attester the real manifest lists (a re-attested commit lists a new runner key).
GPU_ATTESTER = re.search(r'gpu = \["keys/[^"]+"\]', REAL.read_text())[0]  # type: ignore[index]
SHA = "ab" * 32

Transform = Callable[[str], str]


def replace(old: str, new: str) -> Transform:
    """Replace the one occurrence of ``old``."""

    def apply(text: str) -> str:
        assert text.count(old) == 1, f"{old!r} must occur once in {REAL.name}"
        return text.replace(old, new)

    return apply


def drop_line(pattern: str) -> Transform:
    """Remove the first line that matches ``pattern`` (a regex anchored at line start)."""

    def apply(text: str) -> str:
        new, count = re.subn(rf"^{pattern}.*\n", "", text, count=1, flags=re.M)
        assert count == 1, f"no line matches {pattern!r}"
        return new

    return apply


def drop_table(name: str, instead: str = "") -> Transform:
    """Remove the table ``[name]`` (header, keys and comments up to the next header)."""

    def apply(text: str) -> str:
        table = rf"^\[{re.escape(name)}\]\n(?:[^\[\n].*\n|\n)*"
        new, count = re.subn(table, instead, text, count=1, flags=re.M)
        assert count == 1, f"no table [{name}]"
        return new

    return apply


def append(extra: str) -> Transform:
    return lambda text: text + extra


def shim(**changes: str) -> Transform:
    """The manifest with its one [[payload.shims]] table replaced: the real fields, `changes`
    applied ("-" leaves a field out). `version` lists the pinned releases, comma-separated."""
    fields = {"path": "activekv/vllm_hook.py", "framework": "vllm", "supports": ">=0.32,<0.34"}
    fields["sha256"] = SHA
    versions = changes.pop("version", "0.32.0,0.33.0").split(",")
    fields.update(changes)
    body = "".join(f'{key} = "{value}"\n' for key, value in fields.items() if value != "-")
    pins = ", ".join(f'{{ version = "{v}" }}' for v in versions)
    body += f"versions = [{pins}]\n"
    return lambda text: re.sub(
        r"^\[\[payload\.shims\]\]\n(?:.*\n)*?\]\n", f"[[payload.shims]]\n{body}", text,
        flags=re.MULTILINE,
    )  # fmt: skip


def load_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Manifest:
    monkeypatch.chdir(tmp_path)
    Path("bad.toml").write_text(text, encoding="utf-8")
    return load_manifest(Path("bad.toml"))


def errors_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> list[str]:
    with pytest.raises(ManifestError) as caught:
        load_text(tmp_path, monkeypatch, text)
    return str(caught.value).splitlines()


# --- the real manifest ---


def test_real_manifest_loads() -> None:
    manifest = load_manifest(REAL)
    assert manifest.path == REAL
    assert manifest.schema_version == 1
    assert manifest.release.name == "activekv"
    assert manifest.release.default_channel == "dev"
    assert manifest.channel("stable").requires == (
        "policy", "payload", "casters", "parity", "served-path", "warmup", "gpu-parity"
    )  # fmt: skip
    assert manifest.channel("dev").requires == ("policy", "payload", "casters")
    assert manifest.channel("dev").signing == "dev"
    assert manifest.build.python == ("3.10", "3.11", "3.12", "3.13")
    assert manifest.build.glibc == (2, 28)
    assert manifest.build.arch == "x86_64"
    assert manifest.build.abi3_python == "3.12"
    assert manifest.build.toolchain.kind == "hermetic"
    assert manifest.build.cuda.architectures == ("80", "90", "100")
    assert [shim.path for shim in manifest.payload.shims] == ["activekv/vllm_connector.py"]
    assert manifest.gates["warmup"].runner == "gpu"
    assert manifest.gates["warmup"].warmup_steps == 32
    assert type(manifest.gates["policy"]) is catalogue.GateSettings  # a gate without parameters
    assert manifest.sign["dev"].generated
    assert not manifest.sign["stable"].generated
    assert manifest.publish.embedded
    assert manifest.publish.state_dir == ".activekv"


def test_manifest_is_frozen() -> None:
    manifest = load_manifest(REAL)
    with pytest.raises(ValidationError):
        manifest.build.platform = "manylinux_2_17_x86_64"


def test_unknown_channel_names_the_known_ones() -> None:
    manifest = load_manifest(REAL)
    with pytest.raises(ManifestError) as caught:
        manifest.channel("nightly")
    assert str(caught.value) == (
        f'{REAL}: release.channels: expected a channel "dev" or "stable"; got "nightly"'
    )


REMOTE = (
    'index = "http://127.0.0.1:8080/simple/"\ntuf_dir = "/srv/tuf"\n'
    'tuf_url = "http://127.0.0.1:8081/"'
)


def test_a_remote_index_takes_its_upload_url_by_the_server_convention_or_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = REAL.read_text(encoding="utf-8").replace('index = "embedded"', REMOTE)
    assert (
        load_text(tmp_path, monkeypatch, text).publish.upload_endpoint == "http://127.0.0.1:8080/"
    )
    devpi = text.replace("8080/simple/", "3141/bot/releases/+simple/")
    manifest = load_text(tmp_path, monkeypatch, devpi)
    assert manifest.publish.upload_endpoint == "http://127.0.0.1:3141/bot/releases/"
    given = text.replace("/simple/", "/packages/").replace(
        "tuf_dir", 'upload_url = "https://upload.example.com/legacy/"\ntuf_dir'
    )
    manifest = load_text(tmp_path, monkeypatch, given)
    assert manifest.publish.upload_endpoint == "https://upload.example.com/legacy/"


def test_command_line_publish_options_are_checked_as_the_manifest_keys() -> None:
    manifest = load_manifest(REAL)
    remote = manifest.with_publish(
        index="https://pypi.example.com/simple/", tuf_dir="/srv/tuf",
        tuf_url="https://pypi.example.com/tuf/",
    )  # fmt: skip
    assert (remote.publish.upload_endpoint, remote.path) == ("https://pypi.example.com/", REAL)
    assert manifest.publish.embedded  # the loaded manifest is left as it was
    with pytest.raises(ManifestError) as caught:
        manifest.with_publish(index="ftp://example.com/simple/")
    assert str(caught.value).startswith(f"{REAL}: publish.index (--index): expected ")
    with pytest.raises(ManifestError, match=r"publish\.tuf_url: expected the URL that folder"):
        manifest.with_publish(index="https://pypi.example.com/simple/", tuf_dir="/srv/tuf")
    # Another index takes none of the manifest's keys of its own index: back to the embedded one,
    # or to a second server, whose upload and TUF URLs must then be given.
    assert remote.with_publish(index="embedded").publish.embedded
    with pytest.raises(ManifestError, match=r"publish\.tuf_dir: expected"):
        remote.with_publish(index="https://b.example.com/simple/")
    other = remote.with_publish(index="https://b.example.com/+simple/", tuf_dir="/srv/b",
                                tuf_url="https://b.example.com/tuf/")  # fmt: skip
    assert other.publish.upload_endpoint == "https://b.example.com/"


@pytest.mark.parametrize(
    "url",
    [
        "https://bot:s3cret@pypi.example.com/simple/",
        "https://pypi.example.com/simple/?token=s3cret",
        "https://pypi.example.com/simple/#s3cret",
        "https://pypi.example.com:99999/simple/",
        "https://pypi.exa mple.com/simple/",
        "https://pypi.example.com/\nsimple/",
    ],
)
def test_a_url_with_secrets_or_malformed_is_refused_and_never_repeated(url: str) -> None:
    with pytest.raises(ManifestError) as caught:
        load_manifest(REAL).with_publish(index=url)
    said = str(caught.value)
    expected = '"embedded" or an https:// URL without credentials, query or fragment'
    assert said.startswith(f"{REAL}: publish.index (--index): expected {expected}")
    assert "s3cret" not in said


def test_valid_variants_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = REAL.read_text(encoding="utf-8")
    for transform in (
        shim(),
        replace('key = "file:/etc/activekv/stable-signing-key.pem"', 'key = "gcpkms:projects/p/k"'),
        replace(
            'key = "file:/etc/activekv/stable-signing-key.pem"',
            'key = "gcpkms:projects/p/k"\npublic_key = "keys/stable.pub.json"',
        ),
        replace('index = "embedded"', REMOTE),
        replace('platform = "manylinux_2_28_x86_64"', 'platform = "manylinux_2_17_x86_64"'),
    ):
        manifest = load_text(tmp_path, monkeypatch, transform(text))
        assert manifest.path == Path("bad.toml")


# --- malformed manifests: (transformation of the real one, dotted key, expected fragment) ---

CASES = [
    # structure
    pytest.param(append("\n[extra]\nx = 1\n"), "extra", "one of the keys schema_version", id="top"),
    pytest.param(
        replace('[gates.policy]\nrunner = "cpu"', '[gates.policy]\nrunner = "cpu"\ntimeout = 5'),
        "gates.policy.timeout",
        "one of the keys runner; got an unknown key",
        id="unknown-nested-key",
    ),
    pytest.param(drop_table("publish"), "publish", "this key (it is required)", id="no-publish"),
    # gates: only those of the registry (release/gates/registry.py), each on its own runner
    pytest.param(
        append('\n[gates.speed]\nrunner = "cpu"\n'),
        "gates.speed",
        'a gate the pipeline has, "policy", "payload", "casters", "served-path"',
        id="unknown-gate",
    ),
    pytest.param(
        replace(
            '[gates.policy]\nrunner = "cpu"',
            '[gates.policy]\nrunner = "gpu"',
        ),
        "gates.policy.runner",
        '"cpu" (the policy gate runs there)',
        id="gate-on-the-wrong-runner",
    ),
    pytest.param(drop_table("build.cuda"), "build.cuda", "it is required", id="no-cuda"),
    pytest.param(drop_line("username = "), "publish.username", "required", id="no-username"),
    pytest.param(drop_line('runner = "cpu"'), "gates.policy.runner", "required", id="no-runner"),
    pytest.param(
        drop_table("build.toolchain", 'toolchain = "zig"\n\n'),
        "build.toolchain",
        "a table",
        id="table-as-string",
    ),
    pytest.param(
        replace("[gates.policy]", '[gates."Policy!"]'),
        "gates.Policy!",
        "(as a table name)",
        id="bad-table-name",
    ),
    # types
    pytest.param(
        replace("schema_version = 1", 'schema_version = "1"'),
        "schema_version",
        "an integer",
        id="t1",
    ),
    pytest.param(
        replace("schema_version = 1", "schema_version = 2"), "schema_version", "1", id="v2"
    ),
    pytest.param(
        replace('python = ["3.10", "3.11", "3.12", "3.13"]', 'python = "3.12"'),
        "build.python",
        "an array",
        id="python-not-array",
    ),
    pytest.param(
        replace("warmup_steps = 32", 'warmup_steps = "32"'),
        "gates.warmup.warmup_steps",
        "an integer",
        id="steps-string",
    ),
    pytest.param(
        replace("warmup_steps = 32", "warmup_steps = true"),
        "gates.warmup.warmup_steps",
        "an integer",
        id="steps-bool",
    ),
    pytest.param(
        replace('["80", "90", "100"]', '[80, "90", "100"]'),
        "build.cuda.architectures[0]",
        "a string",
        id="arch-int",
    ),
    # release
    pytest.param(
        replace('name = "activekv"', 'name = "active kv"'),
        "release.name",
        "a distribution name",
        id="name",
    ),
    pytest.param(
        replace('version_source = "pyproject"', 'version_source = "git"'),
        "release.version_source",
        '"pyproject"',
        id="version-source",
    ),
    pytest.param(
        replace('default_channel = "dev"', 'default_channel = "nightly"'),
        "release.default_channel",
        'a declared channel "dev" or "stable"',
        id="default-channel",
    ),
    pytest.param(
        lambda text: text.replace("[release.channels.stable", "[release.channels.beta"),
        "release.channels",
        'channels that include "dev" and "stable"',
        id="no-stable-channel",
    ),
    pytest.param(
        replace('"served-path", "warmup", "gpu-parity"]', '"served-path", "speed", "gpu-parity"]'),
        "release.channels.stable.requires[5]",
        "a gate declared in [gates.*]",
        id="unknown-gate",
    ),
    pytest.param(
        replace('requires = ["policy", "payload", "casters"]', "requires = []"),
        "release.channels.dev.requires",
        "a non-empty array",
        id="requires-empty",
    ),
    pytest.param(
        replace('requires = ["policy", "payload", "casters"]', 'requires = ["policy", "policy"]'),
        "release.channels.dev.requires",
        "without duplicates",
        id="requires-duplicate",
    ),
    pytest.param(
        replace('signing = "stable"', 'signing = "prod"'),
        "release.channels.stable.signing",
        'a key declared in [sign.*], "dev" or "stable"',
        id="unknown-signing",
    ),
    pytest.param(
        replace('signing = "stable"', 'signing = "dev"'),
        "release.channels.stable.signing",
        'whose key is not "generate"',
        id="stable-signed-by-dev",
    ),
    # build
    pytest.param(
        replace('"3.10", "3.11", "3.12", "3.13"]', '"3.10", "3.x", "3.12", "3.13"]'),
        "build.python[1]",
        'a Python version "3.N"',
        id="python-element",
    ),
    pytest.param(
        replace('"3.10", "3.11", "3.12", "3.13"]', '"3.7", "3.11", "3.12", "3.13"]'),
        "build.python[0]",
        "N from 8 to 14",
        id="python-too-old",
    ),
    pytest.param(
        replace('"3.10", "3.11", "3.12", "3.13"]', '"3.11", "3.10", "3.12", "3.13"]'),
        "build.python",
        "in ascending order",
        id="python-unsorted",
    ),
    pytest.param(
        replace('"3.10", "3.11", "3.12", "3.13"]', '"3.10", "3.12", "3.12", "3.13"]'),
        "build.python",
        "without duplicates",
        id="python-duplicate",
    ),
    pytest.param(
        replace('stable_abi_from = "3.12"', 'stable_abi_from = "3.11"'),
        "build.stable_abi_from",
        '"3.12" or newer',
        id="abi3-too-old",
    ),
    pytest.param(
        replace('stable_abi_from = "3.12"', 'stable_abi_from = "3.14"'),
        "build.stable_abi_from",
        'one of build.python, "3.10", "3.11", "3.12" or "3.13"',
        id="abi3-not-built",
    ),
    pytest.param(
        replace('platform = "manylinux_2_28_x86_64"', 'platform = "linux_x86_64"'),
        "build.platform",
        '"manylinux_<major>_<minor>_x86_64"',
        id="platform",
    ),
    pytest.param(
        replace('build_type = "Release"', 'build_type = "Debug"'),
        "build.build_type",
        'one of "Release" or "RelWithDebInfo"',
        id="build-type",
    ),
    pytest.param(
        replace('kind = "hermetic"', 'kind = "docker"'),
        "build.toolchain.kind",
        '"hermetic" or "cibuildwheel"',
        id="toolchain",
    ),
    pytest.param(
        replace('cuda_host_compiler = "g++"', 'cuda_host_compiler = "g ++"'),
        "build.toolchain.cuda_host_compiler",
        "a program name without spaces",
        id="host-compiler",
    ),
    pytest.param(
        replace('version = "13.0"', 'version = "13"'),
        "build.cuda.version",
        'a CUDA version such as "13.0"',
        id="cuda-version",
    ),
    pytest.param(
        replace('["80", "90", "100"]', '["80", "90", "101"]'),
        "build.cuda.architectures[2]",
        'a compute capability, one of "75", "80"',
        id="arch-unknown",
    ),
    pytest.param(
        replace('["80", "90", "100"]', '["80", "100"]'),
        "build.cuda.architectures",
        'include "80" and "90"',
        id="arch-no-90",
    ),
    pytest.param(
        replace('["80", "90", "100"]', '["80", "90", "90"]'),
        "build.cuda.architectures",
        "without duplicates",
        id="arch-duplicate",
    ),
    pytest.param(
        replace('["80", "90", "100"]', "[]"),
        "build.cuda.architectures",
        "a non-empty array",
        id="arch-empty",
    ),
    pytest.param(
        replace('runtime = "static"', 'runtime = "shared"'),
        "build.cuda.runtime",
        '"static"',
        id="cuda-runtime",
    ),
    # payload
    pytest.param(
        replace('"shim", "sbom"]', '"shim", "sbom", "binary"]'),
        "payload.allowed_kinds[7]",
        'one of "extension", "stub",',
        id="kind-unknown",
    ),
    pytest.param(
        replace('"shim", "sbom"]', '"shim", "stub"]'),
        "payload.allowed_kinds",
        "file kinds without duplicates",
        id="kind-duplicate",
    ),
    pytest.param(
        replace('"shim", "sbom"]', '"shim"]'),
        "payload",
        '"sbom" among payload.allowed_kinds, since payload.sbom requires one',
        id="sbom-kind-not-allowed",
    ),
    pytest.param(
        replace('sbom = "activekv.cdx.json"', 'sbom = "../escape.cdx.json"'),
        "payload.sbom",
        "a file name like activekv.cdx.json",
        id="sbom-name-with-a-path",
    ),
    pytest.param(
        replace('sbom = "activekv.cdx.json"', "sbom = 1"),
        "payload.sbom",
        "",
        id="sbom-not-a-string",
    ),
    pytest.param(
        shim(path="vllm/hook.py"),
        "payload.shims[0].path",
        '"activekv/<name>.py"',
        id="shim-outside",
    ),
    pytest.param(
        shim(path="activekv/../hook.py"),
        "payload.shims[0].path",
        "inside the package",
        id="shim-dotdot",
    ),
    pytest.param(
        shim(path="activekv/hook.so"), "payload.shims[0].path", ".py", id="shim-not-python"
    ),
    pytest.param(
        shim(version=">=0.33"),
        "payload.shims[0].versions[0].version",
        "an exact version",
        id="shim-range",
    ),
    pytest.param(
        shim(version="0.34.0"),
        "payload.shims[0]",
        "versions inside supports '>=0.32,<0.34'; got ['0.34.0']",
        id="shim-pin-outside-supports",
    ),
    pytest.param(
        shim(supports="0.33"), "payload.shims[0].supports", "a version range", id="shim-supports"
    ),
    pytest.param(
        shim(version="0.33.0"),
        "gates.served-path.installs",
        'one install for each vLLM release payload.shims pins (0.33.0); got ["0.32.0", "0.33.0"]',
        id="served-path-installs-other-releases",
    ),
    pytest.param(
        replace('{ version = "0.33.0", python = "3.12"', '{ version = "0.33.0", python = "3.9"'),
        "gates.served-path.installs[1].python",
        'one of build.python, "3.10", "3.11", "3.12" or "3.13"; got "3.9"',
        id="served-path-install-python-not-built",
    ),
    pytest.param(
        shim(version="0.33.0,0.32.0"),
        "payload.shims[0].versions",
        "distinct versions, oldest first",
        id="shim-pins-unordered",
    ),
    pytest.param(
        shim(sha256="ABC"), "payload.shims[0].sha256", "64 lowercase hex digits", id="shim-sha"
    ),
    pytest.param(shim(framework="-"), "payload.shims[0].framework", "required", id="shim-missing"),
    # gates
    pytest.param(
        replace('[gates.payload]\nrunner = "cpu"', '[gates.payload]\nrunner = "tpu"'),
        "gates.payload.runner",
        'one of "cpu" or "gpu"',
        id="runner",
    ),
    pytest.param(
        drop_line("steady_steps = "),
        "gates.warmup.steady_steps",
        "a positive integer (the warm-up gate needs it)",
        id="gpu-gate-steps",
    ),
    pytest.param(
        replace("warmup_steps = 32", "warmup_steps = 0"),
        "gates.warmup.warmup_steps",
        "an integer greater than 0",
        id="steps-zero",
    ),
    # sign
    pytest.param(
        replace('key = "file:/etc/activekv/stable-signing-key.pem"', 'key = "vault:secret/k"'),
        "sign.stable.key",
        "with scheme",
        id="key-scheme",
    ),
    pytest.param(
        replace('key = "file:/etc/activekv/stable-signing-key.pem"', 'key = "file:key.pem"'),
        "sign.stable.key",
        '"file:<absolute path>"',
        id="key-relative-file",
    ),
    # publish
    pytest.param(
        replace('index = "embedded"', 'index = "http://pypi.example.com/simple/"'),
        "publish.index",
        "http:// only for 127.0.0.1 or localhost",
        id="index-http",
    ),
    pytest.param(
        replace('index = "embedded"', 'index = "https://u:p@pypi.example.com/simple/"'),
        "publish.index",
        "without credentials",
        id="index-credentials",
    ),
    pytest.param(
        replace('index = "embedded"', REMOTE.replace('tuf_dir = "/srv/tuf"\n', "")),
        "publish.tuf_dir",
        "the folder the TUF repository is written to",
        id="remote-without-tuf-dir",
    ),
    pytest.param(
        replace('index = "embedded"', REMOTE.replace("/simple/", "/packages/")),
        "publish.upload_url",
        "cannot be derived",
        id="remote-upload-url-not-derivable",
    ),
    pytest.param(
        replace('index = "embedded"', 'index = "embedded"\ntuf_url = "https://x.example.com/"'),
        "publish.tuf_url",
        'nothing with index = "embedded"',
        id="embedded-with-tuf-url",
    ),
    pytest.param(
        replace('index = "embedded"', REMOTE.replace('"/srv/tuf"', '"/srv/\\n"')),
        "publish.tuf_dir",
        "without control characters",
        id="tuf-dir-newline",
    ),
    pytest.param(
        replace('username = "activekv-publisher"', 'username = "active kv"'),
        "publish.username",
        "[A-Za-z0-9._-]",
        id="username",
    ),
    pytest.param(
        replace(f'cpu = ["signing-key"], {GPU_ATTESTER}', f"cpu = [], {GPU_ATTESTER}"),
        "release.channels.stable.attesters.cpu",
        "a non-empty array",
        id="attesters-empty",
    ),
    pytest.param(
        replace(f", {GPU_ATTESTER} }}", " }"),
        "release.channels.stable.attesters",
        'keys for "gpu", which runs the required "warmup" and "gpu-parity"',
        id="attesters-missing-for-a-required-gate",
    ),
    pytest.param(
        replace(
            'attestations = ["tests/gpu/evidence"]',
            'attestations = ["tests/gpu/evidence", "tests/gpu/evidence"]',
        ),
        "release.channels.stable.attestations",
        "folders without duplicates",
        id="attestations-duplicate",
    ),
    pytest.param(
        replace(
            '{ name = "exact-fp16-t16-h8d64-l4", mode',
            '{ name = "exact-fp16-t16-h8d64-l4", colour = "red", mode',
        ),
        "gates.parity.cells[0].colour",
        "one of the keys name, mode, dtype",
        id="cell-unknown-key",
    ),
    pytest.param(
        replace(
            '[gates.policy]\nrunner = "cpu"', '[gates.policy]\nrunner = "cpu"\n"po\\u001b[2Jx" = 1'
        ),
        'gates.policy."po\\u001b[2Jx"',
        "one of the keys runner",
        id="key-with-a-control-character",
    ),
    pytest.param(
        replace(
            '[gates.policy]\nrunner = "cpu"', '[gates.policy]\nrunner = "cpu"\nwarmup_steps = 3'
        ),
        "gates.policy.warmup_steps",
        "one of the keys runner; got an unknown key",
        id="parameter-of-another-gate",
    ),
    pytest.param(
        replace(
            'key = "file:/etc/activekv/stable-signing-key.pem"',
            'key = "gcpkms:projects/p/k"\npublic_key = ""',
        ),
        "sign.stable.public_key",
        'the path of a public key file "<name>.pub.json"',
        id="public-key-empty",
    ),
    pytest.param(
        replace('platform = "manylinux_2_28_x86_64"', 'platform = "manylinux_2_28_aarch64"'),
        "build.platform",
        "(the toolchain builds x86_64)",
        id="platform-aarch64",
    ),
    pytest.param(
        replace('name = "gpu-exact-bf16-t16-h8d128-l8"', 'name = "exact-fp16-t16-h8d64-l4"'),
        "gates.parity",
        "gpu_cells named apart from cells; ['exact-fp16-t16-h8d64-l4'] are in both",
        id="gpu-cell-named-as-a-cell",
    ),
    pytest.param(
        # A pool of 2 blocks, but a device KV of 2 x 4096 + 2 blocks of 512 KiB: over 4 GiB.
        replace(
            "pool_blocks = 64, num_regions = 4, region_blocks = 8, steps = 16, fence_faults = 0, "
            "seed = 101",
            "pool_blocks = 2, num_regions = 4, region_blocks = 4096, steps = 16, fence_faults = 0, "
            "seed = 101",
        ),
        "gates.parity.gpu_cells[0]",
        "a host pool and device KV of at most 4 GiB together",
        id="cell-device-kv-too-large",
    ),
    pytest.param(
        replace('state_dir = ".activekv"', 'state_dir = "../state"'),
        "publish.state_dir",
        'a relative path without ".."',
        id="state-dotdot",
    ),
    pytest.param(
        replace('state_dir = ".activekv"', 'state_dir = "/var/lib/activekv"'),
        "publish.state_dir",
        "a relative path",
        id="state-absolute",
    ),
]


@pytest.mark.parametrize(("transform", "key", "expected"), CASES)
def test_malformed_manifest(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    transform: Transform,
    key: str,
    expected: str,
) -> None:
    lines = errors_of(tmp_path, monkeypatch, transform(REAL.read_text(encoding="utf-8")))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"bad.toml: {key}: expected "), lines[0]
    assert expected in lines[0].split(": expected ", 1)[1], lines[0]
    assert "; got " in lines[0]


def test_error_shows_the_value_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = replace('build_type = "Release"', 'build_type = "Debug"')(REAL.read_text())
    assert errors_of(tmp_path, monkeypatch, text) == [
        'bad.toml: build.build_type: expected one of "Release" or "RelWithDebInfo"; got "Debug"'
    ]


def test_several_errors_one_per_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = REAL.read_text(encoding="utf-8")
    text = replace('build_type = "Release"', 'build_type = "Debug"')(text)
    text = replace('runtime = "static"', 'runtime = "shared"')(text)
    text = drop_line("username = ")(text)
    keys = [line.split(": ")[1] for line in errors_of(tmp_path, monkeypatch, text)]
    assert keys == ["build.build_type", "build.cuda.runtime", "publish.username"]


def test_syntax_error_names_line_and_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = replace('name = "activekv"', 'name = "activekv')(REAL.read_text(encoding="utf-8"))
    line = 1 + text.splitlines().index('name = "activekv')
    [message] = errors_of(tmp_path, monkeypatch, text)
    assert message.startswith(f"bad.toml: line {line}, column "), message
    assert "expected valid TOML; got " in message


def test_duplicate_key_is_a_syntax_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = replace("schema_version = 1", "schema_version = 1\nschema_version = 1")(REAL.read_text())
    [message] = errors_of(tmp_path, monkeypatch, text)
    assert message.startswith("bad.toml: line 4, column "), message


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "manifests" / "nope.toml"
    with pytest.raises(ManifestError) as caught:
        load_manifest(missing)
    assert str(caught.value) == f"{missing}: expected a manifest file; got no such file"


def test_directory_is_not_a_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=re.escape(f"{tmp_path}: expected a regular manifest "
                                                      "file; got a directory")):  # fmt: skip
        load_manifest(tmp_path)


def test_only_a_regular_file_of_bounded_size_is_read(tmp_path: Path) -> None:
    """A FIFO would hang the reader and /dev/zero would eat memory: both refused unread."""
    fifo = tmp_path / "manifest.toml"
    os.mkfifo(fifo)
    with pytest.raises(ManifestError, match="expected a regular manifest file; got a FIFO"):
        load_manifest(fifo)
    with pytest.raises(ManifestError, match="expected a regular manifest file; got a device"):
        load_manifest(Path("/dev/zero"))
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * ((1 << 20) + 1))
    with pytest.raises(ManifestError, match="expected a manifest of at most 1 MiB"):
        load_manifest(big)
    nul = Path(str(tmp_path / "a") + "\0b.toml")
    with pytest.raises(ManifestError, match="expected a readable manifest file"):
        load_manifest(nul)


def test_toml_nested_too_deep_is_a_clear_error(tmp_path: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 1000 + "]" * 1000 + "\n")
    with pytest.raises(ManifestError, match="nested too deep"):
        load_manifest(deep)
