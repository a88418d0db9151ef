"""The steps behind the command line; each reads the manifest and files under `<out>/`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from release.build import build_wheels
from release.errors import GateError
from release.evidence import Evidence
from release.manifest import Manifest
from release.payload import run_payload_gate
from release.policy import run_policy_gate
from release.progress import console


@dataclass(frozen=True)
class Context:
    manifest: Manifest
    source_dir: Path
    out_dir: Path
    state_dir: Path

    @property
    def wheels_dir(self) -> Path:
        return self.out_dir / "wheels"

    def built_wheels(self) -> list[Path]:
        wheels = sorted(self.wheels_dir.glob("*.whl"))
        if not wheels:
            raise GateError(
                f"{self.wheels_dir}: expected built wheels; run `python -m release build`"
            )
        return wheels


def _print_verdict(evidence: Evidence) -> int:
    colour = {"pass": "green", "fail": "red", "not-run": "yellow"}[evidence.verdict]
    console.print(f"[{colour}]{evidence.gate}: {evidence.verdict}[/]")
    if evidence.reason:
        console.print("  " + escape(evidence.reason.replace("; ", "\n  ")))
    return 0 if evidence.verdict == "pass" else 1


def step_check_manifest(context: Context) -> int:
    console.print(f"{context.manifest.path}: valid")
    return 0


def step_build(context: Context, only: list[str]) -> int:
    build_wheels(
        context.manifest,
        source_dir=context.source_dir,
        out_dir=context.out_dir,
        state_dir=context.state_dir,
        only=only,
    )
    return 0


def step_gate(context: Context, gate: str, wheels: list[Path]) -> int:
    chosen = wheels or context.built_wheels()
    runner = run_payload_gate if gate == "payload" else run_policy_gate
    return _print_verdict(runner(context.manifest, chosen, context.out_dir))


def dispatch(args: argparse.Namespace, context: Context) -> int:
    command = args.command
    if command == "check-manifest":
        return step_check_manifest(context)
    if command == "build":
        return step_build(context, args.python)
    if command in ("payload", "policy"):
        return step_gate(context, command, [w.resolve() for w in args.wheels])
    raise GateError(f"{command}: not available yet")
