"""One job of the workflow (one matrix entry), replayed step by step as a runner runs it.

Each ``run:`` step is written to a file and run verbatim with ``bash -e FILE`` (Actions' default
shell on Linux) in the job's workspace, with the runner's environment, the job's ``env:`` and the
step's, every ``${{ }}`` evaluated for the case at hand. After each step, ``$GITHUB_ENV``,
``$GITHUB_OUTPUT`` and ``$GITHUB_PATH`` are read as Actions reads them. A step's ``if:`` is
evaluated (a form the replay cannot evaluate stops the replay naming the job and step); without
a status function, a step runs only while no earlier step failed; ``continue-on-error`` turns a
failure into a success for the job. A ``uses:`` step runs its stand-in (replay_standins.py) and
the cibuildwheel step its host replay (replay_cibuildwheel.py), each saying so.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release.ci import replay_cibuildwheel, replay_envfiles, replay_standins
from release.ci.replay_context import JobState, RefusedError, StandInError
from release.ci.replay_expressions import (
    ExpressionError,
    Status,
    condition,
    interpolate,
    interpolate_value,
    to_string,
)
from release.ci.replay_process import stream

FILE_COMMANDS = ("GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_PATH", "GITHUB_STEP_SUMMARY")


@dataclass
class StepResult:
    title: str
    outcome: str  # success, failure, skipped
    conclusion: str  # the outcome after continue-on-error
    seconds: float
    note: str = ""


@dataclass
class JobResult:
    job_id: str
    name: str
    result: str  # success, failure, skipped
    seconds: float = 0.0
    steps: list[StepResult] = field(default_factory=list)
    note: str = ""


def step_title(step: Mapping[str, Any], contexts: Mapping[str, Any]) -> str:
    if "name" in step:
        return interpolate(str(step["name"]), contexts)
    if "uses" in step:
        return f"Run {step['uses']}"
    return f"Run {str(step['run']).strip().splitlines()[0]}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:60] or "step"


def _expression(where: str, error: ExpressionError) -> RefusedError:
    return RefusedError(
        f"{where}: {error} (the replay evaluates only the forms the generator "
        "writes; it never guesses)"
    )


def run_job(
    state: JobState, job_id: str, job: Mapping[str, Any], contexts: dict[str, Any]
) -> JobResult:
    """Every step of ``job`` in ``state``'s workspace; the job's result."""
    started = time.monotonic()
    result = JobResult(job_id, state.name, "success")
    failed = False
    steps_context: dict[str, Any] = {}
    for index, step in enumerate(job.get("steps", [])):
        where = f"jobs.{job_id}.steps[{index}]"
        contexts = {**contexts, "env": dict(state.env), "steps": steps_context}
        try:
            title = step_title(step, contexts)
        except ExpressionError as error:
            raise _expression(f"{where}.name", error) from None
        where = f"{where} ({title})"
        status = Status(failed=failed)
        try:
            runs = condition(str(step["if"]), contexts, status) if "if" in step else not failed
        except ExpressionError as error:
            raise _expression(f"{where}: if", error) from None
        if not runs:
            reason = f"if: {step['if']}" if "if" in step else "an earlier step failed"
            state.say(f"- {title}: skipped ({reason})")
            result.steps.append(StepResult(title, "skipped", "skipped", 0.0, reason))
            _record(steps_context, step, "skipped", "skipped", {})
            continue
        outcome, outputs, seconds = _run_step(state, step, contexts, index, where, title)
        tolerate = step.get("continue-on-error", False)
        if isinstance(tolerate, str):
            tolerate = to_string(interpolate(tolerate, contexts)).lower() == "true"
        conclusion = "success" if outcome == "success" or tolerate else "failure"
        note = "continue-on-error: the job goes on" if outcome != conclusion else ""
        mark = "ok" if outcome == "success" else "FAILED"
        state.say(f"= {title}: {mark} in {seconds:.0f} s{f' ({note})' if note else ''}")
        result.steps.append(StepResult(title, outcome, conclusion, seconds, note))
        _record(steps_context, step, outcome, conclusion, outputs)
        failed = failed or conclusion == "failure"
    result.result = "failure" if failed else "success"
    result.seconds = time.monotonic() - started
    return result


def _record(
    steps_context: dict[str, Any],
    step: Mapping[str, Any],
    outcome: str,
    conclusion: str,
    outputs: Mapping[str, str],
) -> None:
    if "id" in step:
        steps_context[str(step["id"])] = {
            "outcome": outcome,
            "conclusion": conclusion,
            "outputs": dict(outputs),
        }


def _run_step(
    state: JobState,
    step: Mapping[str, Any],
    contexts: Mapping[str, Any],
    index: int,
    where: str,
    title: str,
) -> tuple[str, dict[str, str], float]:
    started = time.monotonic()
    files = state.temp / "_runner_file_commands" / f"{index:02d}"
    shutil.rmtree(files, ignore_errors=True)
    files.mkdir(parents=True)
    commands = {name: files / name.lower() for name in FILE_COMMANDS}
    for path in commands.values():
        path.touch()
    try:
        step_env = {
            str(k): to_string(interpolate_value(v, contexts))
            for k, v in (step.get("env") or {}).items()
        }
    except ExpressionError as error:
        raise _expression(f"{where}: env", error) from None
    env = state.step_env({**step_env, **{name: str(path) for name, path in commands.items()}})
    state.say(f"> {title}")
    try:
        if "uses" in step:
            status = _uses(state, step, contexts, where)
        else:
            status = _run(state, step, contexts, env, index, where)
    except StandInError as error:
        state.say(f"error: {error}")
        status = 1
    outputs: dict[str, str] = {}
    try:
        state.env.update(replay_envfiles.read_assignments(commands["GITHUB_ENV"]))
        outputs = replay_envfiles.read_assignments(commands["GITHUB_OUTPUT"])
        state.prepend_path(replay_envfiles.read_path_entries(commands["GITHUB_PATH"]))
    except replay_envfiles.EnvFileError as error:
        state.say(f"error: {error}")
        status = status or 1
    return ("success" if status == 0 else "failure"), outputs, time.monotonic() - started


def _run(
    state: JobState,
    step: Mapping[str, Any],
    contexts: Mapping[str, Any],
    env: dict[str, str],
    index: int,
    where: str,
) -> int:
    try:
        script = interpolate(str(step["run"]), contexts)
    except ExpressionError as error:
        raise _expression(f"{where}: run", error) from None
    if replay_cibuildwheel.is_cibuildwheel_step(script):
        replay_cibuildwheel.replay_step(state, script, env, where)
        return 0
    path = state.temp / f"step-{index:02d}.sh"
    path.write_text(script if script.endswith("\n") else script + "\n")
    return stream(["bash", "-e", str(path)], state, env=env, cwd=state.workspace)


def _uses(state: JobState, step: Mapping[str, Any], contexts: Mapping[str, Any], where: str) -> int:
    uses = str(step["uses"])
    stand_in = replay_standins.stand_in_for(uses, where)
    try:
        inputs = interpolate_value(dict(step.get("with") or {}), contexts)
    except ExpressionError as error:
        raise _expression(f"{where}: with", error) from None
    replay_standins.check_inputs(stand_in, inputs, where)
    state.say(f"stand-in for {stand_in.pin.repo} ({stand_in.pin.tag}): {stand_in.says}")
    stand_in.run(state, inputs)
    return 0


def fresh_folder(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
