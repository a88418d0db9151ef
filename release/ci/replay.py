"""`python -m release.ci.replay`: the generated workflow's jobs, run on this machine (docs/ci.md,
"Replaying the workflow here").

The workflow is the one committed at the replayed commit. Its jobs run in ``needs:`` order, each
matrix entry in a fresh clone at the commit (replay_job.py), as a manual run of ``--channel``
(one of the workflow's own choices) or as a pull request. A self-hosted runner's environment is
a folder of the replay kept between runs (``--runner-dir``): the release runner's
``ACTIVEKV_STATE_DIR`` and ``ACTIVEKV_TUF_DIR``, its devpi-server and the web server of its TUF
folder (replay_services.py, started for the release job and stopped at the end, however it
ends), and setup-python's tool cache. A job that needs a GPU is not run on a machine without one
(its result is ``skipped``), unless ``--gpu-records DIR`` gives its records, packed on the GPU
machine by ``--job gpu-gates``. Secrets come from ``--secrets FILE`` and are masked in every line
printed and logged.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from release.ci import replay_plan
from release.ci.jobs import GPU_RECORDS, STATE_DIR, TUF_DIR
from release.ci.replay_context import (
    JobState,
    RefusedError,
    Replay,
    StandInError,
    runner_base_env,
)
from release.ci.replay_expressions import ExpressionError, Status, condition, interpolate_value
from release.ci.replay_job import JobResult, fresh_folder, run_job
from release.ci.replay_secrets import Masker, masker_for, read_secrets
from release.errors import ReleaseError
from release.util.paths import REPO_ROOT

if TYPE_CHECKING:
    from release.ci.replay_services import ReleaseServices

RELEASE_LABEL = "release"  # the release runner: it runs the index and the TUF web server
CACHE_ENV = "ACTIVEKV_CACHE_DIR"  # a self-hosted runner's compiler and framework caches
# What an operator sets in a self-hosted runner's own environment (its .env), taken from the
# replay's: the GPU runner's attestation key, and where its CUDA profiling and BLAS libraries are
# when no interpreter's site has them (docs/ci.md, "What each runner holds").
RUNNER_VARIABLES = (
    "ACTIVEKV_RUNNER_KEY",
    "ACTIVEKV_CUPTI_LIBRARY",
    "ACTIVEKV_CUBLAS_LIBRARY",
)


def _git(repository: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repository), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)} in {repository}: {done.stderr.strip()}")
    return done.stdout.strip()


def has_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU the driver answers for."""
    if shutil.which("nvidia-smi") is None:
        return False
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return done.returncode == 0 and "GPU" in done.stdout


class Printer:
    """Every line of the replay: masked, printed, and kept in the run's log."""

    def __init__(self, masker: Masker, log: Path) -> None:
        self.masker = masker
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("a")

    def __call__(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            masked = self.masker(line)
            print(masked, flush=True)
            self._log.write(masked + "\n")
            self._log.flush()

    def job_printer(self, job_log: Path) -> Any:
        job_log.parent.mkdir(parents=True, exist_ok=True)
        stream = job_log.open("a")

        def write(line: str) -> None:
            masked = self.masker(line)
            print(f"  | {masked}", flush=True)
            stream.write(masked + "\n")
            stream.flush()
            self._log.write(f"  | {masked}\n")

        return write

    def close(self) -> None:
        self._log.close()


class WorkflowReplay:
    """One replay of the committed workflow (module docstring)."""

    def __init__(
        self,
        replay: Replay,
        workflow: dict[str, Any],
        origin: str,
        secrets: dict[str, str],
        index: tuple[str, str] | None,
        only_job: str | None,
        from_run: Path | None,
    ) -> None:
        self.replay, self.workflow, self.origin = replay, workflow, origin
        self.secrets = secrets
        self.index = index
        self.only_job = only_job
        self.from_run = from_run
        self.masker = masker_for(secrets)
        self.out = Printer(self.masker, replay.logs / "replay.log")
        self.results: list[JobResult] = []
        self.services: ReleaseServices | None = None

    def github(self, job_id: str) -> dict[str, Any]:
        replay = self.replay
        return {
            "event_name": replay.event,
            "sha": replay.commit,
            "ref": "refs/heads/main",
            "ref_name": "main",
            "repository": f"local/{replay.repository.name}",
            "workflow": self.workflow.get("name", "workflow"),
            "run_id": replay.work.name,
            "run_number": "1",
            "run_attempt": "1",
            "actor": "replay",
            "job": job_id,
            "server_url": "https://github.com",
            "event": {"inputs": replay.inputs},
        }

    def runner_env(self, job: Mapping[str, Any]) -> dict[str, str]:
        """What a self-hosted runner's own environment (its .env) holds here."""
        if not replay_plan.self_hosted(job):
            return {}
        runner = self.replay.runner_dir
        env = {CACHE_ENV: os.environ.get(CACHE_ENV) or str(runner / "cache")}
        if RELEASE_LABEL in replay_plan.labels(job):
            env |= {STATE_DIR: str(runner / "state"), TUF_DIR: str(runner / "tuf")}
        env |= {name: os.environ[name] for name in RUNNER_VARIABLES if name in os.environ}
        return env

    def run(self) -> int:
        jobs: dict[str, Any] = self.workflow["jobs"]
        order = replay_plan.job_order(jobs, self.origin)
        if self.only_job is not None and self.only_job not in jobs:
            raise RefusedError(
                f"--job {self.only_job}: expected a job of {self.origin} ({', '.join(order)})"
            )
        started = time.monotonic()
        self.out(
            f"replaying {self.origin} at {self.replay.commit} as {self.replay.event} "
            f"{self.replay.inputs} in {self.replay.work}"
        )
        if self.only_job is not None:  # the job and the jobs it needs, those from --from-run
            wanted = _with_needs(jobs, self.only_job)
            order = [job_id for job_id in order if job_id in wanted]
        needs: dict[str, dict[str, Any]] = {}
        try:
            for job_id in order:
                needs[job_id] = self._job(job_id, jobs[job_id], needs)
        except KeyboardInterrupt:
            self.out("cancelled (Ctrl-C): the running step's processes were ended")
            self._summary(time.monotonic() - started)
            return 130
        finally:
            if self.services is not None:
                self.services.__exit__(None, None, None)
                self.out("stopped devpi-server and the TUF folder's web server")
        self._summary(time.monotonic() - started)
        return 1 if any(r.result == "failure" for r in self.results) else 0

    def _job(
        self, job_id: str, job: Mapping[str, Any], needs: Mapping[str, dict[str, Any]]
    ) -> dict[str, Any]:
        if self.only_job is not None and job_id != self.only_job:
            return self._not_replayed(job_id)
        own_needs = {n: needs[n] for n in replay_plan.needs_of(job)}
        contexts = {
            "github": self.github(job_id),
            "inputs": self.replay.inputs,
            "needs": own_needs,
            "vars": {},
        }
        if "if" in job:
            failed = any(n["result"] != "success" for n in own_needs.values())
            try:
                runs = condition(str(job["if"]), contexts, Status(failed=failed))
            except ExpressionError as error:
                raise RefusedError(
                    f"jobs.{job_id}: if: {error} (the replay evaluates only the "
                    "forms the generator writes; it never guesses)"
                ) from None
        else:
            runs = all(n["result"] == "success" for n in own_needs.values())
        if not runs:
            return self._skipped(job_id, f"if: {job.get('if', 'a needed job did not succeed')}")
        if replay_plan.needs_gpu(job) and not has_gpu():
            return self._without_gpu(job_id)
        results = []
        combos = replay_plan.expand_matrix(job.get("strategy"))
        for number, combo in enumerate(combos):
            results.append(self._entry(job_id, job, combo, contexts, number, len(combos)))
        failed = any(r.result == "failure" for r in results)
        return {"result": "failure" if failed else "success", "outputs": {}}

    def _entry(
        self,
        job_id: str,
        job: Mapping[str, Any],
        combo: dict[str, Any],
        contexts: dict[str, Any],
        number: int,
        count: int,
    ) -> JobResult:
        contexts = {**contexts, "matrix": combo, "secrets": self.secrets}
        try:
            name = str(interpolate_value(job.get("name", job_id), contexts))
            job_env = {
                str(k): str(interpolate_value(v, contexts))
                for k, v in (job.get("env") or {}).items()
            }
        except ExpressionError as error:
            raise RefusedError(f"jobs.{job_id}: {error}") from None
        slug = job_id if count == 1 else f"{job_id}-{number + 1}"
        folder = fresh_folder(self.replay.work / "jobs" / slug)
        workspace, temp = folder / "workspace", folder / "temp"
        temp.mkdir()
        env = (
            runner_base_env()
            | self.runner_env(job)
            | {
                "CI": "true",
                "GITHUB_ACTIONS": "true",
                "GITHUB_WORKSPACE": str(workspace),
                "GITHUB_SHA": self.replay.commit,
                "GITHUB_EVENT_NAME": self.replay.event,
                "GITHUB_JOB": job_id,
                "GITHUB_REF": "refs/heads/main",
                "GITHUB_REF_NAME": "main",
                "GITHUB_REPOSITORY": f"local/{self.replay.repository.name}",
                "GITHUB_RUN_ID": self.replay.work.name,
                "RUNNER_TEMP": str(temp),
                "RUNNER_TOOL_CACHE": str(self.replay.tool_cache),
                "RUNNER_OS": "Linux",
                "RUNNER_ARCH": "X64",
                "RUNNER_NAME": "replay",
            }
            | job_env
        )
        state = JobState(
            name,
            slug,
            self.replay,
            replay_plan.self_hosted(job),
            workspace,
            temp,
            env,
            self.masker,
            self.out.job_printer(self.replay.logs / f"{slug}.log"),
        )
        self.out(
            f"== job {name} ({'self-hosted ' if state.self_hosted else 'hosted '}"
            f"{replay_plan.labels(job)}; workspace {workspace})"
        )
        for note in self._notes(job):
            state.say(note)
        if RELEASE_LABEL in replay_plan.labels(job) and replay_plan.self_hosted(job):
            self._start_services(env)
        workspace.mkdir()
        result = run_job(state, job_id, job, contexts)
        self.out(f"== job {name}: {result.result} in {result.seconds:.0f} s")
        records = self.replay.artifacts / GPU_RECORDS
        if replay_plan.needs_gpu(job) and records.is_dir():
            self.out(
                f"the GPU job's records: {records}; carry that folder to the release "
                "machine and give it there as --gpu-records DIR"
            )
        self.results.append(result)
        return result

    def _notes(self, job: Mapping[str, Any]) -> list[str]:
        notes = []
        if "environment" in job:
            notes.append(
                f"environment {job['environment']}: its protection rules (reviewers, "
                "admitted refs) are GitHub's; nothing here stands in for them"
            )
        if "concurrency" in job:
            notes.append(
                "concurrency: one replay runs at a time here (the fixed ports of the "
                "index and the TUF web server refuse a second)"
            )
        return notes

    def _start_services(self, env: Mapping[str, str]) -> None:
        if self.services is not None:
            return
        if self.index is None:
            raise RefusedError(
                "the release job runs on the release runner, but the manifest "
                "names no ci.release index to serve"
            )
        # Here, not at import: a GPU runner replaying its own job has no index client.
        from release.ci.replay_services import ReleaseServices, index_place

        place = index_place(*self.index)
        services = ReleaseServices(place, self.replay.runner_dir, Path(env[TUF_DIR]), self.secrets)
        services.__enter__()
        self.services = services
        self.out(f"started {services.describe()}")

    def _not_replayed(self, job_id: str) -> dict[str, Any]:
        source = self.from_run / "artifacts" if self.from_run else None
        if source is None:
            raise RefusedError(
                f"--job {self.only_job}: the jobs it needs run in an earlier "
                "replay: give its folder with --from-run DIR"
            )
        for artifact in sorted(p for p in source.iterdir() if p.is_dir()):
            target = self.replay.artifacts / artifact.name
            if not target.exists():
                shutil.copytree(artifact, target)
        self.out(
            f"== job {job_id}: not replayed (--job {self.only_job}); its artifacts are "
            f"those of {self.from_run}"
        )
        self.results.append(JobResult(job_id, job_id, "success", note="from --from-run"))
        return {"result": "success", "outputs": {}}

    def _skipped(self, job_id: str, reason: str) -> dict[str, Any]:
        self.out(f"== job {job_id}: skipped ({reason})")
        self.results.append(JobResult(job_id, job_id, "skipped", note=reason))
        return {"result": "skipped", "outputs": {}}

    def _without_gpu(self, job_id: str) -> dict[str, Any]:
        records = self.replay.gpu_records
        if records is None:
            return self._skipped(
                job_id,
                "not run: no GPU on this machine (nvidia-smi finds "
                "none); replay it on the GPU machine with --job "
                f"{job_id} and give its records here with --gpu-records DIR",
            )
        tar = records / f"{GPU_RECORDS}.tar"
        if not tar.is_file():
            raise RefusedError(
                f"--gpu-records {records}: expected {tar.name} (the artifact "
                f"{GPU_RECORDS} of --job {job_id} on the GPU machine)"
            )
        target = self.replay.artifacts / GPU_RECORDS
        target.mkdir(parents=True)
        shutil.copy2(tar, target / tar.name)
        note = f"stand-in (--gpu-records): its artifact {GPU_RECORDS} from {records}"
        self.out(f"== job {job_id}: not run here (no GPU); {note}")
        self.results.append(JobResult(job_id, job_id, "success", note=note))
        return {"result": "success", "outputs": {}}

    def _summary(self, seconds: float) -> None:
        lines = [
            f"# Replay of {self.origin} ({self.replay.event} {self.replay.inputs})",
            "",
            "| job | step | result | seconds | note |",
            "|---|---|---|---|---|",
        ]
        for job in self.results:
            lines.append(f"| {job.name} | | {job.result} | {job.seconds:.0f} | {job.note} |")
            for step in job.steps:
                result = (
                    step.outcome
                    if step.outcome == step.conclusion
                    else (f"{step.outcome} (continue-on-error)")
                )
                lines.append(f"| | {step.title} | {result} | {step.seconds:.0f} | {step.note} |")
        lines += ["", f"wall time: {seconds:.0f} s"]
        text = self.masker("\n".join(lines) + "\n")
        (self.replay.work / "summary.md").write_text(text)
        self.out(text)
        self.out(f"summary: {self.replay.work / 'summary.md'}; logs: {self.replay.logs}")


def _with_needs(jobs: Mapping[str, Any], job_id: str) -> set[str]:
    """``job_id`` and every job it needs, directly or not."""
    found, todo = set(), [job_id]
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            todo.extend(replay_plan.needs_of(jobs[current]))
    return found


def parser(prog: str = "python -m release.ci.replay") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The replay's options (also those of `python -m release ci --replay`)."""
    p.add_argument(
        "--channel",
        help="the manual run's channel, one of the workflow's choices (default: its default)",
    )
    p.add_argument(
        "--job", help="replay this job only; the jobs it needs are taken from --from-run"
    )
    p.add_argument(
        "--event",
        choices=["workflow_dispatch", "pull_request"],
        default="workflow_dispatch",
        help="the event replayed (default: a manual run)",
    )
    p.add_argument(
        "--secrets",
        type=Path,
        help="NAME=value lines (NAME<<EOF blocks for PEM "
        "keys), mode 0600: the repository's secrets",
    )
    p.add_argument(
        "--wheels",
        type=Path,
        help="the cibuildwheel step's stand-in takes each "
        "entry's wheel from DIR (e.g. python -m release build's) instead of "
        "building on this host",
    )
    p.add_argument(
        "--gpu-records",
        type=Path,
        help="DIR holding gpu-records.tar, packed by "
        "--job gpu-gates on the GPU machine: the GPU job's artifact",
    )
    p.add_argument(
        "--from-run",
        type=Path,
        help="an earlier replay's folder: with --job, the artifacts of the jobs it needs",
    )
    p.add_argument(
        "--repo",
        type=Path,
        default=REPO_ROOT,
        help="the git repository cloned (default: this checkout)",
    )
    p.add_argument(
        "--commit",
        default="HEAD",
        help="the commit replayed (default: HEAD; uncommitted changes are never replayed)",
    )
    p.add_argument(
        "--work", type=Path, help="this run's folder (default: .activekv/ci-replay/runs/<time>)"
    )
    p.add_argument(
        "--runner-dir",
        type=Path,
        help="the self-hosted runners' folder kept "
        "between runs: state, TUF folder, devpi, tool cache (default: "
        ".activekv/ci-replay/runner)",
    )
    p.add_argument(
        "--tool-cache",
        type=Path,
        help="the self-hosted runners' tool cache: setup-python's interpreters and what the "
        "jobs pip-installed into them (default: <runner-dir>/toolcache)",
    )


def replay_from_arguments(args: argparse.Namespace) -> int:
    from release.ci.refusals import release_target
    from release.ci.workflow import drift, parse
    from release.manifest import load_manifest

    repository = args.repo.resolve()
    commit = _git(repository, "rev-parse", "--verify", f"{args.commit}^{{commit}}")
    base = REPO_ROOT / ".activekv" / "ci-replay"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    work = (args.work or base / "runs" / stamp).resolve()
    if work.exists() and any(work.iterdir()):
        raise ReleaseError(f"--work {work}: expected a new or empty folder")
    work.mkdir(parents=True, exist_ok=True)
    runner_dir = (args.runner_dir or base / "runner").resolve()
    runner_dir.mkdir(parents=True, exist_ok=True)
    for option, folder in (
        ("--wheels", args.wheels),
        ("--gpu-records", args.gpu_records),
        ("--from-run", args.from_run),
    ):
        if folder is not None and not folder.is_dir():
            raise ReleaseError(f"{option} {folder}: expected a folder")
    secrets = read_secrets(args.secrets) if args.secrets else {}

    plan = work / "plan"  # the commit's manifest and workflow, as the jobs will see them
    subprocess.run(
        ["git", "clone", "--quiet", "--no-checkout", str(repository), str(plan)], check=True
    )
    _git(plan, "checkout", "--quiet", "--detach", commit)
    manifest = load_manifest(plan / "manifests" / "activekv.toml")
    ci = manifest.ci
    if ci is None:
        raise ReleaseError(f"{manifest.path}: ci: expected a [ci] table to replay")
    workflow_path = plan / ci.workflow
    origin = f"{ci.workflow} at {commit[:12]}"
    workflow = parse(workflow_path.read_text(), origin)
    replay_plan.check_keys(workflow, origin)
    for problem in drift(manifest, workflow_path.read_text(), origin):
        print(f"warning: {problem} (the committed workflow is what CI runs, and what is replayed)")
    inputs = replay_plan.dispatch_inputs(workflow, args.channel, origin)
    if args.event == "pull_request":
        inputs = {}
    index = None
    if ci.release is not None:
        target = release_target(manifest, ci.release)
        index = (target.index, target.tuf_url)
    if _git(repository, "status", "--porcelain", "--untracked-files=no"):
        print(f"note: {repository} has uncommitted changes; the replay runs {commit[:12]} only")
    replay = Replay(
        repository,
        commit,
        work,
        runner_dir,
        args.event,
        inputs,
        wheels=args.wheels.resolve() if args.wheels else None,
        gpu_records=args.gpu_records.resolve() if args.gpu_records else None,
        tool_cache_dir=args.tool_cache.resolve() if args.tool_cache else None,
    )
    from_run = args.from_run.resolve() if args.from_run else None
    runner = WorkflowReplay(replay, workflow, origin, secrets, index, args.job, from_run)
    try:
        return runner.run()
    finally:
        runner.out.close()


def main(argv: Sequence[str] | None = None, prog: str = "python -m release.ci.replay") -> int:
    """The replay's command line (also `python -m release ci --replay`'s, with its `prog`)."""
    args = parser(prog).parse_args(argv)
    try:
        return replay_from_arguments(args)
    except (ReleaseError, RefusedError, StandInError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
