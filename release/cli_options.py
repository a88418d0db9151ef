"""The command line's parser: one subcommand per step, each listing only the options its step
reads (release/cli.py dispatches them)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from release.errors import ReleaseError
from release.gates.options import add_flags, count
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.util.pins import project_version

# Commands that run one gate of the registry, and the gate each runs.
GATE_COMMANDS = {
    "payload": "payload", "audit": "payload", "policy": "policy", "casters": "casters",
    "served-path": "served-path", "parity": "parity", "reproduce": "reproducible",
}  # fmt: skip


class _VersionAction(argparse.Action):
    """`--version`: the project's version, read from pyproject.toml only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        try:
            version = project_version()
        except ReleaseError as error:
            parser.exit(2, f"error: {error}\n")
        print(f"{parser.prog} {version}")  # on stdout, as argparse's own version action
        parser.exit(0)


def _option_parser(*flag: str, **options: object) -> argparse.ArgumentParser:
    """A parent parser of one global option (a subcommand takes those of the ones it reads)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(*flag, **options)  # type: ignore[arg-type]
    return parent


DEFAULT_OUT = REPO_ROOT / "out"


_MANIFEST = _option_parser(
    "--manifest", type=Path, default=DEFAULT_MANIFEST,
    help="the release manifest (default: manifests/activekv.toml)",
)  # fmt: skip


_OUT = _option_parser(
    "--out", type=Path, default=DEFAULT_OUT,
    help="output directory: wheels, evidence, statement, report (default: out)",
)  # fmt: skip


_STATE_DIR = _option_parser(
    "--state-dir", type=Path, default=None,
    help="keys, index data and caches (default: the manifest's publish.state_dir)",
)  # fmt: skip


_CHANNEL = _option_parser(
    "--channel", default=None,
    help="release channel (default: the manifest's default_channel); gate runs sign their "
    "attestations with its signing key",
)  # fmt: skip


_KEY_DIR = _option_parser(
    "--key-dir", type=Path, default=None, metavar="DIR",
    help="the stable channel's keys, as `keygen --channel stable DIR` made them (instead of the "
    "manifest's key references)",
)  # fmt: skip


_ATTEST_KEY = _option_parser(
    "--attest-key", type=Path, default=None, metavar="PEM",
    help="a runner's private key (`keygen --runner`) to sign gate attestations with, instead of "
    "the channel's signing key",
)  # fmt: skip


# What each kind of step reads of the Context (release/context.py), so the options it takes.
# The gates and build (its policy gate) sign attestations (release.steps.judge: the channel's
# key, --key-dir or --attest-key) and keep caches under the state directory.
_ALL = [_MANIFEST, _OUT, _STATE_DIR, _CHANNEL, _KEY_DIR, _ATTEST_KEY]


_TRUST = [_MANIFEST, _OUT, _STATE_DIR, _CHANNEL, _KEY_DIR]  # sign, publish, verify


_PARENTS: dict[str, list[argparse.ArgumentParser]] = {
    "check-manifest": [_MANIFEST], "ci": [_MANIFEST],
    "cpp-tests": [_MANIFEST, _STATE_DIR],  # its build trees and ccache: <state>/cache
    "build": _ALL, "record-build": [_MANIFEST, _OUT], "bench": [_MANIFEST, _OUT],
    "gpu-staging": [_MANIFEST, _OUT, _STATE_DIR],  # builds its benchmark under <state>/cache
    **{gate: _ALL for gate in [*GATE_COMMANDS, "gpu-gates"]},
    "report": [_MANIFEST, _OUT, _CHANNEL],
    "sign": _TRUST, "publish": _TRUST, "verify": _TRUST, "run": _ALL,
    "serve": [_MANIFEST, _STATE_DIR],
    # The manifest's [publish.limits] bound its reads; the rebuild's cache is <state>/cache.
    "rebuild": [_MANIFEST, _OUT, _STATE_DIR],
    "keygen": [_MANIFEST, _CHANNEL],  # --pin writes beside the manifest
}  # fmt: skip


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535; got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m release", description=__doc__)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="STEP")

    sub.add_parser(
        "check-manifest", parents=_PARENTS["check-manifest"], help="validate the manifest"
    )
    build = sub.add_parser("build", parents=_PARENTS["build"], help="build the wheels")
    build.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="X.Y",
        help="build only this declared version (repeatable)",
    )
    build.add_argument(
        "--toolchain",
        choices=["hermetic", "cibuildwheel"],
        default=None,
        help="override the manifest's build.toolchain.kind",
    )
    build.add_argument(
        "--fresh",
        action="store_true",
        help="compile everything again in new build trees under <out>/fresh-build, with neither "
        "ccache nor the wheel cache (as the reproducible gate and `rebuild` do)",
    )
    cpp = sub.add_parser(
        "cpp-tests", parents=_PARENTS["cpp-tests"], help="build and run the C++ tests (ctest)"
    )
    cpp.add_argument("--sanitizer", default=None, help="asan-ubsan or tsan")
    parity = sub.add_parser(
        "parity",
        parents=_PARENTS["parity"],
        help="replay the manifest's parity cells: reference against engine",
    )
    _wheels_option(parity)
    add_flags(parity, "parity")
    parity.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="engine route: cpu, or cuda (this machine's GPU: the gpu-parity gate, with the GPU "
        "cells)",
    )
    bench = sub.add_parser(
        "bench",
        parents=_PARENTS["bench"],
        help="engine against reference: bookkeeping per layer-step",
    )
    _wheel_option(bench)
    bench.add_argument("--blocks", type=count(1 << 20), default=256,
                       help="blocks per step (default 256)")  # fmt: skip
    reproduce = sub.add_parser(
        "reproduce",
        parents=_PARENTS["reproduce"],
        help="build twice from two source copies; wheels must be identical",
    )
    add_flags(reproduce, "reproduce")
    ci = sub.add_parser(
        "ci",
        parents=_PARENTS["ci"],
        help="write the GitHub Actions workflow from the manifest's [ci]",
    )
    ci.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when the committed workflow differs from the manifest's",
    )
    ci.add_argument(
        "--replay",
        nargs=argparse.REMAINDER,
        metavar="OPTION",
        help="run the committed workflow's jobs on this machine; the options after it are "
        "python -m release.ci.replay's (--channel, --job, --secrets, --wheels, --gpu-records, "
        "--from-run, --commit, --repo, --work, --runner-dir, --tool-cache; docs/ci.md)",
    )
    sub.add_parser(
        "report",
        parents=_PARENTS["report"],
        help="write <out>/report.md and report.html from the records under <out>",
    )
    gpu_gates = sub.add_parser(
        "gpu-gates",
        parents=_PARENTS["gpu-gates"],
        help="the GPU gates (warm-up under CUPTI, GPU parity) on every wheel, each in an "
        'interpreter of its version ("not run: no GPU runner" without a GPU)',
    )
    _wheels_option(gpu_gates)
    add_flags(gpu_gates, "gpu-gates")
    sub.add_parser(
        "record-build",
        parents=_PARENTS["record-build"],
        help="write <out>/build.json for wheels built elsewhere (cibuildwheel in CI)",
    )
    gpu_staging = sub.add_parser(
        "gpu-staging",
        parents=_PARENTS["gpu-staging"],
        help="CUDA route staging benchmark with its baselines, on this machine's GPU",
    )
    _wheel_option(gpu_staging, "the wheel built from these sources, named in the record")
    for gate, text in (
        ("payload", "run the payload gate"),
        ("policy", "run the policy gate"),
        ("audit", "the payload gate: classify every file, verify every shim citation"),
        ("casters", "import each native module; no raw C++ type in any signature"),
    ):
        step = sub.add_parser(gate, parents=_PARENTS[gate], help=text)
        step.add_argument(
            "wheels",
            nargs="*",
            type=Path,
            help="wheels to judge (default: those <out>/build.json records)",
        )
    served = sub.add_parser(
        "served-path",
        parents=_PARENTS["served-path"],
        help="drive the vLLM connector through vLLM's hooks; count first-party Python frames",
    )
    served.add_argument(
        "wheels",
        nargs="*",
        type=Path,
        help="wheels to choose from (default: those <out>/build.json records)",
    )
    add_flags(served, "served-path")
    for name, text in (
        ("sign", "sign the provenance of the built wheels"),
        ("publish", "publish signed, gated wheels to the index"),
        ("verify", "install from the index and check against the statement"),
        ("run", "the whole release: build, gates, sign, publish, verify"),
        ("serve", "serve the embedded index in the foreground"),
        ("rebuild", "rebuild a published wheel from its recorded commit; must be bit-identical"),
    ):
        sub.add_parser(name, parents=_PARENTS[name], help=text)
    keygen = sub.add_parser(
        "keygen",
        parents=_PARENTS["keygen"],
        help="make an operator's stable keys, or a runner's key",
    )
    keygen.add_argument(
        "--runner", default=None, help="a runner's attestation key of this name (else --channel)"
    )
    keygen.add_argument(
        "--pin", action="store_true",
        help="also write the channel keys' public halves beside the manifest and pin them in it "
        "([release.channels.<name>.pinned]); commit that change",
    )  # fmt: skip
    keygen.add_argument("directory", type=Path, metavar="DIR", help="where to write the keys")
    sub.choices["serve"].add_argument(
        "--port", type=_port, default=0,
        help="serve on this port of 127.0.0.1, the same URL each time (default 0: any free port, "
        "another each time)",
    )  # fmt: skip
    _add_consumer_verify_arguments(sub.choices["verify"])
    _add_rebuild_arguments(sub.choices["rebuild"])
    for name in ("publish", "run"):
        _add_publish_target_arguments(sub.choices[name])
    sub.choices["run"].add_argument(
        "--fresh", action="store_true",
        help="reuse nothing found before (gate verdicts, the signature, verify's installs: "
        "docs/reuse.md) and build as `build --fresh` does",
    )  # fmt: skip
    return parser  # fmt: skip


# `--index URL` and the like: the manifest's [publish] keys of the same names, for this run.
PUBLISH_TARGET_OPTIONS = {
    "index": 'the index to publish to: "embedded" or a PEP 503 simple URL (publish.index)',
    "upload_url": "where twine uploads (publish.upload_url; default: devpi's .../USER/INDEX/ "
    "for .../+simple/, the root for .../simple/)",
    "tuf_dir": "remote index: the folder the TUF repository is written to, served beside the "
    "index (publish.tuf_dir)",
    "tuf_url": "remote index: the URL that folder is served at (publish.tuf_url)",
}


def _add_publish_target_arguments(parser: argparse.ArgumentParser) -> None:
    for key, text in PUBLISH_TARGET_OPTIONS.items():
        flag = "--" + key.replace("_", "-")
        metavar = "DIR" if key == "tuf_dir" else "URL"
        parser.add_argument(flag, dest=f"publish_{key}", default=None, metavar=metavar, help=text)


def _add_consumer_trust_arguments(
    parser: argparse.ArgumentParser, *, index_help: str, requirement_help: str
) -> None:
    """What a consumer trusts a release by (`verify --index`, `rebuild`): no publisher state."""
    parser.add_argument(
        "requirement", nargs="?", default=None, metavar="NAME==VERSION", help=requirement_help
    )
    parser.add_argument("--index", default=None, metavar="URL", help=index_help)
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        metavar="ROOT_JSON",
        help="the trusted TUF root (the publisher's 1.root.json)",
    )
    parser.add_argument(
        "--provenance-key",
        type=Path,
        default=None,
        metavar="PUB_JSON",
        help="public key of the provenance signer (<channel>-signing-key.pub.json)",
    )
    parser.add_argument(
        "--tuf-url",
        default=None,
        metavar="URL",
        help="the TUF repository (default: the index URL with /simple/ replaced by /tuf/)",
    )
    parser.add_argument(
        "--tuf-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="TUF metadata seen before, for rollback protection "
        "(default: ~/.cache/activekv/tuf/<hash of the root keys>, whatever URL)",
    )


def _add_rebuild_arguments(rebuild: argparse.ArgumentParser) -> None:
    """`rebuild --index URL NAME==VERSION --source PATH_OR_URL`: the consumer's rebuild check."""
    _add_consumer_trust_arguments(
        rebuild,
        index_help="the pip index URL (.../simple/) the release is published on",
        requirement_help="the release whose wheel to rebuild, e.g. activekv==0.1.0",
    )
    rebuild.add_argument(
        "--source",
        default=None,
        metavar="PATH_OR_URL",
        help="a git repository holding the commit the signed statement names",
    )
    rebuild.add_argument(
        "--python",
        default=f"{sys.version_info.major}.{sys.version_info.minor}",
        metavar="X.Y",
        help="rebuild the wheel pip installs on this Python version (default: this one's)",
    )


def _add_consumer_verify_arguments(verify: argparse.ArgumentParser) -> None:
    """`verify --index URL NAME==VERSION`: a consumer's check, needing no publisher state."""
    _add_consumer_trust_arguments(
        verify,
        index_help="verify as a consumer: the pip index URL (.../simple/); needs --root and "
        "--provenance-key; does not start the embedded index",
        requirement_help="with --index: the release to verify, e.g. activekv==0.1.0",
    )
    verify.add_argument(
        "--python",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="interpreter to install with (repeatable; default: this one)",
    )
    verify.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="module to import after installing (repeatable; default: activekv._engine and "
        "activekv._fabric)",
    )


def _wheel_option(parser: argparse.ArgumentParser, what: str = "wheel under test") -> None:
    parser.add_argument(
        "--wheel",
        type=Path,
        default=None,
        help=f"{what} (default: the built wheel for this interpreter)",
    )


def _wheels_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wheel",
        type=Path,
        action="append",
        default=[],
        help="wheel under test (repeatable; default: the wheels <out>/build.json records)",
    )
