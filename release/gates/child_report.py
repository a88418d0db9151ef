"""The report file a gate's child process leaves (an interpreter the pipeline does not control:
the casters scanner, the served-path driver), read back with the child's output quoted when it
is missing or is not JSON. Never the child's stdout: a module it imports may print there."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def output_tail(run: subprocess.CompletedProcess[str], lines: int) -> str:
    """The last `lines` lines of the child's stdout and stderr, quoted for a failure."""
    stdout = "\n".join(run.stdout.strip().splitlines()[-lines:])
    stderr = "\n".join(run.stderr.strip().splitlines()[-lines:])
    return f"stdout: {stdout!r}; stderr: {stderr!r}"


def read_child_report(
    report: Path, run: subprocess.CompletedProcess[str], child: str, error: type[Exception],
    lines: int,
) -> object:  # fmt: skip
    """The JSON value the `child` ("scanner", "driver") wrote to `report`; `error` quoting the
    last `lines` of its output when it wrote none, or something that is not JSON."""
    try:
        return json.loads(report.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(
            f"the {child} exited {run.returncode} without writing its report {report.name}; "
            f"{output_tail(run, lines)}"
        ) from None
    except (OSError, ValueError) as problem:
        raise error(
            f"expected a JSON report from the {child}, {report.name} is not: {problem}; "
            f"{output_tail(run, lines)}"
        ) from None
