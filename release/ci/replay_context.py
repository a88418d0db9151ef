"""What a replayed job runs in: its folders, its environment as each step sees it, and the
printer every line of output goes through (masked, and kept in the job's log).

* ``Replay``: one replay of the workflow: the repository and commit it clones, the run's folder
  (workspaces, artifacts, logs), the self-hosted runners' folder kept between runs, and what
  the operator stood in for a job (``--wheels``, ``--gpu-records``);
* ``JobState``: one job of it: the workspace (the clone), ``$RUNNER_TEMP``, the variables of
  every later step (``$GITHUB_ENV``), the folders before ``PATH`` (``$GITHUB_PATH``,
  setup-python), and its log.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from release.ci.replay_secrets import Masker
from release.errors import ReleaseError

# The PATH of a fresh runner: the system's folders, none of this shell's virtual environments
# or pyenv shims (setup-python puts the interpreters a job asks for first).
RUNNER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Of this shell's environment, what a runner's process also has; everything else (a virtual
# environment, ACTIVEKV_*, GITHUB_*, PYTHONPATH) stays out of the jobs.
_KEPT = (
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TERM",
    "TZ",
    "TMPDIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
)
_KEPT_PREFIXES = ("PIP_",)  # this machine's package index, as a runner's pip is configured


class StandInError(ReleaseError):
    """A stand-in could not do what its action does; the step fails with this line."""


class RefusedError(ReleaseError):
    """The workflow holds something the replay cannot run as written (an unknown action, a
    condition it cannot evaluate); nothing is guessed, and the replay stops naming it."""


def runner_base_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a runner's process gives every job here."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if k in _KEPT or k.startswith(_KEPT_PREFIXES)}
    env["PATH"] = RUNNER_PATH
    return env


@dataclass(frozen=True)
class Replay:
    """One replay: where it clones from, where it works, what the operator stood in."""

    repository: Path  # the git repository each checkout clones
    commit: str  # the full commit id every job checks out
    work: Path  # this run's folder: jobs/, artifacts/, logs/
    runner_dir: Path  # kept between runs: the release runner's state, TUF folder, index, tools
    event: str  # github.event_name of the replayed run
    inputs: dict[str, str]  # the manual run's inputs (channel)
    wheels: Path | None = None  # --wheels: the wheels the cibuildwheel step stands in with
    gpu_records: Path | None = None  # --gpu-records: the GPU job's packed records
    tool_cache_dir: Path | None = None  # --tool-cache, else the runner folder's

    @property
    def artifacts(self) -> Path:
        return self.work / "artifacts"

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    @property
    def tool_cache(self) -> Path:
        """A self-hosted runner's tool cache (setup-python's interpreters), kept between runs."""
        return self.tool_cache_dir or self.runner_dir / "toolcache"


Printer = Callable[[str], None]


@dataclass
class JobState:
    """One job while it runs: its folders, and what earlier steps left for the later ones."""

    name: str  # the job id, with the matrix entry's values (wheels (3.10, x86_64))
    slug: str  # the same as a folder name
    replay: Replay
    self_hosted: bool
    workspace: Path
    temp: Path
    env: dict[str, str]  # the runner's, the job's, and what $GITHUB_ENV set since
    masker: Masker
    print_line: Printer
    path_prefix: list[str] = field(default_factory=list)  # before PATH, the first first
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)  # steps.<id>.outputs

    def prepend_path(self, folders: list[str]) -> None:
        """Folders before PATH for every later step (the first of `folders` first)."""
        self.path_prefix = [*folders, *(p for p in self.path_prefix if p not in folders)]

    def step_env(self, extra: Mapping[str, str] = {}) -> dict[str, str]:
        env = {**self.env, **extra}
        env["PATH"] = ":".join([*self.path_prefix, env.get("PATH", RUNNER_PATH)])
        return env

    def say(self, text: str) -> None:
        """A line of the replay's own (a stand-in saying what it does), masked."""
        for line in text.splitlines() or [""]:
            self.print_line(self.masker(line))
