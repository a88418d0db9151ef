"""`python -m release ci`: the workflow generator lives in release/ci/ (workflow, jobs, actions,
refusals); this module keeps the name release/steps.py and the tests import it by."""

from __future__ import annotations

from release.ci.actions import CHECKOUT
from release.ci.jobs import (
    ALWAYS,
    GPU_RECORDS,
    RELEASE_RUNNER_ACCEPTED,
    SELF_HOSTED_ACCEPTED,
    gpu_condition,
    secret_names,
)
from release.ci.workflow import (
    SCHEMA_NAME,
    ci_settings,
    drift,
    generate,
    parse,
    render,
    schema_problems,
    write_workflow,
    yaml,
)

__all__ = [
    "ALWAYS", "CHECKOUT", "GPU_RECORDS", "RELEASE_RUNNER_ACCEPTED", "SCHEMA_NAME",
    "SELF_HOSTED_ACCEPTED", "ci_settings", "drift", "generate", "gpu_condition", "parse",
    "render", "schema_problems", "secret_names", "write_workflow", "yaml",
]  # fmt: skip
