"""What a replay runs, read from the workflow file: its jobs in ``needs:`` order, each matrix
expanded as Actions expands it, the manual run's inputs checked against the workflow's own
choices, and every key of a job or step one the replay knows how to run (another is refused,
naming it, rather than skipped)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from graphlib import CycleError, TopologicalSorter
from typing import Any

from release.ci.replay_context import RefusedError

# Keys of a job and of a step the replay runs as Actions does; `concurrency`, `permissions` and
# `environment` have no effect on one machine and one replay (the replay prints that).
JOB_KEYS = frozenset(
    {
        "name",
        "needs",
        "if",
        "runs-on",
        "environment",
        "concurrency",
        "env",
        "steps",
        "strategy",
        "permissions",
    }
)
STEP_KEYS = frozenset({"name", "id", "if", "uses", "with", "run", "env", "continue-on-error"})
WORKFLOW_KEYS = frozenset({"name", "on", "permissions", "concurrency", "jobs"})
STRATEGY_KEYS = frozenset({"matrix", "fail-fast", "max-parallel"})
GPU_LABEL = "gpu"  # a self-hosted job whose labels hold it needs this machine's GPU


def needs_of(job: Mapping[str, Any]) -> list[str]:
    needs = job.get("needs", [])
    return [needs] if isinstance(needs, str) else list(needs)


def labels(job: Mapping[str, Any]) -> list[str]:
    runs_on = job.get("runs-on", [])
    return [runs_on] if isinstance(runs_on, str) else [str(label) for label in runs_on]


def self_hosted(job: Mapping[str, Any]) -> bool:
    return "self-hosted" in labels(job)


def needs_gpu(job: Mapping[str, Any]) -> bool:
    return self_hosted(job) and GPU_LABEL in labels(job)


def check_keys(workflow: Mapping[str, Any], origin: str) -> None:
    """RefusedError naming the first job or step key the replay does not run."""
    unknown = sorted(set(workflow) - WORKFLOW_KEYS)
    if unknown:
        raise RefusedError(f"{origin}: {', '.join(unknown)}: not a key the replay runs")
    jobs = workflow.get("jobs")
    if not isinstance(jobs, Mapping) or not jobs:
        raise RefusedError(f"{origin}: jobs: expected a mapping of jobs; got {type(jobs).__name__}")
    for job_id, job in jobs.items():
        unknown = sorted(set(job) - JOB_KEYS)
        if unknown:
            raise RefusedError(
                f"{origin}: jobs.{job_id}: {', '.join(unknown)}: not a key the replay runs"
            )
        unknown = sorted(set(job.get("strategy", {})) - STRATEGY_KEYS)
        if unknown:
            raise RefusedError(
                f"{origin}: jobs.{job_id}.strategy: {', '.join(unknown)}: not a key the replay runs"
            )
        for index, step in enumerate(job.get("steps", [])):
            where = f"{origin}: jobs.{job_id}.steps[{index}]"
            unknown = sorted(set(step) - STEP_KEYS)
            if unknown:
                raise RefusedError(f"{where}: {', '.join(unknown)}: not a key the replay runs")
            if ("run" in step) == ("uses" in step):
                raise RefusedError(
                    f"{where}: expected run or uses; got {'both' if 'run' in step else 'neither'}"
                )


def job_order(jobs: Mapping[str, Mapping[str, Any]], origin: str) -> list[str]:
    """The job ids in ``needs:`` order; among jobs ready together, the file's order."""
    for job_id, job in jobs.items():
        for need in needs_of(job):
            if need not in jobs:
                raise RefusedError(
                    f"{origin}: jobs.{job_id}.needs: {need!r} is not a job of "
                    f"the workflow ({', '.join(jobs)})"
                )
    sorter = TopologicalSorter({job_id: needs_of(job) for job_id, job in jobs.items()})
    position = {job_id: index for index, job_id in enumerate(jobs)}
    try:
        sorter.prepare()
    except CycleError as error:
        raise RefusedError(
            f"{origin}: jobs: the needs form a cycle: {' -> '.join(error.args[1])}"
        ) from None
    order: list[str] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=position.__getitem__)
        order.extend(ready)
        sorter.done(*ready)
    return order


def expand_matrix(strategy: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The matrix's combinations as Actions makes them: the product of its keys, less each
    ``exclude`` (partial match), then each ``include`` added to every combination whose original
    values it does not change, or as a combination of its own where it fits none."""
    matrix = dict((strategy or {}).get("matrix") or {})
    include: Sequence[Mapping[str, Any]] = matrix.pop("include", []) or []
    exclude: Sequence[Mapping[str, Any]] = matrix.pop("exclude", []) or []
    keys = list(matrix)
    combos: list[dict[str, Any]] = (
        [dict(zip(keys, values, strict=True)) for values in itertools.product(*matrix.values())]
        if keys
        else []
    )
    combos = [
        c
        for c in combos
        if not any(all(c.get(k) == v for k, v in rule.items()) for rule in exclude)
    ]
    originals = [dict(c) for c in combos]
    added: list[dict[str, Any]] = []
    for entry in include:
        fitted = False
        for combo, original in zip(combos, originals, strict=True):
            if all(original.get(k, v) == v for k, v in entry.items() if k in original):
                combo.update(entry)
                fitted = True
        if not fitted:
            added.append(dict(entry))
    return (combos + added) or [{}]


def dispatch_inputs(
    workflow: Mapping[str, Any], channel: str | None, origin: str
) -> dict[str, str]:
    """The manual run's inputs: ``channel`` one of the workflow's own choices (its default
    when not given)."""
    triggers = workflow.get("on") or {}
    dispatch = triggers.get("workflow_dispatch") if isinstance(triggers, Mapping) else None
    if not isinstance(dispatch, Mapping):
        raise RefusedError(f"{origin}: on.workflow_dispatch: expected a manual trigger to replay")
    spec = (dispatch.get("inputs") or {}).get("channel") or {}
    options = [str(option) for option in spec.get("options", [])]
    chosen = channel or str(spec.get("default", ""))
    if options and chosen not in options:
        raise RefusedError(
            f"--channel {chosen}: expected one of the workflow's choices {options} "
            f"({origin}: on.workflow_dispatch.inputs.channel.options, from the manifest's "
            f"ci.channels); to replay {chosen}, commit a manifest whose ci.channels lists it and "
            "the workflow `python -m release ci` writes from it (docs/ci.md, Releasing stable "
            "from CI), and replay that commit with --commit"
        )
    return {"channel": chosen}
