"""The steps behind the command line: build, the gates (a loop over the registry), sign, publish,
verify, and `run`, which is all of them in order. Each reads the manifest and the records under
`<out>/` (release.records) and writes its own.

The build and the signing and index stacks (release.build, release.trust) are imported by the steps
that use them, not here: a GPU runner judging its gates has neither installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from release import records
from release.context import Context
from release.errors import GateError, PublishError
from release.evidence import Evidence, evidence_problems
from release.gates.contract import GateInputs, GateOptions
from release.gates.gpu_runner import detect_gpu
from release.gates.registry import run_gate
from release.manifest import ChannelSpec
from release.records import BuildRecord, BuiltWheelEntry, SkippedEntry
from release.util.pins import project_version
from release.util.progress import VERDICT_STYLE, console
from release.wheelset import Wheel, WheelSet

if TYPE_CHECKING:
    from release.trust.index import EmbeddedIndex
    from release.trust.tuf_metadata import TufRepository

MODULES = ("activekv._engine", "activekv._fabric")


def print_verdict(evidence: Evidence) -> int:
    colour = VERDICT_STYLE[evidence.verdict]
    console.print(f"[{colour}]{evidence.gate}: {evidence.verdict}[/]")
    if evidence.reason:
        console.print("  " + escape(evidence.reason.replace("; ", "\n  ")))
    return 0 if evidence.verdict == "pass" else 1


def _git_commit(source_dir: Any) -> str | None:
    result = subprocess.run(
        ["git", "-C", str(source_dir), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip() if result.returncode == 0 else None


# --- build and gates ---


def build(context: Context, only: list[str], toolchain_kind: str | None = None) -> WheelSet:
    """Builds the wheels and writes the build record; each wheel is hashed here, once."""
    from release.build.wheels import build_wheels

    started = datetime.now(timezone.utc)
    report = build_wheels(
        context.manifest,
        source_dir=context.source_dir,
        out_dir=context.out_dir,
        cache_dir=context.cache_dir,
        only=only,
        toolchain_kind=toolchain_kind,
    )
    wheels = WheelSet.from_files(context.manifest, [w.path for w in report.wheels])
    entries = []
    for built, wheel in zip(report.wheels, wheels, strict=True):
        entries.append(BuiltWheelEntry(
            file=wheel.name, python=wheel.python, serves=wheel.serves,
            seconds=round(built.seconds, 1), cached=built.cached, size=wheel.size,
            sha256=wheel.sha256,
        ))  # fmt: skip
    records.write(context.out_dir, BuildRecord(
        started=started, finished=datetime.now(timezone.utc),
        source_date_epoch=report.source_date_epoch, toolchain=report.toolchain,
        wheels=tuple(entries),
        skipped=tuple(SkippedEntry(python=s.python, reason=s.reason) for s in report.skipped),
    ))  # fmt: skip
    return wheels


def step_build(context: Context, only: list[str], toolchain_kind: str | None = None) -> int:
    """`build`: the wheels, then the policy gate on exactly them (the policy is part of the
    build: auditwheel's verdict on the wheels just made)."""
    wheels = build(context, only, toolchain_kind)
    return print_verdict(run_gate("policy", gate_inputs(context, wheels)))


def gate_inputs(
    context: Context, wheels: WheelSet, options: GateOptions | None = None, gpu: str | None = None
) -> GateInputs:
    return GateInputs(
        manifest=context.manifest, wheels=wheels, out_dir=context.out_dir,
        source_dir=context.source_dir, cache_dir=context.cache_dir,
        gpu=gpu if gpu is not None else detect_gpu(), options=options or GateOptions(),
    )  # fmt: skip


def step_gate(context: Context, name: str, wheels: WheelSet, options: GateOptions) -> int:
    """One gate alone (`python -m release <gate>`), declared in the manifest or not."""
    return print_verdict(run_gate(name, gate_inputs(context, wheels, options)))


def step_gpu_gates(context: Context, wheels: WheelSet) -> int:
    """Every GPU gate of the manifest on `wheels`: 0 on pass or "not run", 1 on a failure."""
    inputs = gate_inputs(context, wheels)
    verdicts = [
        run_gate(name, inputs)
        for name, spec in context.manifest.gates.items()
        if spec.runner == "gpu"
    ]
    failed = [print_verdict(evidence) for evidence in verdicts if evidence.verdict != "not-run"]
    for evidence in verdicts:
        if evidence.verdict == "not-run":
            print_verdict(evidence)
    return 1 if any(failed) else 0


def run_gates(context: Context, wheels: WheelSet) -> None:
    """Every gate the manifest declares, in its order, each through the registry."""
    inputs = gate_inputs(context, wheels)
    for name in context.manifest.gates:
        print_verdict(run_gate(name, inputs))


# --- sign, publish, verify ---


def _signing(context: Context, channel: str, spec: ChannelSpec) -> tuple[Any, Any]:
    from release.trust.sign import load_signer

    sign = context.manifest.sign[spec.signing]
    public_key = sign.public_key and context.manifest.path.parent / sign.public_key  # if relative
    return load_signer(
        sign.key, channel=channel, state_dir=context.state_dir, public_key=public_key
    )


def _sign(context: Context, channel: str, wheels: WheelSet, signer: Any, public_key: Any) -> None:
    from release.trust.sign import (
        build_statement,
        sign_statement,
        write_envelope,
        write_public_key,
    )
    from release.util.digests import sha256_file

    build_record = records.read(context.out_dir, BuildRecord)
    statement = build_statement(
        wheels.paths,
        version=project_version(),
        channel=channel,
        manifest_path=context.manifest.path,
        manifest_sha256=sha256_file(context.manifest.path),
        source_commit=_git_commit(context.source_dir),
        source_date_epoch=build_record.source_date_epoch,
        toolchain=build_record.toolchain,
        started=build_record.started,
        finished=build_record.finished,
        digests=wheels.digests,
    )
    envelope = context.envelope_path
    envelope.parent.mkdir(parents=True, exist_ok=True)
    write_envelope(sign_statement(statement, signer), envelope)
    public_path = envelope.parent / f"{channel}-signing-key.pub.json"
    write_public_key(public_key, public_path)
    records.write(context.out_dir, records.SignRecord(
        channel=channel, envelope=str(envelope), envelope_sha256=sha256_file(envelope),
        keyid=public_key.keyid, public_key=str(public_path), subjects=wheels.digests,
    ))  # fmt: skip
    console.print(f"signed {len(wheels)} wheel(s): {envelope} (key {public_key.keyid[:16]})")


def step_sign(context: Context, channel_name: str | None) -> int:
    channel, spec = context.channel(channel_name)
    signer, public_key = _signing(context, channel, spec)
    _sign(context, channel, context.built_wheels(), signer, public_key)
    return 0


def check_channel_evidence(
    context: Context, channel: str, spec: ChannelSpec, digests: dict[str, str]
) -> None:
    """Refuses (PublishError) unless every required gate passed on exactly these digests."""
    problems = evidence_problems(context.out_dir, spec.requires, digests)
    if problems:
        raise PublishError(
            f"channel {channel!r} refuses to publish; nothing was uploaded:\n  "
            + "\n  ".join(problems)
        )


def _index(context: Context) -> EmbeddedIndex:
    from release.trust.index import EmbeddedIndex

    if not context.manifest.publish.embedded:
        raise PublishError(
            f'{context.manifest.path}: publish.index: only "embedded" is supported by this '
            f"version of the pipeline; got {context.manifest.publish.index!r}"
        )
    return EmbeddedIndex(context.state_dir, context.manifest.publish.username)


def publishable_wheels(context: Context, channel: str, spec: ChannelSpec) -> WheelSet:
    """The built wheels as they lie now, hashed again (publish hands these bytes on), once every
    gate the channel requires passed on exactly their digests; else PublishError."""
    wheels = WheelSet.from_files(context.manifest, context.wheel_files())
    check_channel_evidence(context, channel, spec, wheels.digests)
    return wheels


def open_publish(context: Context, channel: str, public_key: Any) -> TufRepository:
    """The signature and key checks, made before any index is started or contacted; the TUF
    repository to publish with (its keys loaded: stable has no generated ones)."""
    from release.trust.sign import read_and_verify_envelope
    from release.trust.tuf_metadata import repository_for

    read_and_verify_envelope(context.envelope_path, public_key)
    return repository_for(
        _index(context).tuf_dir, context.manifest.publish.tuf_keys, channel=channel,
        state_dir=context.state_dir, manifest_dir=context.manifest.path.parent,
    )  # fmt: skip


def _publish_with(
    context: Context, index: EmbeddedIndex, channel: str, wheels: WheelSet, tuf: TufRepository
) -> None:
    from release.trust.publish import publish
    from release.trust.tuf_metadata import TufRepository

    report = publish(
        wheels.paths, index, envelope=context.envelope_path,
        metadata_dir=index.provenance_dir, tuf=tuf, digests=wheels.digests,
    )  # fmt: skip
    console.print(escape(report.message))
    records.write(context.out_dir, records.PublishRecord(
        channel=channel, index=index.simple_url, message=report.message,
        files=tuple(records.PublishedFile(file=f.filename, sha256=f.sha256, outcome=f.outcome)
                    for f in report.files),
        statement=str(report.envelope_path), statement_stored=report.envelope_stored,
        tuf=None if report.tuf is None else records.TufPublished(
            url=index.tuf_url,
            trusted_root=str(TufRepository(index.tuf_dir).trusted_root_path),
            added=tuple(report.tuf.added), targets_version=report.tuf.targets_version,
            timestamp_version=report.tuf.timestamp_version),
    ))  # fmt: skip


def _verify_with(context: Context, index: EmbeddedIndex, public_key: Any) -> None:
    from release.trust.publish import envelope_path_for
    from release.trust.sign import read_and_verify_envelope
    from release.trust.tuf_client import TrustedIndex
    from release.trust.tuf_metadata import TufRepository
    from release.trust.verify import verify_from_index
    from release.util.interpreters import find_interpreter

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
    records.write(context.out_dir, records.VerifyRecord(
        index=index.simple_url, statement=str(stored),
        checks=tuple(records.VerifyCheck(python=c.python_version, wheel=c.wheel, sha256=c.sha256,
                                         digest_ok=c.digest_ok, imported=tuple(c.imported))
                     for c in checks),
    ))  # fmt: skip


def step_publish(context: Context, channel_name: str | None) -> int:
    channel, spec = context.channel(channel_name)
    wheels = publishable_wheels(context, channel, spec)
    _, public_key = _signing(context, channel, spec)
    tuf = open_publish(context, channel, public_key)
    with _index(context) as index:
        _publish_with(context, index, channel, wheels, tuf)
    return 0


def step_verify(context: Context, channel_name: str | None) -> int:
    channel, spec = context.channel(channel_name)
    _, public_key = _signing(context, channel, spec)
    with _index(context) as index:
        _verify_with(context, index, public_key)
    return 0


def step_serve(context: Context) -> int:
    import time

    from release.report.terminal import install_hint

    with _index(context) as index:
        console.print(f"serving {index.packages_dir} at {index.simple_url} (Ctrl-C stops)")
        console.print(install_hint(index.simple_url, context.manifest.release.name))
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


# --- the whole release ---


def step_run(context: Context, channel_name: str | None) -> int:
    """The main job: build, every declared gate, sign, publish, verify, then the summary."""
    from release.report.document import write_report
    from release.report.terminal import print_summary

    channel, spec = context.channel(channel_name)
    # Records of an earlier run must not speak for this one.
    records.discard(context.out_dir, records.PublishRecord, records.VerifyRecord,
                    records.SignRecord)  # fmt: skip
    shutil.rmtree(context.out_dir / "evidence", ignore_errors=True)
    console.rule(f"release {context.manifest.release.name} {project_version()} ({channel})")
    # A gate that stops the run still leaves the summary and the report of what happened.
    try:
        wheels = build(context, [])
        console.rule("gates")
        run_gates(context, wheels)
        published = publishable_wheels(context, channel, spec)
        console.rule("sign")
        signer, public_key = _signing(context, channel, spec)
        _sign(context, channel, published, signer, public_key)
        tuf = open_publish(context, channel, public_key)
        with _index(context) as index:
            console.rule(f"publish to {index.simple_url}")
            _publish_with(context, index, channel, published, tuf)
            console.rule("verify")
            _verify_with(context, index, public_key)
    finally:
        print_summary(context.out_dir, context.manifest, channel)
        for path in write_report(context.out_dir, context.manifest, channel):
            console.print(f"report: {path}")
    return 0


# --- the consumer's check, reports, CI, benchmarks ---


def step_verify_index(context: Context, args: Any) -> int:
    """`verify --index URL NAME==VERSION`: the consumer's check (release/trust/verify.py)."""
    from release.errors import VerifyError
    from release.trust.verify import verify_release

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


def step_record_build(context: Context) -> int:
    from release.build.record_build import record_build

    paths = context.wheel_files()
    records.write(context.out_dir, record_build(WheelSet.from_files(context.manifest, paths),
                                                context.source_dir))  # fmt: skip
    console.print(f"recorded the build of {len(paths)} wheel(s) in {context.out_dir}")
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
    from release.report.document import write_report
    from release.report.loader import recorded_channel

    channel = channel_name or recorded_channel(context.out_dir, context.manifest)
    for path in write_report(context.out_dir, context.manifest, channel):
        console.print(f"wrote {path}")
    return 0


def _wheel_under_test(context: Context, wheel: Path | None) -> Wheel:
    """`--wheel` as given, else the built wheel the running interpreter installs."""
    if wheel is not None:
        (given,) = context.wheels_given([wheel])
        return given
    return context.built_wheels().for_running_interpreter()


def step_bench(context: Context, wheel: Path | None, blocks: int) -> int:
    from release.bench.bookkeeping import run_bench

    chosen = _wheel_under_test(context, wheel)
    records.write_measurement(context.out_dir, "bench",
                              run_bench(chosen.path, context.out_dir, blocks=blocks))  # fmt: skip
    return 0


def step_gpu_staging(context: Context, wheel: Path | None) -> int:
    from release.bench.gpu_staging import run_gpu_staging

    chosen = _wheel_under_test(context, wheel)
    run_gpu_staging(
        context.manifest, source_dir=context.source_dir, cache_dir=context.cache_dir,
        out_dir=context.out_dir, wheel=chosen,
    )  # fmt: skip
    return 0
