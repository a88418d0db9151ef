"""Command line of the pipeline: one subcommand per step, plus `run` for the whole release."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from release.errors import ReleaseError
from release.manifest import load_manifest
from release.progress import console, error_console

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MANIFEST = REPO_ROOT / "manifests" / "activekv.toml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m release", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--manifest",
        type=Path,
        default=DEFAULT_MANIFEST,
        help="the release manifest (default: manifests/activekv.toml)",
    )
    common.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "out",
        help="output directory: wheels, evidence, statement, report (default: out)",
    )
    common.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="keys, index data and caches (default: the manifest's publish.state_dir)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="STEP")

    sub.add_parser("check-manifest", parents=[common], help="validate the manifest")
    build = sub.add_parser("build", parents=[common], help="build the wheels")
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
    cpp = sub.add_parser("cpp-tests", parents=[common], help="build and run the C++ tests (ctest)")
    cpp.add_argument("--sanitizer", default=None, help="asan-ubsan or tsan")
    parity = sub.add_parser(
        "parity",
        parents=[common],
        help="replay the manifest's parity cells: reference against engine",
    )
    parity.add_argument(
        "--wheel",
        type=Path,
        default=None,
        help="wheel under test (default: the built wheel for this interpreter)",
    )
    parity.add_argument(
        "--cell",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this cell (repeatable)",
    )
    bench = sub.add_parser(
        "bench", parents=[common], help="engine against reference: bookkeeping per layer-step"
    )
    bench.add_argument(
        "--wheel",
        type=Path,
        default=None,
        help="wheel under test (default: the built wheel for this interpreter)",
    )
    bench.add_argument("--blocks", type=int, default=256, help="blocks per step (default 256)")
    reproduce = sub.add_parser(
        "reproduce",
        parents=[common],
        help="build twice from two source copies; wheels must be identical",
    )
    reproduce.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="X.Y",
        help="only this declared version (repeatable)",
    )
    for gate in ("payload", "policy"):
        step = sub.add_parser(gate, parents=[common], help=f"run the {gate} gate")
        step.add_argument(
            "wheels", nargs="*", type=Path, help="wheels to judge (default: <out>/wheels/*.whl)"
        )
    for name, text in (
        ("sign", "sign the provenance of the built wheels"),
        ("publish", "publish signed, gated wheels to the index"),
        ("verify", "install from the index and check against the statement"),
        ("run", "the whole release: build, gates, sign, publish, verify"),
        ("serve", "serve the embedded index in the foreground"),
    ):
        step = sub.add_parser(name, parents=[common], help=text)
        if name != "serve":
            step.add_argument(
                "--channel",
                default=None,
                help="release channel (default: the manifest's default_channel)",
            )
    return parser  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        manifest = load_manifest(args.manifest)
        from release import steps  # imported late: `--help` must not need every dependency

        state_dir = args.state_dir or (REPO_ROOT / manifest.publish.state_dir)
        context = steps.Context(manifest, REPO_ROOT, args.out.resolve(), state_dir.resolve())
        return steps.dispatch(args, context)
    except ReleaseError as error:
        error_console.print(f"[bold red]error:[/] {error}", markup=True, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        error_console.print("interrupted")
        return 130
    finally:
        console.file.flush()
