"""Command line of the pipeline: one subcommand per step, plus `run` for the whole release."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.text import Text

from release.cli_options import (
    DEFAULT_OUT,
    GATE_COMMANDS,
    PUBLISH_TARGET_OPTIONS,
    parser,
)
from release.context import Context
from release.errors import ManifestError, ReleaseError, VerifyError
from release.gates import options as gate_options
from release.gates.options import GateOptions
from release.manifest import Manifest, load_manifest
from release.util.paths import REPO_ROOT
from release.util.pins import project_version
from release.util.progress import console, error_console
from release.wheelset import WheelSet


def _with_publish_target(manifest: Manifest, args: argparse.Namespace) -> Manifest:
    """The manifest with the [publish] keys given as options (a folder made absolute, since it
    is given relative to where the command runs, not to the manifest)."""
    given = {key: value for key in PUBLISH_TARGET_OPTIONS
             if (value := getattr(args, f"publish_{key}", None)) is not None}  # fmt: skip
    if "tuf_dir" in given and given["tuf_dir"].strip():  # empty: refused as the manifest key
        given["tuf_dir"] = str(Path(given["tuf_dir"]).absolute())
    return manifest.with_publish(**given) if given else manifest


def _gate_options(args: argparse.Namespace) -> GateOptions:
    """What a gate's command line gave (`--cell`, `--vllm-python`, ...: gates/options.py)."""
    return gate_options.given(vars(args))


def _dispatch(args: argparse.Namespace, context: Context) -> int:
    """One step per command; the gates go through the registry (release/gates/registry.py)."""
    from release import steps

    command = args.command
    if command == "check-manifest":
        # The version is part of the release's description: refused here, not first when used.
        project_version()
        console.print(f"{context.manifest.path}: valid")
        return 0
    if command in GATE_COMMANDS:
        gate = GATE_COMMANDS[command]
        if command == "parity" and args.device == "cuda":
            gate = "gpu-parity"
        named = getattr(args, "wheel", None) or getattr(args, "wheels", [])  # parity: --wheel
        flag = "--wheel" if getattr(args, "wheel", None) else "wheel argument"
        # The reproducible gate builds its own wheels from the sources.
        wheels = WheelSet(()) if gate == "reproducible" else context.wheels_given(named, flag)
        return steps.step_gate(context, gate, wheels, _gate_options(args))
    if command == "gpu-gates":
        return steps.step_gpu_gates(context, context.wheels_given(args.wheel), _gate_options(args))
    if command == "build":
        return steps.step_build(context, args.python, args.toolchain, fresh=args.fresh)
    if command == "cpp-tests":
        from release.builder.cpptests import run_cpp_tests

        return run_cpp_tests(
            context.manifest, source_dir=context.source_dir, cache_dir=context.cache_dir,
            sanitizer=args.sanitizer,
        )  # fmt: skip
    if command == "keygen":  # a GPU runner makes its key here: no index or TUF stack
        from release.trust.keys import step_keygen

        return step_keygen(args.channel, args.runner, args.directory, pin=args.pin,
                           manifest_path=context.manifest.path)  # fmt: skip
    if command in ("sign", "publish", "verify", "serve", "rebuild"):  # the trust stack
        from release.trust import consumer_steps
        from release.trust import steps as trust

        if command == "rebuild":
            return consumer_steps.step_rebuild(context, args)

        if command == "verify" and args.index is not None:
            return consumer_steps.step_verify_index(context, args)
        if command == "verify" and args.requirement is not None:
            raise VerifyError(f"verify {args.requirement}: a requirement needs --index URL")
        if command == "serve":
            return trust.step_serve(context, port=args.port)
        by_channel = {"sign": trust.step_sign, "publish": trust.step_publish,
                      "verify": trust.step_verify}  # fmt: skip
        return by_channel[command](context, args.channel)
    if command == "run":
        return steps.step_run(context, args.channel, fresh=args.fresh)
    if command == "report":
        return steps.step_report(context, args.channel)
    others: dict[str, Callable[[], int]] = {
        "ci": lambda: _ci(context, args),
        "record-build": lambda: steps.step_record_build(context),
        "bench": lambda: steps.step_bench(context, args.wheel, args.blocks),
        "gpu-staging": lambda: steps.step_gpu_staging(context, args.wheel),
    }
    return others[command]()


def _ci(context: Context, args: argparse.Namespace) -> int:
    """`ci`, `ci --check`, or `ci --replay ...` (the replay parses its own options)."""
    from release import steps

    if args.replay is None:
        return steps.step_ci(context, check=args.check)
    if args.check:
        raise ReleaseError("ci: --check and --replay: expected one of them; got both")
    from release.ci.replay import main as replay

    return replay(args.replay, prog="python -m release ci --replay")


def _manifest_state_dir(manifest: Manifest) -> Path:
    """The manifest's state directory, which must stay inside the checkout (a symlink leading
    out of it would put keys and credentials where the manifest does not say)."""
    state_dir = REPO_ROOT / manifest.publish.state_dir
    if not state_dir.resolve().is_relative_to(REPO_ROOT.resolve()):
        raise ManifestError(f"{manifest.path}: publish.state_dir: expected a folder inside the "
                            f"checkout; got {state_dir}, which leads to "
                            f"{state_dir.resolve()}")  # fmt: skip
    return state_dir


def _checked_state_dir(state_dir: Path, out_dir: Path, named: str) -> Path:
    """Where keys and credentials will be made: never in or around the outputs (they are handed
    on), and inside the checkout only where git ignores it (snapshots of the checkout, as the
    reproducible gate takes, copy what git does not ignore)."""
    state, out = state_dir.resolve(), out_dir.resolve()
    if state == out or state.is_relative_to(out) or out.is_relative_to(state):
        raise ReleaseError(f"{named}: expected a folder apart from the outputs ({out}), which "
                           f"are handed on; got {state}")  # fmt: skip
    root = REPO_ROOT.resolve()
    if state == root:
        raise ReleaseError(f"{named}: expected a folder of its own; got the checkout {state}")
    if not state.is_relative_to(root):
        return state
    if ".git" in state.relative_to(root).parts:
        raise ReleaseError(f"{named}: expected a folder outside .git; got {state}")
    # The trailing "/" says it is a folder: a pattern like "/.activekv/" matches only folders,
    # and the state folder may not exist yet (a fresh clone).
    ignored = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", f"{state}/"],
                             capture_output=True)  # fmt: skip
    if ignored.returncode == 1:  # 0: ignored; 128: no git or no repository, nothing to copy
        raise ReleaseError(f"{named}: expected a folder git ignores (.gitignore): keys and "
                           f"credentials are made there; got {state}")  # fmt: skip
    return state


def _context(args: argparse.Namespace) -> Context:
    """The Context of the options the command takes; an option it does not take has its default
    (a step that reads no state directory gets the manifest's, checked to stay in the checkout,
    which is part of the manifest being valid, but not against the outputs: it is not used)."""
    manifest = _with_publish_target(load_manifest(args.manifest), args)
    out_dir = getattr(args, "out", DEFAULT_OUT).resolve()
    given = vars(args)
    if "state_dir" not in given:
        state_dir = _manifest_state_dir(manifest)
    elif args.state_dir is not None:
        state_dir = _checked_state_dir(args.state_dir, out_dir, "--state-dir")
    else:
        state_dir = _checked_state_dir(_manifest_state_dir(manifest), out_dir,
                                       f"{manifest.path}: publish.state_dir")  # fmt: skip
    key_dir, attest_key = given.get("key_dir"), given.get("attest_key")
    return Context(
        manifest, REPO_ROOT, out_dir, state_dir, channel_name=given.get("channel"),
        key_dir=key_dir and key_dir.resolve(), attest_key=attest_key and attest_key.resolve(),
    )  # fmt: skip


def _failed(message: str) -> int:
    # Printed as it is: a bracketed word ("[gates.*]") is text, not markup.
    error_console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _dispatch(args, _context(args))
    except ReleaseError as error:
        return _failed(str(error))
    except OSError as error:  # a file or folder the step could not make, read or replace
        return _failed(f"{error.filename}: {error.strerror}" if error.filename else str(error))
    except KeyboardInterrupt:
        error_console.print("interrupted")
        return 130
    finally:
        console.file.flush()
