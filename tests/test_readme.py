"""README.md's two commands are what .ci/run runs, with the pins pyproject.toml declares."""

from __future__ import annotations

import re
from pathlib import Path

from release.util.pins import dependency_group

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
CI_RUN = (REPO / ".ci" / "run").read_text()


def _commands(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_gives_the_main_job_and_the_test_command():
    blocks = re.findall(r"```sh\n(.*?)```", README, flags=re.DOTALL)
    commands = [command for block in blocks for command in _commands(block)]
    assert "nox -s release" in commands
    assert "nox -s tests" in commands


def test_ci_runs_the_readme_test_command_last():
    assert _commands(CI_RUN)[-1] == "nox -s tests"


def test_nox_pin_is_the_one_pyproject_declares():
    (pin,) = dependency_group("nox")
    assert f"pip install {pin}" in README
    assert f"pip install --quiet {pin}" in CI_RUN


def test_ci_installs_the_debian_packages_the_readme_names():
    readme_packages = re.search(r"apt-get install -y ([\w\- ]+?)\s+#", README)
    assert readme_packages is not None
    for package in readme_packages.group(1).split():
        assert package in CI_RUN
