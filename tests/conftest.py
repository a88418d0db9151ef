"""Helpers shared by the tests, and the split between unit and integration tests.

A test is `integration` when it builds or installs the real wheel (it asks for one of
WHEEL_FIXTURES) or its module says so (`pytestmark`: real servers, compilers, pip, chromium);
every other test is a unit test. `nox -s tests` runs both; `nox -s unit` (pytest -m "not
integration") is the edit loop's profile.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from release.builder.toolchain import find_zig
from release.errors import BuildError
from release.util.private_site import wheel_for_this_interpreter
from tests.ci_manifests import (  # noqa: F401 (fixtures of the CI tests)
    committed,
    dev_manifest,
    dev_workflow,
    stable_ready,
    stable_workflow,
)


def zig_binary() -> Path | None:
    """The pinned zig, or None where the `build` dependency group is not installed."""
    try:
        return find_zig()
    except BuildError:
        return None


REPO = Path(__file__).resolve().parent.parent
# The compilers' caches the wheel builds of the tests share (built_wheel, the release run).
BUILD_CACHE = REPO / ".activekv" / "cache"


def run_tool(*command: str | Path) -> str:
    """Runs a compiler or binutils command; its stdout, or an assertion naming its stderr.

    zig keeps the libc++ and libc stubs it builds for a target in its caches: these are the wheel
    builds' (toolchain.environment), so they are built once per run, not again for each test
    (a cold zig cache costs about a minute of two cores). Caches already set are kept."""
    caches = {"ZIG_GLOBAL_CACHE_DIR": str(BUILD_CACHE / "zig-global"),
              "ZIG_LOCAL_CACHE_DIR": str(BUILD_CACHE / "zig-local")}  # fmt: skip
    result = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, env={**caches, **os.environ}
    )
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


# Fixtures that build, install or import the real wheel, or compile a native module: a test using
# one is an integration test.
WHEEL_FIXTURES = frozenset(
    {"built_wheel", "engine_site", "engine_module", "activekv_site", "missing_caster_wheel"}
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        wheel = WHEEL_FIXTURES & set(getattr(item, "fixturenames", ()))
        if wheel or item.get_closest_marker("e2e") or item.get_closest_marker("remote_index"):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel for the running interpreter, built once per test session.

    `ACTIVEKV_TEST_WHEEL` names a prebuilt wheel, or a folder of them, to use instead. Otherwise
    it is built with `python -m release build --python X.Y` into a temporary output, sharing the
    checkout's compiler and wheel caches (`.activekv/cache`), so an unchanged tree is not
    compiled again.
    """
    if given := os.environ.get("ACTIVEKV_TEST_WHEEL"):
        path = Path(given).resolve()
        if path.is_dir():  # a folder of built wheels: the one this interpreter installs
            return wheel_for_this_interpreter(sorted(path.glob("*.whl")))
        return path
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    work = tmp_path_factory.mktemp("engine-wheel")
    out = work / "out"
    env = dict(os.environ, ACTIVEKV_CACHE_DIR=str(REPO / ".activekv" / "cache"))
    command = [sys.executable, "-m", "release", "build", "--python", version, "--out", str(out),
               "--state-dir", str(work / "state")]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    (wheel,) = sorted((out / "wheels").glob("activekv-*.whl"))
    return wheel


@pytest.fixture(scope="session")
def engine_site(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built wheel installed into a private folder (what the parity gate does too)."""
    from fixtures_replay import install_wheel

    return install_wheel(built_wheel, tmp_path_factory.mktemp("engine-site"))


@pytest.fixture(scope="session")
def engine_module(engine_site: Path) -> ModuleType:
    """`activekv._engine` imported from the built wheel, never from anywhere else."""
    from fixtures_replay import engine_implementation

    return engine_implementation(engine_site).module


@pytest.fixture(scope="session")
def activekv_site(engine_site: Path) -> Path:
    """The wheel under test, importable (and its entry points visible) in this process: its
    private folder goes first on sys.path (once; it stays there for the session)."""
    if str(engine_site) not in sys.path:
        sys.path.insert(0, str(engine_site))
    return engine_site
