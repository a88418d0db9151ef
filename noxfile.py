"""Sessions of the ActiveKV pipeline: each is one call into `release/`; pins live in pyproject."""

from __future__ import annotations

import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent))
from release.util.interpreters import find_interpreter  # stdlib and packaging, which nox has

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]

ROOT = Path(__file__).resolve().parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
MANIFEST = ROOT / "manifests" / "activekv.toml"
# The interpreter of the stable-ABI wheel (the manifest's build.stable_abi_from): the release
# and the vLLM tests run in it, so vLLM's classes meet the wheel every newer Python installs.
ABI3_PYTHON = nox.project.load_toml(MANIFEST)["build"]["stable_abi_from"]


def _interpreter(version: str) -> str:
    """A working pythonX.Y, pyenv installs included (pyenv's shims fail for unselected ones)."""
    found = find_interpreter(version)
    return str(found) if found else version


def _install(session: nox.Session, *groups: str) -> None:
    session.install(*nox.project.dependency_groups(PYPROJECT, *groups))


@nox.session
def wheels(session: nox.Session) -> None:
    """Build one manylinux wheel per declared Python version (`python -m release build`)."""
    _install(session, "build", "release")
    session.run("python", "-m", "release", "build", *session.posargs)


@nox.session(python=_interpreter(ABI3_PYTHON))
def release(session: nox.Session) -> None:
    """Build, gate, sign, publish to the embedded index and verify a release (the main job).

    Channel dev by default; `-- --channel stable --key-dir DIR` releases on stable. A channel
    whose manifest entry requires the served-path gate gets the pinned vLLM installed for it."""
    _install(session, "build", "release")
    channel = _requires_served_path(session.posargs)
    if channel is not None:
        session.log(f"{channel} requires the served-path gate: installing the pinned vLLM into "
                    "this session, as nox -s vllm does")  # fmt: skip
        _install(session, "vllm")
    session.run("python", "-m", "release", "run", *session.posargs)


def _option(arguments: list[str], name: str) -> str | None:
    """The value of option `name` among a session's arguments (None when not given)."""
    for index, argument in enumerate(arguments):
        if argument.startswith(f"{name}="):
            return argument.split("=", 1)[1]
        if argument == name and index + 1 < len(arguments):
            return arguments[index + 1]
    return None


def _requires_served_path(arguments: list[str]) -> str | None:
    """The run's channel (--channel, else the manifest's default) when the manifest it runs on
    (--manifest, else ours) makes that channel require the served-path gate; else None. An
    unknown channel or manifest is left for `python -m release run` to refuse, naming it."""
    path = _option(arguments, "--manifest")
    try:
        release = nox.project.load_toml(Path(path) if path else MANIFEST)["release"]
        channel = _option(arguments, "--channel") or release["default_channel"]
        requires = release["channels"][channel]["requires"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return channel if "served-path" in requires else None


@nox.session
def parity(session: nox.Session) -> None:
    """Replay the manifest's parity cells through the reference and the built engine."""
    _install(session, "build", "release")
    session.run("python", "-m", "release", "build")
    session.run("python", "-m", "release", "parity", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmark the engine's bookkeeping, and warm releases against a cold one, as ratios.

    The bookkeeping per layer-step against the reference (`-- --blocks N` goes to it); then
    `python -m release run` cold (fresh caches and state in a temporary folder), again with
    nothing changed and after a README-only change (release/bench/warm_runs.py, docs/reuse.md)."""
    _install(session, "build", "release")
    session.run("python", "-m", "release", "build")
    session.run("python", "-m", "release", "bench", *session.posargs)
    session.run("python", "-m", "release.bench.warm_runs")


@nox.session
def reproduce(session: nox.Session) -> None:
    """Build every wheel twice from two source copies and require them identical."""
    _install(session, "build", "release")
    session.run("python", "-m", "release", "reproduce", *session.posargs)


@nox.session(name="gpu-gates")
def gpu_gates(session: nox.Session) -> None:
    """Run the GPU gates (warm-up under CUPTI, GPU parity) on the built wheels.

    `-- --wheel W` judges given wheels; without a GPU each records "not run: no GPU runner"."""
    _install(session, "build", "release")
    if not session.posargs:
        session.run("python", "-m", "release", "build")
    session.run("python", "-m", "release", "gpu-gates", *session.posargs)


@nox.session(name="gpu-staging")
def gpu_staging(session: nox.Session) -> None:
    """Benchmark the CUDA route's staging against this GPU's copy baselines.

    Writes `<out>/gpu-staging.json`."""
    _install(session, "build", "release")
    session.run("python", "-m", "release", "build")
    session.run("python", "-m", "release", "gpu-staging", *session.posargs)


@nox.session(python=_interpreter(ABI3_PYTHON))
def vllm(session: nox.Session) -> None:
    """Test the connector inside the pinned vLLM on CPU, and run the served-path gate.

    Plugin, factory, both connector roles and the citations, with vLLM's own classes."""
    _install(session, "vllm", "test")
    session.run("python", "-m", "release", "build", "--python", ABI3_PYTHON)
    session.run("python", "-m", "release", "served-path", *session.posargs)
    # The tests take the wheel of their interpreter from the folder just built.
    wheels = str(Path("out/wheels").resolve())
    session.run("pytest", "tests/with_vllm", env={"ACTIVEKV_TEST_WHEEL": wheels})


@nox.session
def sanitize(session: nox.Session) -> None:
    """Run the C++ tests under AddressSanitizer with UBSan, then under ThreadSanitizer."""
    _install(session, "build", "release")
    for sanitizer in ("asan-ubsan", "tsan"):
        session.run("python", "-m", "release", "cpp-tests", "--sanitizer", sanitizer)


@nox.session
def keygen(session: nox.Session) -> None:
    """Make an operator's stable keys or a GPU runner's attestation key.

    `-- --channel stable DIR --pin` (pins them in the manifest) or `-- --runner NAME DIR`; the
    GPU runner's dependency group is all it needs."""
    _install(session, "gpu-runner")
    session.run("python", "-m", "release", "keygen", *session.posargs)


@nox.session
def serve(session: nox.Session) -> None:
    """Serve the embedded index of the state directory on 127.0.0.1 until Ctrl-C."""
    _install(session, "release")
    session.run("python", "-m", "release", "serve", *session.posargs)


@nox.session
def unit(session: nox.Session) -> None:
    """Lint and run the unit tests, without wheel builds, servers or compilers (the edit loop)."""
    _install(session, "test")
    session.run("ruff", "check", "release", "tests", "reference", "cmake", "noxfile.py")
    session.run("pytest", "-m", "not integration", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the C++ tests, lint, then every pipeline test and the end-to-end release."""
    _install(session, "test")
    session.run("python", "-m", "release", "cpp-tests")
    session.run("ruff", "check", "release", "tests", "reference", "cmake", "noxfile.py")
    session.run("ruff", "format", "--check", "release", "tests", "reference", "cmake", "noxfile.py")
    session.run("pytest", "--durations=25", *session.posargs)
