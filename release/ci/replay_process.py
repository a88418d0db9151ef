"""A command of a replayed step: run in its own process group, every line of its output masked
and printed as it comes, and the group ended (terminate, then kill) when the replay is stopped
(Ctrl-C) or the step runs past its time."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from release.ci.replay_context import JobState, StandInError

_STOP_GRACE_S = 10


def stream(
    command: Sequence[str],
    state: JobState,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
) -> int:
    """The exit status of ``command`` (its output printed through the job's mask)."""
    process = subprocess.Popen(
        list(command),
        cwd=cwd or state.workspace,
        env=dict(env or state.step_env()),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        errors="replace",
        text=True,
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:
            state.say(line.rstrip("\n"))
        return process.wait(timeout=timeout)
    except BaseException:  # Ctrl-C, a timeout: the step's whole process group goes with it
        _end_group(process)
        raise


def _end_group(process: subprocess.Popen[str]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=_STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def quiet(command: Sequence[str], state: JobState, **kwargs: object) -> None:
    """``command`` run through :func:`stream`; a failure is a StandInError naming it."""
    status = stream(command, state, **kwargs)  # type: ignore[arg-type]
    if status != 0:
        raise StandInError(f"{' '.join(command[:4])} ... exited {status}")
