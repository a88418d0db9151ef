"""The steps behind the command line: build, the gates (a loop over the registry), sign, publish,
verify, and `run`, which is all of them in order. Each reads the manifest and the records under
`<out>/` (release.records) and writes its own.

The build and the signing and index stacks (release.builder, release.trust) are imported by the
steps that use them, not here: a GPU runner judging its gates has neither installed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from release import records
from release.context import Context
from release.errors import BuildError, GateError, ReleaseError, SigningError
from release.evidence import Evidence, write_evidence
from release.gates.contract import GateInputs
from release.gates.options import GateOptions
from release.gates.registry import run_gate
from release.gpu import detect_gpu
from release.manifest import ChannelSpec
from release.records import BuildRecord, BuiltWheelEntry, SdistEntry, SkippedEntry
from release.util.atomic import atomic_write
from release.util.digests import sha256_file
from release.util.pins import project_version
from release.util.progress import VERDICT_STYLE, console
from release.util.reuse import Hit, ReuseStore, changed, refusal
from release.util.set_aside import SetAside
from release.wheelset import Sdist, Wheel, WheelSet

if TYPE_CHECKING:
    from release.trust.keys import RunKeys, SignerAndKey


@dataclass(frozen=True)
class Judged:
    """A gate's verdict as a step found it: run now, or taken from the reuse store."""

    evidence: Evidence
    reused: str = ""  # how it was taken ("reused: key …, from the run at …"); "" when run
    ran_again: str = ""  # what changed since the gate last passed, where it had


def judge(
    context: Context,
    name: str,
    inputs: GateInputs,
    reuse: ReuseStore | None = None,
    attesting: SignerAndKey | None = None,
) -> Judged:
    """Runs one gate through the registry and signs its evidence as an in-toto attestation
    (`<out>/evidence/<gate>.intoto.json`) with the runner's key; the key is loaded first, so a
    long gate never runs to have its verdict refused for want of a key.

    With `reuse`, a passing verdict is stored by its key (release/gates/reuse.py: everything it
    depends on, and the key that signed it); where the store is read and holds that key, the
    stored attestation is taken instead of running the gate, once its signature verifies with
    this run's key and it names exactly these wheels (docs/reuse.md). `attesting`: the key,
    where the caller loaded it."""
    from release.trust.attestation import attest
    from release.trust.keys import attesting_signer

    signer, public_key = attesting or attesting_signer(context)
    key_inputs = _gate_key(name, inputs, public_key.keyid) if reuse and reuse.reads else None
    if reuse is not None and key_inputs is not None:
        hit = reuse.get("gate", name, key_inputs)
        if hit is not None and (taken := _take_reused(context, name, inputs, hit, public_key)):
            return Judged(taken, reused=hit.note())
    evidence = run_gate(name, inputs)
    path = attest(evidence, signer, context.out_dir)
    if reuse is None or evidence.verdict != "pass":
        return Judged(evidence)  # only a pass is kept: anything else runs again next time
    if key_inputs is None:
        key_inputs = _gate_key(name, inputs, public_key.keyid)
    if key_inputs is None:
        return Judged(evidence)
    before = reuse.latest("gate", name)
    stored = {"attestation": path.read_text(encoding="utf-8")}
    problem = reuse.put("gate", name, key_inputs, stored)
    if problem:
        console.print(f"  reuse: not stored ({escape(problem)})")
    ran_again = ", ".join(changed(before.inputs, key_inputs)[:6]) if before and reuse.reads else ""
    return Judged(evidence, ran_again=ran_again)


def _gate_key(name: str, inputs: GateInputs, signer: str) -> dict[str, Any] | None:
    """The gate's key inputs and the key its attestations are signed with; None where it is
    never reused, or where they cannot be found (the gate then runs, and says why)."""
    from release.gates.reuse import gate_key_inputs

    try:
        key_inputs = gate_key_inputs(name, inputs)
    except ReleaseError:
        return None
    return None if key_inputs is None else {**key_inputs, "signer": signer}


def _take_reused(
    context: Context, name: str, inputs: GateInputs, hit: Hit, public_key: Any
) -> Evidence | None:
    """The stored attestation, put in place as this run's and its evidence written beside it,
    once its signature verifies with `public_key` and it passed on exactly `inputs`' wheels; None
    (and nothing left in place) otherwise, for the gate to run again."""
    from release.trust.attestation import attestation_path, read_attestation

    path = attestation_path(context.out_dir, name)
    text = hit.payload.get("attestation")
    try:
        if not isinstance(text, str):
            raise SigningError("it holds no attestation")
        atomic_write(path, text.encode("utf-8"))
        attestation = read_attestation(path, {public_key.keyid: public_key},
                                       "the key that signs this run's attestations")  # fmt: skip
        found = attestation.evidence
        if (found.gate, found.verdict, found.artefacts) != (name, "pass", inputs.wheels.digests):
            raise SigningError(f"it says {found.gate} {found.verdict} on other wheels")
        write_evidence(context.out_dir, found)
    except ReleaseError as error:
        path.unlink(missing_ok=True)
        console.print(f"  {name}: the stored verdict {hit.key[:12]} is not taken "
                      f"({escape(str(error))}); running the gate")  # fmt: skip
        return None
    return found


def print_verdict(judged: Judged) -> int:
    evidence = judged.evidence
    colour = VERDICT_STYLE[evidence.verdict]
    how = f" ({judged.reused})" if judged.reused else ""
    console.print(f"[{colour}]{evidence.gate}: {evidence.verdict}[/]{escape(how)}")
    if judged.ran_again:
        changes = escape(judged.ran_again)
        console.print(f"  [dim]ran again: changed since it last passed: {changes}[/]")
    if evidence.reason:
        console.print("  " + escape(evidence.reason.replace("; ", "\n  ")))
    return 0 if evidence.verdict == "pass" else 1


# --- build and gates ---


def build(
    context: Context, only: list[str], toolchain_kind: str | None = None, *, fresh: bool = False
) -> WheelSet:
    """Builds the sdist and the wheels and writes the build record; each file is hashed here,
    once. The sdist is built first (a second, without a compiler) with the wheels'
    SOURCE_DATE_EPOCH, and replaces `<out>/sdist/` only once the wheels stand too. `fresh`: new
    build trees under <out>/fresh-build, no ccache, no wheel cache (the sdist has none)."""
    from release.builder.sdist import StagedSdist
    from release.builder.wheels import build_wheels, source_date_epoch
    from release.source_state import source_state

    started = datetime.now(timezone.utc)
    source = source_state(context.source_dir)  # what the provenance will name
    epoch = source_date_epoch(context.source_dir)
    fresh_root = context.out_dir / "fresh-build" if fresh else None
    if fresh_root is not None:
        shutil.rmtree(fresh_root, ignore_errors=True)
    with StagedSdist(context.source_dir, context.out_dir, epoch) as staged:
        report = build_wheels(
            context.manifest,
            source_dir=context.source_dir,
            out_dir=context.out_dir,
            cache_dir=context.cache_dir,
            only=only,
            toolchain_kind=toolchain_kind,
            fresh_build_root=fresh_root,
            epoch=epoch,
        )
    built_sdist = staged.built
    sdist = Sdist(built_sdist.path, sha256_file(built_sdist.path), built_sdist.size, epoch)
    console.print(f"  {sdist.name}: built in {built_sdist.seconds:.0f} s, "
                  f"{sdist.size / 1e6:.2f} MB")  # fmt: skip
    after = source_state(context.source_dir)
    if after != source:
        raise BuildError(f"{context.source_dir}: expected the tree to stay as it was while the "
                         f"wheels were built ({source.describe()}); got {after.describe()}; "
                         "build again")  # fmt: skip
    wheels = WheelSet(tuple(
        Wheel(w.path, sha256_file(w.path), w.python, w.serves, w.size) for w in report.wheels
    ), sdist)  # fmt: skip
    records.write(context.out_dir, BuildRecord(
        started=started, finished=datetime.now(timezone.utc), source=source.record(),
        source_date_epoch=report.source_date_epoch, toolchain=report.toolchain,
        wheels=tuple(
            BuiltWheelEntry(file=w.name, python=w.python, serves=w.serves,
                            seconds=round(built.seconds, 1), cached=built.cached, size=w.size,
                            sha256=w.sha256)
            for built, w in zip(report.wheels, wheels, strict=True)
        ),
        skipped=tuple(SkippedEntry(python=s.python, reason=s.reason) for s in report.skipped),
        sdist=SdistEntry(file=sdist.name, seconds=round(built_sdist.seconds, 1), size=sdist.size,
                         sha256=sdist.sha256),
    ))  # fmt: skip
    return wheels


def step_build(
    context: Context, only: list[str], toolchain_kind: str | None = None, *, fresh: bool = False
) -> int:
    """`build`: the wheels, then the policy gate on exactly them (the policy is part of the
    build: auditwheel's verdict on the wheels just made)."""
    wheels = build(context, only, toolchain_kind, fresh=fresh)
    inputs = gate_inputs(context, wheels)
    return print_verdict(judge(context, "policy", inputs, stored_only(context, "a build")))


def gate_inputs(
    context: Context, wheels: WheelSet, options: GateOptions | None = None, gpu: str | None = None
) -> GateInputs:
    return GateInputs(
        manifest=context.manifest, wheels=wheels, out_dir=context.out_dir,
        source_dir=context.source_dir, cache_dir=context.cache_dir,
        gpu=gpu if gpu is not None else detect_gpu(), options=options or GateOptions(),
    )  # fmt: skip


def step_gate(context: Context, name: str, wheels: WheelSet, options: GateOptions) -> int:
    """One gate alone (`python -m release <gate>`), declared in the manifest or not: it runs,
    and a pass is stored for a later `run` to reuse."""
    inputs = gate_inputs(context, wheels, options)
    return print_verdict(judge(context, name, inputs, stored_only(context, "a gate run alone")))


def step_gpu_gates(context: Context, wheels: WheelSet, options: GateOptions) -> int:
    """Every GPU gate of the manifest on `wheels`: 0 on pass or "not run", 1 on a failure."""
    inputs = gate_inputs(context, wheels, options)
    gpu_gates = [name for name, spec in context.manifest.gates.items() if spec.runner == "gpu"]
    store = stored_only(context, "the GPU gates run alone")
    verdicts = [judge(context, name, inputs, store) for name in gpu_gates]
    for judged in verdicts:
        print_verdict(judged)
    return 1 if any(judged.evidence.verdict == "fail" for judged in verdicts) else 0


def run_gates(
    context: Context,
    wheels: WheelSet,
    reuse: ReuseStore | None = None,
    attesting: SignerAndKey | None = None,
) -> None:
    """Every gate the manifest declares, in its order, each through the registry (a verdict
    found before on the same inputs taken from `reuse`, where it is read), its attestation
    signed with `attesting` (else the key `judge` loads)."""
    inputs = gate_inputs(context, wheels)
    for name in context.manifest.gates:
        print_verdict(judge(context, name, inputs, reuse, attesting))


def reuse_store(context: Context, refused: str = "") -> ReuseStore:
    """The reuse store of the run's state directory; `refused`: why it is not read."""
    return ReuseStore(context.state_dir / "reuse", refused)


def stored_only(context: Context, why: str) -> ReuseStore:
    """The store, written but never read: a step asked for by name runs."""
    return reuse_store(context, why)


def run_store(
    context: Context, spec: ChannelSpec, *, fresh: bool, environ: Mapping[str, str] = os.environ
) -> ReuseStore:
    """The store `run` reads, unless it is `fresh`, the channel signs with an operator's key
    (stable) or it runs in CI (docs/reuse.md); it is written all the same."""
    from release.trust.pins import operator_signed

    operator = operator_signed(context.manifest, spec)
    return reuse_store(context, refusal(fresh=fresh, operator_signed=operator, environ=environ))


# --- the whole release ---

# The records a run makes after its build; an earlier run's are set aside when it starts.
RUN_RECORDS = (records.SignRecord, records.PublishRecord, records.VerifyRecord)


def step_run(context: Context, channel_name: str | None, *, fresh: bool = False) -> int:
    """The main job: build, every declared gate, sign, publish, verify, then the summary.

    What was found before on the same inputs is reused (docs/reuse.md): a gate's verdict, the
    signature of the same statement, verify's installs of the same files from the same index.
    `fresh` reuses nothing and builds afresh (as `build --fresh`); neither do the stable channel
    (an operator-signed one) and a CI job read the store.

    Every input that can be checked in a moment is checked first (check_run_inputs): a run
    refused there leaves `<out>` as it was, byte for byte. The earlier run's evidence, records
    and report are then moved aside, not deleted: put back if the build fails (nothing new was
    made), removed once the build's wheels and record stand. From there on a failure (a gate
    that fails, a refused publish) still leaves the summary and the report of what happened.
    """
    from release.report.document import REPORT_HTML, REPORT_MD, STAGING_PLOT, write_report
    from release.report.loader import load_run
    from release.report.terminal import print_summary
    from release.trust.steps import sign_publish_verify

    channel, spec = context.channel(channel_name)
    keys = check_run_inputs(context, channel, spec)
    reuse = run_store(context, spec, fresh=fresh)
    # Records of an earlier run must not speak for this one.
    earlier = ["evidence", REPORT_MD, REPORT_HTML, STAGING_PLOT]
    earlier += [records.record_path(context.out_dir, kind).name for kind in RUN_RECORDS]
    console.rule(f"release {context.manifest.release.name} {project_version()} ({channel})")
    if reuse.refused:
        console.print(f"reuse: nothing found before is reused ({reuse.refused})")
    with SetAside(context.out_dir, earlier) as aside:
        wheels = build(context, [], fresh=fresh)
        aside.discard()
    try:
        console.rule("gates")
        run_gates(context, wheels, reuse, keys.attesting)
        sign_publish_verify(context, channel, spec, reuse, keys.signing)
    finally:
        view = load_run(context.out_dir, context.manifest, channel, context.source_dir)
        print_summary(view)
        for path in write_report(view):
            console.print(f"report: {path}")
    return 0


def check_run_inputs(context: Context, channel: str, spec: ChannelSpec) -> RunKeys:
    """ReleaseError naming the first input `run` would find missing or unusable only after its
    build and gates: the toolchain's programs, the sdist's frontend and pinned backend, an
    interpreter of every declared Python (verify installs on each), the channel's signing key
    and the key that signs the gates' attestations, each TUF role's key, and a remote index's
    credentials. Nothing under `<out>` is touched (generated dev keys may be made under the
    state directory, as on any use). The keys, loaded here once, sign the run."""
    from release.builder.sdist import check_frontend
    from release.trust.keys import run_keys
    from release.trust.steps import check_publish_inputs, declared_interpreters

    _check_toolchain(context)
    check_frontend()
    declared_interpreters(context.manifest)
    keys = run_keys(context, channel, spec)
    check_publish_inputs(context, channel, spec, keys.signing[1])
    return keys


def _check_toolchain(context: Context) -> None:
    """The hermetic toolchain's zig and CUDA host compiler (nvcc is found, or installed from
    the pinned wheels, by the build itself)."""
    manifest = context.manifest
    if manifest.build.toolchain.kind != "hermetic":
        return  # cibuildwheel's containers bring their own compilers
    from release.builder.toolchain import find_host_compiler, find_zig

    find_zig()
    find_host_compiler(manifest)


# --- the consumer's check, reports, CI, benchmarks ---


def step_record_build(context: Context) -> int:
    """The record of wheels built elsewhere (cibuildwheel in CI), with the sdist of the checkout
    this runs in, built here as `build` builds it: a release from CI publishes it beside the
    wheels, as a local `run` does."""
    from release.builder.record_build import record_build
    from release.builder.sdist import StagedSdist
    from release.builder.wheels import source_date_epoch

    paths = context.wheel_files()
    wheels = WheelSet.from_files(context.manifest, paths)  # a wrong wheel is refused first
    with StagedSdist(context.source_dir, context.out_dir,
                     source_date_epoch(context.source_dir)) as staged:  # fmt: skip
        pass
    built = staged.built
    sdist = SdistEntry(file=built.path.name, seconds=round(built.seconds, 1), size=built.size,
                       sha256=sha256_file(built.path))  # fmt: skip
    records.write(context.out_dir, record_build(wheels, context.source_dir, sdist))
    console.print(f"recorded the build of {len(paths)} wheel(s) and {sdist.file} in "
                  f"{context.out_dir}")  # fmt: skip
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
    from release.report.loader import load_run, recorded_channel

    channel = channel_name or recorded_channel(context.out_dir, context.manifest)
    view = load_run(context.out_dir, context.manifest, channel, context.source_dir)
    for path in write_report(view):
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
