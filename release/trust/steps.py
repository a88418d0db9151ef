"""The publisher's trust steps of the command line: sign the provenance, publish to the
manifest's index, verify what it serves, serve the embedded index, and the trust half of `run`
(those three in turn). The consumer's steps (`verify --index`, `rebuild`) are
release/trust/consumer_steps.py.

May import: everything of ``release.trust``, ``release.context``, ``release.evidence``,
``release.records``, ``release.wheelset`` and ``release.util``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape
from tuf.api.metadata import Metadata, Root

from release import catalogue, records
from release.context import Context
from release.errors import PublishError, SigningError, VerifyError, WriteError
from release.manifest import SIGNING_KEY_ATTESTER, ChannelSpec, Manifest
from release.records import BuildRecord
from release.source_state import checked_built_from, refuse_dirty, source_state
from release.statement import SignedStatement
from release.trust.attestation import (
    Attestation,
    GateKeys,
    choose,
    provenance_entry,
    published_name,
)
from release.trust.consumer_steps import MODULES, print_served
from release.trust.index import EmbeddedIndex, install_hint
from release.trust.keys import SignerAndKey, channel_signer, tuf_keys_spec
from release.trust.pins import ChannelPins, channel_pins, operator_signed
from release.trust.publish import publish
from release.trust.remote_index import RemoteIndex, find_credentials
from release.trust.reuse import signed_or_reused, verified_or_reused
from release.trust.sign import (
    Key,
    build_statement,
    file_key_path,
    is_file_key,
    load_public_key,
    read_and_verify,
    signing_key_name,
    write_public_key,
)
from release.trust.statement_store import envelope_path_for
from release.trust.tuf_client import TrustedIndex
from release.trust.tuf_metadata import ROLES, TufRepository, repository_for
from release.trust.verify import verify_attestations
from release.util.digests import sha256_file
from release.util.interpreters import find_interpreter
from release.util.pins import project_version
from release.util.progress import console
from release.util.reuse import ReuseStore
from release.wheelset import Sdist, WheelSet


def _attester_keys(
    context: Context, channel: str, spec: ChannelSpec, signing_key: Key
) -> dict[str, dict[str, Key]]:
    """Per runner class, keyid -> key of the attesters the manifest lists for `channel`."""
    keys: dict[str, dict[str, Key]] = {}
    for runner, attesters in spec.attesters.items():
        keys[runner] = {}
        for index, attester in enumerate(attesters):
            where = f"release.channels.{channel}.attesters.{runner}[{index}]"
            if attester == SIGNING_KEY_ATTESTER:
                key = signing_key
            else:
                path = context.manifest.path.parent / attester
                try:
                    key = load_public_key(path)
                except SigningError as error:
                    raise PublishError(f"{context.manifest.path}: {where}: expected a public key "
                                       f"file beside the manifest; {error}") from None  # fmt: skip
            keys[runner][key.keyid] = key
    return keys


def channel_attestations(
    context: Context, channel: str, spec: ChannelSpec, digests: dict[str, str], signing_key: Key
) -> list[tuple[Attestation, str]]:
    """For each gate `channel` requires, the signed attestation that it passed on exactly
    `digests`, with its runner class; PublishError naming each gate without one (and each file
    that was altered), before anything is uploaded."""
    keys = _attester_keys(context, channel, spec, signing_key)
    gates = []
    for gate in spec.requires:
        runner = catalogue.runner_of(gate)
        listed = f"a key of {context.manifest.path} release.channels.{channel}.attesters.{runner}"
        gates.append(GateKeys(gate, keys.get(runner, {}), listed))
    folders = [context.out_dir / "evidence"]
    folders += [context.source_dir / folder for folder in spec.attestations]
    try:
        chosen, problems = choose(gates, folders, digests)
    except SigningError as error:
        raise PublishError(f"channel {channel!r} refuses to publish; nothing was uploaded: "
                           f"an attestation cannot be trusted: {error}") from None  # fmt: skip
    if problems:
        raise PublishError(
            f"channel {channel!r} refuses to publish; nothing was uploaded:\n  "
            + "\n  ".join(problems)
        )
    return [(chosen[gate], catalogue.runner_of(gate)) for gate in spec.requires]


def _attested(
    context: Context,
    channel: str,
    spec: ChannelSpec,
    public_key: Key,
    record: BuildRecord | None,
) -> tuple[WheelSet, list[tuple[Attestation, str]]]:
    """The built wheels and the build's sdist (of `record`, the build's record where there is
    one) as they lie now, hashed again (publish hands these bytes on), and the signed
    attestations that every gate the channel requires passed on exactly the wheels' digests,
    one of them (the payload gate's) naming the sdist's; else PublishError."""
    built = WheelSet.from_files(context.manifest, context.wheel_files())
    sdist_dir = context.out_dir / records.SDIST_FOLDER
    sdist = None if record is None else Sdist.of_build(record, sdist_dir, check=False)
    wheels = WheelSet(built.wheels, sdist)
    attestations = channel_attestations(context, channel, spec, wheels.digests, public_key)
    if sdist is not None:
        _check_sdist_judged(sdist, channel, spec, attestations)
    return wheels, attestations


def _check_sdist_judged(
    sdist: Sdist, channel: str, spec: ChannelSpec, attestations: list[tuple[Attestation, str]]
) -> None:
    """PublishError unless an attestation the channel takes judged exactly this sdist (its
    figures name it with its sha256: the payload gate's, which passed, so on all of it)."""
    if any(a.evidence.judged_sdist == sdist.digests for a, _ in attestations):
        return
    named = [f"{a.evidence.gate} judged {name} sha256 {digest}" for a, _ in attestations
             for name, digest in a.evidence.judged_sdist.items()]  # fmt: skip
    got = "; ".join(named) if named else f"none of {', '.join(spec.requires)} judged an sdist"
    raise PublishError(f"channel {channel!r} refuses to publish; nothing was uploaded: the sdist "
                       f"{sdist.path} (sha256 {sdist.sha256}): expected a passing attestation "
                       "of a gate the channel requires that judged it (the payload gate judges "
                       f"the build's sdist; run it again); got {got}")  # fmt: skip


def _sign(
    context: Context,
    channel: str,
    spec: ChannelSpec,
    signer: Any,
    public_key: Key,
    reuse: ReuseStore | None = None,
) -> tuple[WheelSet, list[tuple[Attestation, str]], SignedStatement]:
    """Signs the provenance of the wheels, naming the attestations it rests on (the envelope of
    a statement of the same content signed before by the same key is taken from `reuse`); the
    envelope as written, read and verified once, is passed on to publish and verify."""
    build_record = records.read(context.out_dir, BuildRecord)
    source = checked_built_from(build_record.source, context.source_dir,
                        records.record_path(context.out_dir, BuildRecord))  # fmt: skip
    if operator_signed(context.manifest, spec):
        refuse_dirty(source, channel, context.source_dir)
    wheels, attestations = _attested(context, channel, spec, public_key, build_record)
    statement = build_statement(
        wheels.paths,
        sdist=wheels.sdist.path if wheels.sdist else None,
        version=project_version(),
        channel=channel,
        manifest_path=context.manifest.path,
        manifest_sha256=sha256_file(context.manifest.path),
        source_commit=source.commit,
        source_annotations=source.annotations(),
        source_date_epoch=build_record.source_date_epoch,
        toolchain=build_record.toolchain,
        started=build_record.started,
        finished=build_record.finished,
        digests=wheels.release_digests,
        gates=spec.requires,
        attestations=[provenance_entry(a, runner) for a, runner in attestations],
    )
    envelope = context.envelope_path
    public_path = envelope.parent / f"{signing_key_name(channel)}.pub.json"
    try:  # a full disk: one line naming the step and the file
        envelope.parent.mkdir(parents=True, exist_ok=True)
        reused = signed_or_reused(statement, channel, signer, public_key, envelope, reuse)
        signed = read_and_verify(envelope, public_key)
        write_public_key(public_key, public_path)
        records.write(context.out_dir, records.SignRecord(
            channel=channel, envelope=str(envelope), envelope_sha256=signed.sha256,
            keyid=public_key.keyid, public_key=str(public_path), subjects=wheels.release_digests,
            attestations={a.evidence.gate: str(a.path) for a, _ in attestations},
            source_commit=source.commit, uncommitted=source.changed,
            uncommitted_sha256=source.change_sha256,
        ))  # fmt: skip
    except WriteError as error:
        raise SigningError(f"sign: {error}; the release is not signed") from None
    sdist = f", the sdist {wheels.sdist.name}" if wheels.sdist else ""
    how = f"; {reused}" if reused else ""
    console.print(f"signed {len(wheels)} wheel(s){sdist} and the {len(attestations)} gate "
                  f"attestations they rest on: {envelope} "
                  f"(key {public_key.keyid[:16]}{how})", markup=False,
                  soft_wrap=True)  # fmt: skip
    if source.dirty:
        console.print(f"  built from commit {source.commit} with {len(source.changed)} "
                      f"uncommitted change(s) to wheel inputs (sha256 {source.change_sha256}); "
                      "the statement says so", markup=False, soft_wrap=True)  # fmt: skip
    for attestation, runner in attestations:
        console.print(f"  {attestation.evidence.gate} ({runner}): {attestation.path}, signed by "
                      f"{attestation.key.keyid[:16]}", markup=False, soft_wrap=True)  # fmt: skip
    return wheels, attestations, signed


def step_sign(context: Context, channel_name: str | None) -> int:
    channel, spec = context.channel(channel_name)
    signer, public_key = channel_signer(context, channel, spec)
    _sign(context, channel, spec, signer, public_key)
    return 0


Index = EmbeddedIndex | RemoteIndex


def _check_served_apart_from_keys(context: Context, tuf_dir: Path) -> None:
    """PublishError unless ``tuf_dir``, which a web server serves as it lies, stays apart from
    every private key: the state directory, ``--key-dir`` and each ``file:`` key of the manifest
    ([sign.*], [publish.tuf_keys.*])."""
    tuf_keys = context.manifest.publish.tuf_keys
    refs = [spec.key for spec in context.manifest.sign.values()]
    refs += [getattr(tuf_keys, role).key for role in ROLES] if tuf_keys else []
    private = [context.state_dir, *([context.key_dir] if context.key_dir else [])]
    private += [file_key_path(ref) for ref in refs if is_file_key(ref)]
    for path in (p.resolve() for p in private):
        if tuf_dir.is_relative_to(path) or path.is_relative_to(tuf_dir):
            raise PublishError(f"{context.manifest.path}: publish.tuf_dir: expected a folder apart "
                               f"from the state directory and the key folder, whose keys must "
                               f"never be served; got {tuf_dir}")  # fmt: skip


def _index(context: Context, *, upload: bool = False) -> Index:
    """The manifest's index: the embedded one, or a remote one (its credentials found and tried
    when it is opened to ``upload``)."""
    settings = context.manifest.publish
    if settings.embedded:
        return EmbeddedIndex(context.state_dir, settings.username)
    assert settings.tuf_dir and settings.tuf_url and settings.upload_endpoint  # the manifest's
    tuf_dir = (context.manifest.path.parent / settings.tuf_dir).resolve()
    _check_served_apart_from_keys(context, tuf_dir)
    keys_dir = context.state_dir / "remote-index" / "tuf-keys"
    return RemoteIndex(
        simple_url=settings.index, url=settings.upload_endpoint, tuf_dir=tuf_dir,
        tuf_url=settings.tuf_url, keys_dir=keys_dir, default_username=settings.username,
        upload=upload, limits=settings.limits,
    )  # fmt: skip


def open_publish(
    context: Context,
    channel: str,
    spec: ChannelSpec,
    public_key: Key,
    attestations: list[tuple[Attestation, str]],
    signed: SignedStatement | None = None,
) -> TufRepository:
    """The signature and key checks, made before any index is started or contacted; the TUF
    repository to publish with (its keys loaded: stable has no generated ones). `signed`: the
    envelope as sign verified it, taken while the file still holds those bytes."""
    statement = stored_statement(context.envelope_path, public_key, signed).statement
    named = {byproduct.sha256 for byproduct in statement.byproducts}
    if named != {a.sha256 for a, _ in attestations}:
        raise PublishError(
            f"{context.envelope_path}: the signed provenance names other gate attestations than "
            f"those that pass now ({', '.join(str(a.path) for a, _ in attestations)}); run "
            "`python -m release sign` again. Nothing was uploaded"
        )
    return _tuf_repository(context, channel, spec, _index(context))


def _tuf_repository(
    context: Context, channel: str, spec: ChannelSpec, index: Index
) -> TufRepository:
    """The index's TUF repository with the run's role keys (--key-dir, else
    [publish.tuf_keys], else generated: dev), each checked against the channel's pins."""
    tuf_keys = context.manifest.publish.tuf_keys
    if context.key_dir is not None:
        tuf_keys = tuf_keys_spec(context.key_dir)
    tuf = repository_for(
        index.tuf_dir, tuf_keys, channel=channel, state_dir=context.state_dir,
        manifest_dir=context.manifest.path.parent, keys_dir=index.keys_dir,
    )  # fmt: skip
    pins = channel_pins(context.manifest, channel, spec)
    _require_pinned_tuf_keys(pins, tuf, "--key-dir" if context.key_dir else "[publish.tuf_keys]")
    return tuf


def check_publish_inputs(
    context: Context, channel: str, spec: ChannelSpec, public_key: Key
) -> None:
    """What sign, publish and verify will need, checked before a run builds anything: a
    committed tree (where the channel refuses uncommitted changes), the channel's pinned signing
    key, its attesters' public keys, an index folder apart from the keys, a remote index's
    credentials (found, not yet tried), and each TUF role's pinned key, loaded and named by the
    index's root (dev keys are generated here on first use). `public_key`: the channel's
    signing key, loaded by the caller."""
    if operator_signed(context.manifest, spec):
        refuse_dirty(source_state(context.source_dir), channel, context.source_dir)
    _attester_keys(context, channel, spec, public_key)
    index = _index(context)
    if isinstance(index, RemoteIndex):
        find_credentials(index.url, context.manifest.publish.username)
    _tuf_repository(context, channel, spec, index).check()


def _require_pinned_tuf_keys(pins: ChannelPins, tuf: TufRepository, source: str) -> None:
    """Each TUF role signs with a pinned key, and the index's root (when there is one) names
    only pinned keys: stable's TUF metadata is by pinned keys, whoever made the repository."""
    if pins.by_use is None:
        return
    for role in ROLES:
        if tuf.signers is None:  # generated under the state directory: never pinned
            public = tuf.keys_dir / f"{role}.pub.json"
            if not public.is_file():
                raise SigningError(f"{pins.where(role)}: expected the TUF {role} key to be a "
                                   "pinned one; got keys to be generated (give "
                                   "[publish.tuf_keys] or --key-dir)")  # fmt: skip
            key, what = load_public_key(public), f"the generated key {public}"
        else:
            key, what = tuf.signers[role][1], f"{source} {role}"
        pins.require(key, role, what)
    _require_pinned_root(pins, TufRepository(tuf.directory).trusted_root_path)


def _require_pinned_root(pins: ChannelPins, root_path: Path) -> None:
    if pins.by_use is None or not root_path.is_file():
        return
    try:
        root = Metadata[Root].from_bytes(root_path.read_bytes()).signed
    except Exception as error:  # tuf raises its own types for each malformed part
        raise SigningError(f"{root_path}: not a TUF root ({type(error).__name__})") from None
    for role in ROLES:
        pins.require_all(root.roles[role].keyids, role, f"the TUF root {root_path} for {role}")


def _publish_with(
    context: Context,
    index: Index,
    channel: str,
    wheels: WheelSet,
    tuf: TufRepository,
    attestations: list[tuple[Attestation, str]],
    signed: SignedStatement | None = None,
) -> None:
    attached = {published_name(a.evidence.gate): a.path for a, _ in attestations}
    report = publish(
        wheels.paths, index, envelope=context.envelope_path, metadata_dir=index.provenance_dir,
        signed=signed,
        tuf=tuf, digests=wheels.release_digests, attachments=attached,
        limits=context.manifest.publish.limits, sdist=wheels.sdist.path if wheels.sdist else None,
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


def declared_interpreters(
    manifest: Manifest, find: Callable[[str], Path | None] = find_interpreter
) -> list[Path]:
    """An interpreter of each version ``build.python`` declares, to install and import the
    published wheels with; VerifyError naming each version without one (a verify that skipped a
    version would pass on a wheel no one installed)."""
    found = {version: find(version) for version in manifest.build.python}
    missing = [version for version, path in found.items() if path is None]
    if missing:
        raise VerifyError(
            f"{manifest.path}: build.python: expected an interpreter of every declared version to "
            f"install and import the published wheels with; got none for Python "
            f"{', '.join(missing)} (none on PATH or under pyenv). Nothing was verified; install "
            "each (the CI release job sets up every declared version)"
        )
    return [path for path in found.values() if path is not None]


def _verify_with(
    context: Context,
    index: Index,
    channel: str,
    spec: ChannelSpec,
    public_key: Any,
    reuse: ReuseStore | None = None,
    signed: SignedStatement | None = None,
) -> None:
    """Verify what `index` serves. The statement stored on the index is checked in any case: it
    is taken for `signed` (the envelope `run` signed and verified) only when its bytes are those
    very bytes, else it is read and its signature verified again."""
    # A verify.json of an earlier pass must not stand for this verify if it fails.
    records.discard(context.out_dir, records.VerifyRecord)
    version = project_version()
    interpreters = declared_interpreters(context.manifest)
    stored = envelope_path_for(index.provenance_dir, context.manifest.release.name, version)
    statement = stored_statement(stored, public_key, signed)
    pins = channel_pins(context.manifest, channel, spec)
    _require_pinned_root(pins, TufRepository(index.tuf_dir).trusted_root_path)
    # What pip downloads must also be the TUF target the publisher signed (the cache in the
    # state dir remembers the metadata seen, so a later rollback is refused).
    limits = context.manifest.publish.limits
    trusted = TrustedIndex(index.tuf_url, TufRepository(index.tuf_dir).trusted_root_path,
                           context.state_dir / "verify-tuf-cache", limits=limits)  # fmt: skip
    trusted.refresh()
    project = context.manifest.release.name
    for attestation in verify_attestations(statement.statement, trusted, project, version,
                                           context.out_dir / "verify"):  # fmt: skip
        console.print(
            f"  {attestation.evidence.gate}: attestation signed by "
            f"{attestation.key.keyid[:16]} passed on every wheel",
            markup=False,
        )
    with console.status("checking every file, then installing from the index into fresh venvs"):
        verified, reused = verified_or_reused(
            index, trusted, stored, statement.statement, channel=channel,
            project=context.manifest.release.name, version=version, interpreters=interpreters,
            imports=MODULES, workdir=context.out_dir / "verify",
            limits=context.manifest.publish.limits, reuse=reuse,
        )  # fmt: skip
    checks = verified.checks
    print_served(verified.files)
    if reused:
        console.print(f"  the installs below are those of a verify of the same files from the "
                      f"same index and TUF metadata ({reused})", markup=False,
                      soft_wrap=True)  # fmt: skip
    for check in checks:
        console.print(f"  python {check.python_version}: {check.wheel} digest matches its TUF "
                      f"target and the signed statement; imported "
                      f"{', '.join(check.imported)}")  # fmt: skip
    records.write(context.out_dir, records.VerifyRecord(
        index=index.simple_url, statement=str(stored), served=verified.files,
        checks=tuple(records.VerifyCheck(python=c.python_version, wheel=c.wheel, sha256=c.sha256,
                                         digest_ok=c.digest_ok, imported=tuple(c.imported))
                     for c in checks),
    ))  # fmt: skip


def stored_statement(
    stored: Path, public_key: Key, signed: SignedStatement | None = None
) -> SignedStatement:
    """The statement stored at `stored`, its signature by `public_key` verified: `signed` itself
    where the stored bytes are those that verified (a copy carries the same signature)."""
    if signed is not None and signed.key.keyid == public_key.keyid:
        try:
            same = signed.at(stored, sha256_file(stored))
        except OSError:
            same = None  # the read below names the file and why
        if same is not None:
            return same
    return read_and_verify(stored, public_key)


def step_publish(context: Context, channel_name: str | None) -> int:
    channel, spec = context.channel(channel_name)
    _, public_key = channel_signer(context, channel, spec)
    record = records.read_optional(context.out_dir, BuildRecord)
    wheels, attestations = _attested(context, channel, spec, public_key, record)
    tuf = open_publish(context, channel, spec, public_key, attestations)
    with _index(context, upload=True) as index:
        _publish_with(context, index, channel, wheels, tuf, attestations)
    return 0


def step_verify(context: Context, channel_name: str | None) -> int:
    channel, spec = context.channel(channel_name)
    _, public_key = channel_signer(context, channel, spec)
    with _index(context) as index:
        _verify_with(context, index, channel, spec, public_key)
    return 0


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # leaves the index's context: its server is stopped


def step_serve(context: Context, port: int = 0) -> int:
    """The embedded index in the foreground, on ``port`` of 127.0.0.1 (0: any free one)."""
    settings = context.manifest.publish
    if not settings.embedded:
        raise PublishError(f"{context.manifest.path}: publish.index: serve runs the embedded "
                           f"index; {settings.index} is served by its operator")  # fmt: skip
    index = EmbeddedIndex(context.state_dir, settings.username, port=port)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # as Ctrl-C: a service manager's stop
    with index:
        console.print(f"serving {index.packages_dir} at {index.simple_url} (Ctrl-C stops)")
        console.print(install_hint(index.simple_url, context.manifest.release.name,
                                   port_changes=not index.fixed_port))  # fmt: skip
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


def sign_publish_verify(
    context: Context,
    channel: str,
    spec: ChannelSpec,
    reuse: ReuseStore | None = None,
    signing: SignerAndKey | None = None,
) -> None:
    """The trust half of `run`, after the gates: refuse unless the channel's evidence names
    exactly the wheels as they lie now; sign them (with `signing`, the channel's key where the
    caller loaded it); publish; verify from the index (the signature and verify's installs
    taken from `reuse` where they were made before on the same inputs)."""
    console.rule("sign")
    signer, public_key = signing or channel_signer(context, channel, spec)
    published, attestations, signed = _sign(context, channel, spec, signer, public_key, reuse)
    tuf = open_publish(context, channel, spec, public_key, attestations, signed)
    with _index(context, upload=True) as index:
        console.rule(f"publish to {index.simple_url}")
        _publish_with(context, index, channel, published, tuf, attestations, signed)
        console.rule("verify")
        _verify_with(context, index, channel, spec, public_key, reuse, signed)
