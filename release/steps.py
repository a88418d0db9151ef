"""The steps behind the command line; each reads the manifest and the files under `<out>/`."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.markup import escape

from release import summary
from release.build import build_wheels
from release.cpptests import run_cpp_tests
from release.digests import sha256_file
from release.errors import GateError, PublishError, VerifyError
from release.evidence import Evidence, evidence_problems
from release.gpu import record_gpu_gates
from release.index import EmbeddedIndex
from release.interpreters import find_interpreter
from release.manifest import ChannelSpec, Manifest
from release.payload import run_payload_gate
from release.pins import project_version
from release.policy import run_policy_gate
from release.private_site import wheel_for_this_interpreter
from release.progress import VERDICT_STYLE, console
from release.publish import envelope_path_for, publish
from release.records import read_record, write_record
from release.sign import (
    build_statement,
    load_signer,
    read_and_verify_envelope,
    sign_statement,
    write_envelope,
    write_public_key,
)
from release.tuf_client import TrustedIndex
from release.tuf_metadata import TufRepository, repository_for
from release.verify import verify_from_index, verify_release

MODULES = ("activekv._engine", "activekv._fabric")


@dataclass(frozen=True)
class Context:
    manifest: Manifest
    source_dir: Path
    out_dir: Path
    state_dir: Path

    @property
    def wheels_dir(self) -> Path:
        return self.out_dir / "wheels"

    @property
    def cache_dir(self) -> Path:
        """Compiler caches, build trees and built wheels by input digest: safe to share."""
        return Path(os.environ.get("ACTIVEKV_CACHE_DIR") or self.state_dir / "cache").resolve()

    @property
    def envelope_path(self) -> Path:
        return (
            self.out_dir
            / "provenance"
            / f"{self.manifest.release.name}-{project_version()}.intoto.json"
        )

    def wheel_under_test(self, wheel: Path | None) -> Path:
        """`wheel` as given, else the built wheel this interpreter installs."""
        return wheel.resolve() if wheel else wheel_for_this_interpreter(self.built_wheels())

    def channel(self, name: str | None) -> tuple[str, ChannelSpec]:
        chosen = name or self.manifest.release.default_channel
        return chosen, self.manifest.channel(chosen)

    def built_wheels(self) -> list[Path]:
        wheels = sorted(self.wheels_dir.glob("*.whl"))
        if not wheels:
            raise GateError(
                f"{self.wheels_dir}: expected built wheels; run `python -m release build`"
            )
        return wheels

    def index(self) -> EmbeddedIndex:
        if not self.manifest.publish.embedded:
            raise PublishError(
                f'{self.manifest.path}: publish.index: only "embedded" is supported by this '
                f"version of the pipeline; got {self.manifest.publish.index!r}"
            )
        return EmbeddedIndex(self.state_dir, self.manifest.publish.username)


def _print_verdict(evidence: Evidence) -> int:
    colour = VERDICT_STYLE[evidence.verdict]
    console.print(f"[{colour}]{evidence.gate}: {evidence.verdict}[/]")
    if evidence.reason:
        console.print("  " + escape(evidence.reason.replace("; ", "\n  ")))
    return 0 if evidence.verdict == "pass" else 1


def _git_commit(source_dir: Path) -> str | None:
    result = subprocess.run(
        ["git", "-C", str(source_dir), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip() if result.returncode == 0 else None


def step_build(context: Context, only: list[str], toolchain_kind: str | None = None) -> int:
    started = datetime.now(timezone.utc)
    report = build_wheels(
        context.manifest,
        source_dir=context.source_dir,
        out_dir=context.out_dir,
        cache_dir=context.cache_dir,
        only=only,
        toolchain_kind=toolchain_kind,
    )
    write_record(context.out_dir, "build", {
        "started": started.isoformat(),
        "finished": datetime.now(timezone.utc).isoformat(),
        "source_date_epoch": report.source_date_epoch,
        "toolchain": report.toolchain,
        "wheels": [
            {"file": w.path.name, "python": w.python, "serves": list(w.serves),
             "seconds": round(w.seconds, 1), "cached": w.cached, "size": w.size,
             "sha256": sha256_file(w.path)}
            for w in report.wheels
        ],
        "skipped": [{"python": s.python, "reason": s.reason} for s in report.skipped],
    })  # fmt: skip
    # The policy is part of the build: auditwheel's verdict on exactly the wheels just made.
    wheels = [wheel.path for wheel in report.wheels]
    return _print_verdict(run_policy_gate(context.manifest, wheels, context.out_dir))


def step_gate(context: Context, gate: str, wheels: list[Path]) -> int:
    chosen = wheels or context.built_wheels()
    if gate in ("payload", "audit"):
        return _print_verdict(payload_gate(context, chosen))
    if gate == "casters":
        from release.casters import run_casters_gate

        return _print_verdict(run_casters_gate(context.manifest, chosen, context.out_dir))
    return _print_verdict(run_policy_gate(context.manifest, chosen, context.out_dir))


def payload_gate(context: Context, wheels: list[Path]) -> Evidence:
    """The payload gate; shim citations are checked against framework wheels in the cache."""
    return run_payload_gate(
        context.manifest, wheels, context.out_dir, framework_cache=context.cache_dir
    )


def step_served_path(context: Context, args: argparse.Namespace) -> int:
    from release.served_path import dispatch_line, run_served_path_gate

    wheels = [w.resolve() for w in args.wheels] or context.built_wheels()
    evidence = run_served_path_gate(
        wheels, context.out_dir, vllm_python=args.vllm_python, layers=args.layers,
        steps=args.steps,
    )  # fmt: skip
    if line := dispatch_line(evidence):
        console.print(line)
    return _print_verdict(evidence)


def step_parity(context: Context, wheel: Path | None, cells: list[str], device: str = "cpu") -> int:
    from release.parity import run_parity_gate

    chosen = context.wheel_under_test(wheel)
    console.print(f"parity: engine of {chosen.name} ({device} route) against the Python reference")
    return _print_verdict(
        run_parity_gate(context.manifest, chosen, context.out_dir, cells=cells, device=device)
    )


def _signing(context: Context, channel: str, spec: ChannelSpec) -> tuple[Any, Any]:
    sign = context.manifest.sign[spec.signing]
    public_key = sign.public_key and context.manifest.path.parent / sign.public_key  # if relative
    return load_signer(
        sign.key, channel=channel, state_dir=context.state_dir, public_key=public_key
    )


def step_sign(context: Context, channel_name: str | None) -> int:
    channel, spec = context.channel(channel_name)
    wheels = context.built_wheels()
    build = read_record(context.out_dir, "build", "python -m release build")
    signer, public_key = _signing(context, channel, spec)
    statement = build_statement(
        wheels,
        version=project_version(),
        channel=channel,
        manifest_path=context.manifest.path,
        manifest_sha256=sha256_file(context.manifest.path),
        source_commit=_git_commit(context.source_dir),
        source_date_epoch=int(build["source_date_epoch"]),
        toolchain=build["toolchain"],
        started=datetime.fromisoformat(build["started"]),
        finished=datetime.fromisoformat(build["finished"]),
    )
    envelope = context.envelope_path
    envelope.parent.mkdir(parents=True, exist_ok=True)
    write_envelope(sign_statement(statement, signer), envelope)
    public_path = envelope.parent / f"{channel}-signing-key.pub.json"
    write_public_key(public_key, public_path)
    write_record(context.out_dir, "sign", {
        "channel": channel, "envelope": str(envelope), "envelope_sha256": sha256_file(envelope),
        "keyid": public_key.keyid, "public_key": str(public_path),
        "subjects": {w.name: sha256_file(w) for w in wheels},
    })  # fmt: skip
    console.print(f"signed {len(wheels)} wheel(s): {envelope} (key {public_key.keyid[:16]})")
    return 0


def check_channel_evidence(context: Context, channel: str, spec: ChannelSpec) -> None:
    """Refuses (PublishError) unless every required gate passed on exactly these wheels."""
    digests = {wheel.name: sha256_file(wheel) for wheel in context.built_wheels()}
    problems = evidence_problems(context.out_dir, spec.requires, digests)
    if problems:
        raise PublishError(
            f"channel {channel!r} refuses to publish; nothing was uploaded:\n  "
            + "\n  ".join(problems)
        )


def check_publishable(context: Context, channel: str, spec: ChannelSpec) -> TufRepository:
    """Evidence and signature checks, all made before any index is started or contacted; the
    TUF repository to publish with (its keys loaded: stable has no generated ones)."""
    check_channel_evidence(context, channel, spec)
    _, public_key = _signing(context, channel, spec)
    read_and_verify_envelope(context.envelope_path, public_key)
    return _tuf_repository(context, channel)


def _tuf_repository(context: Context, channel: str) -> TufRepository:
    return repository_for(
        context.index().tuf_dir, context.manifest.publish.tuf_keys, channel=channel,
        state_dir=context.state_dir, manifest_dir=context.manifest.path.parent,
    )  # fmt: skip


def _publish_with(context: Context, index: EmbeddedIndex, channel: str, tuf: TufRepository) -> None:
    report = publish(
        context.built_wheels(), index, envelope=context.envelope_path,
        metadata_dir=index.provenance_dir, tuf=tuf,
    )  # fmt: skip
    console.print(escape(report.message))
    write_record(context.out_dir, "publish", {
        "channel": channel, "index": index.simple_url, "message": report.message,
        "files": [{"file": f.filename, "sha256": f.sha256, "outcome": f.outcome}
                  for f in report.files],
        "statement": str(report.envelope_path), "statement_stored": report.envelope_stored,
        "tuf": None if report.tuf is None else {
            "url": index.tuf_url,
            "trusted_root": str(TufRepository(index.tuf_dir).trusted_root_path),
            "added": list(report.tuf.added), "targets_version": report.tuf.targets_version,
            "timestamp_version": report.tuf.timestamp_version},
    })  # fmt: skip


def _verify_with(context: Context, index: EmbeddedIndex, channel: str, spec: ChannelSpec) -> None:
    _, public_key = _signing(context, channel, spec)
    version = project_version()
    stored = envelope_path_for(index.provenance_dir, context.manifest.release.name, version)
    statement = read_and_verify_envelope(stored, public_key)
    interpreters = [p for v in context.manifest.build.python if (p := find_interpreter(v))]
    # What pip downloads must also be the TUF target the publisher signed (the cache in the
    # state dir remembers the metadata seen, so a later rollback is refused).
    trusted = TrustedIndex(index.tuf_url, TufRepository(index.tuf_dir).trusted_root_path,
                           context.state_dir / "verify-tuf-cache")  # fmt: skip
    trusted.refresh()
    with console.status("installing from the index into fresh venvs"):
        checks = verify_from_index(
            simple_url=index.simple_url, project=context.manifest.release.name, version=version,
            statement=statement, interpreters=interpreters, imports=MODULES,
            workdir=context.out_dir / "verify", file_check=trusted.check_file,
        )  # fmt: skip
    for check in checks:
        console.print(f"  python {check.python_version}: {check.wheel} digest matches its TUF "
                      f"target and the signed statement; imported "
                      f"{', '.join(check.imported)}")  # fmt: skip
    write_record(context.out_dir, "verify", {
        "index": index.simple_url, "statement": str(stored),
        "checks": [{"python": c.python_version, "wheel": c.wheel, "sha256": c.sha256,
                    "digest_ok": c.digest_ok, "imported": list(c.imported)} for c in checks],
    })  # fmt: skip


def step_publish(context: Context, channel_name: str | None) -> int:
    channel, spec = context.channel(channel_name)
    tuf = check_publishable(context, channel, spec)
    with context.index() as index:
        _publish_with(context, index, channel, tuf)
    return 0


def step_verify_index(context: Context, args: argparse.Namespace) -> int:
    """`verify --index URL NAME==VERSION`: the consumer's check (release/verify.py)."""
    given = {"NAME==VERSION": args.requirement, "--root": args.root,
             "--provenance-key": args.provenance_key}  # fmt: skip
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        raise VerifyError(f"verify --index {args.index}: also give {', '.join(missing)}")
    if args.channel is not None:
        raise VerifyError("verify --index: --channel is for the publisher's own index; drop it")
    interpreters = [p.resolve() for p in args.python] or [Path(sys.executable)]
    with console.status(f"verifying {args.requirement} from {args.index}"):
        checks = verify_release(
            index_url=args.index, requirement=args.requirement, trusted_root=args.root,
            provenance_key=args.provenance_key, interpreters=interpreters,
            imports=args.imports or MODULES, workdir=context.out_dir / "verify-index",
            tuf_url=args.tuf_url, cache_dir=args.tuf_cache,
        )  # fmt: skip
    for check in checks:
        console.print(f"  python {check.python_version}: {check.wheel} matches its TUF target "
                      f"and the signed statement; imported {', '.join(check.imported)}",
                      soft_wrap=True)  # fmt: skip
    return 0


def step_verify(context: Context, channel_name: str | None) -> int:
    channel, spec = context.channel(channel_name)
    with context.index() as index:
        _verify_with(context, index, channel, spec)
    return 0


def step_ci(context: Context, check: bool) -> int:
    from release import ci_workflow

    ci = ci_workflow.ci_settings(context.manifest)
    if not check:
        path = ci_workflow.write_workflow(context.manifest, context.source_dir)
        console.print(f"wrote {path} from {context.manifest.path}")
        return 0
    committed = context.source_dir / ci.workflow
    if not committed.exists():
        raise GateError(f"{committed}: expected the workflow; run `python -m release ci`")
    problems = ci_workflow.drift(context.manifest, committed.read_text(), str(committed))
    for problem in problems:
        console.print(f"[red]{escape(problem)}[/]")
    if not problems:
        console.print(f"{committed}: matches {context.manifest.path}")
    return 1 if problems else 0


def step_report(context: Context, channel_name: str | None) -> int:
    from release.report import recorded_channel, write_report

    channel = channel_name or recorded_channel(context.out_dir, context.manifest)
    for path in write_report(context.out_dir, context.manifest, channel):
        console.print(f"wrote {path}")
    return 0


def step_serve(context: Context) -> int:
    with context.index() as index:
        console.print(f"serving {index.packages_dir} at {index.simple_url} (Ctrl-C stops)")
        console.print(summary.install_hint(index.simple_url, context.manifest.release.name))
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


def step_run(context: Context, channel_name: str | None) -> int:
    """The main job: build, gates, sign, publish, verify, then the summary."""
    channel, spec = context.channel(channel_name)
    # Records of an earlier run must not speak for this one.
    for stale in ("publish", "verify", "sign"):
        (context.out_dir / f"{stale}.json").unlink(missing_ok=True)
    shutil.rmtree(context.out_dir / "evidence", ignore_errors=True)
    console.rule(f"release {context.manifest.release.name} {project_version()} ({channel})")
    # A gate that stops the run still leaves the summary and the report of what happened.
    try:
        step_build(context, [])  # includes the policy gate
        wheels = context.built_wheels()
        console.rule("gates")
        _print_verdict(payload_gate(context, wheels))
        if "casters" in context.manifest.gates:
            step_gate(context, "casters", wheels)
        if "served-path" in context.manifest.gates:
            from release.served_path import run_served_path_gate

            _print_verdict(run_served_path_gate(wheels, context.out_dir))
        if "parity" in context.manifest.gates:
            step_parity(context, None, [])
        for evidence in record_gpu_gates(context.manifest, wheels, context.out_dir):
            _print_verdict(evidence)
        check_channel_evidence(context, channel, spec)
        console.rule("sign")
        step_sign(context, channel)
        tuf = check_publishable(context, channel, spec)
        with context.index() as index:
            console.rule(f"publish to {index.simple_url}")
            _publish_with(context, index, channel, tuf)
            console.rule("verify")
            _verify_with(context, index, channel, spec)
    finally:
        summary.print_summary(context.out_dir, context.manifest, channel)
        from release.report import write_report

        for path in write_report(context.out_dir, context.manifest, channel):
            console.print(f"report: {path}")
    return 0


def dispatch(args: argparse.Namespace, context: Context) -> int:
    command = args.command
    if command == "check-manifest":
        console.print(f"{context.manifest.path}: valid")
        return 0
    if command == "build":
        return step_build(context, args.python, args.toolchain)
    if command == "cpp-tests":
        return run_cpp_tests(
            context.manifest, source_dir=context.source_dir, cache_dir=context.cache_dir,
            sanitizer=args.sanitizer,
        )  # fmt: skip
    if command == "bench":
        from release.bench import run_bench

        wheel = context.wheel_under_test(args.wheel)
        write_record(
            context.out_dir, "bench", run_bench(wheel, context.out_dir, blocks=args.blocks)
        )
        return 0
    if command == "reproduce":
        from release.reproduce import run_reproduce_gate

        return _print_verdict(run_reproduce_gate(
            context.manifest, source_dir=context.source_dir, out_dir=context.out_dir,
            cache_dir=context.cache_dir, only=args.python,
        ))  # fmt: skip
    if command == "record-build":
        from release.record_build import record_build

        wheels = context.built_wheels()
        write_record(context.out_dir, "build", record_build(context.manifest, context.source_dir,
                                                             wheels))  # fmt: skip
        console.print(f"recorded the build of {len(wheels)} wheel(s) in {context.out_dir}")
        return 0
    if command == "gpu-staging":
        from release.gpu_staging import run_gpu_staging

        wheel = context.wheel_under_test(args.wheel)
        run_gpu_staging(
            context.manifest, source_dir=context.source_dir, cache_dir=context.cache_dir,
            out_dir=context.out_dir, wheel=wheel,
        )  # fmt: skip
        return 0
    if command == "parity":
        return step_parity(context, args.wheel, args.cell, args.device)
    if command in ("payload", "policy", "audit", "casters"):
        return step_gate(context, command, [w.resolve() for w in args.wheels])
    if command == "served-path":
        return step_served_path(context, args)
    if command == "verify" and args.index is not None:
        return step_verify_index(context, args)
    if command == "verify" and args.requirement is not None:
        raise VerifyError(f"verify {args.requirement}: a requirement needs --index URL")
    steps = {"sign": step_sign, "publish": step_publish, "verify": step_verify, "run": step_run}
    if command in steps:
        return steps[command](context, args.channel)
    if command == "serve":
        return step_serve(context)
    if command == "ci":
        return step_ci(context, check=args.check)
    if command == "report":
        return step_report(context, args.channel)
    raise GateError(f"{command}: unknown step")
