"""The trust steps of the command line: sign the provenance, publish to the index, verify what
it serves (as the publisher, and as a consumer with `verify --index`), serve the embedded index.

May import: everything of ``release.trust``, ``release.context``, ``release.evidence``,
``release.records``, ``release.wheelset`` and ``release.util``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.markup import escape

from release import records
from release.context import Context
from release.errors import PublishError, VerifyError
from release.evidence import evidence_problems
from release.manifest import ChannelSpec
from release.records import BuildRecord
from release.trust.index import EmbeddedIndex, install_hint
from release.trust.publish import envelope_path_for, publish
from release.trust.sign import (
    build_statement,
    load_signer,
    read_and_verify_envelope,
    sign_statement,
    write_envelope,
    write_public_key,
)
from release.trust.tuf_client import TrustedIndex
from release.trust.tuf_metadata import TufRepository, repository_for
from release.trust.verify import verify_from_index, verify_release
from release.util.digests import sha256_file
from release.util.interpreters import find_interpreter
from release.util.pins import project_version
from release.util.progress import console
from release.wheelset import WheelSet

MODULES = ("activekv._engine", "activekv._fabric")


def _git_commit(source_dir: Path) -> str | None:
    result = subprocess.run(
        ["git", "-C", str(source_dir), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip() if result.returncode == 0 else None


def _signing(context: Context, channel: str, spec: ChannelSpec) -> tuple[Any, Any]:
    sign = context.manifest.sign[spec.signing]
    public_key = sign.public_key and context.manifest.path.parent / sign.public_key  # if relative
    return load_signer(
        sign.key, channel=channel, state_dir=context.state_dir, public_key=public_key
    )


def _sign(context: Context, channel: str, wheels: WheelSet, signer: Any, public_key: Any) -> None:
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

    read_and_verify_envelope(context.envelope_path, public_key)
    return repository_for(
        _index(context).tuf_dir, context.manifest.publish.tuf_keys, channel=channel,
        state_dir=context.state_dir, manifest_dir=context.manifest.path.parent,
    )  # fmt: skip


def _publish_with(
    context: Context, index: EmbeddedIndex, channel: str, wheels: WheelSet, tuf: TufRepository
) -> None:
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
    with _index(context) as index:
        console.print(f"serving {index.packages_dir} at {index.simple_url} (Ctrl-C stops)")
        console.print(install_hint(index.simple_url, context.manifest.release.name))
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


def step_verify_index(context: Context, args: Any) -> int:
    """`verify --index URL NAME==VERSION`: the consumer's check (release/trust/verify.py)."""

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


def sign_publish_verify(context: Context, channel: str, spec: ChannelSpec) -> None:
    """The trust half of `run`, after the gates: refuse unless the channel's evidence names
    exactly the wheels as they lie now; sign them; publish; verify from the index."""
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
