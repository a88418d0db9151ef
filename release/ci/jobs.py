"""The jobs of the generated workflow.

* `wheels`: a matrix of (Python, arch) built by cibuildwheel with pyproject's
  `[tool.cibuildwheel]` (the settings tests/test_cibuildwheel_config.py keeps equal to the
  hermetic build), one wheel per entry, uploaded as an artefact. cibuildwheel is pip-installed
  at the build group's pin and run as a module, not through its action: every action here is
  pinned by commit, and a commit of the action's tag for that pin could not be read here;
* `gpu-gates`, where a channel of the workflow requires a GPU gate: on a self-hosted runner with
  the manifest's labels, for those channels only (never for a pull request), the GPU gates judge
  exactly those wheels (downloaded, never rebuilt), signed by the runner's own key, and upload
  their records (evidence, gpu-staging.json), also when a gate failed;
* `release`: on the self-hosted release runner (`[ci.release]`), after the wheels and the GPU
  job, whatever its gates said, never for a pull request: the CPU gates on the same wheels, then
  sign, publish (the TUF repository into the runner's `ACTIVEKV_TUF_DIR`, which its web server
  serves) and verify as a consumer from the index. No gate's exit status stops it: the evidence
  decides, as publish refuses unless every gate the channel requires passed on exactly these
  digests. The release report is uploaded whatever happened.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ruamel.yaml.comments import CommentedMap

from release.catalogue import ServedPathSettings, VllmInstall
from release.ci.actions import DOWNLOAD, SETUP_PYTHON, UPLOAD, block, checkout, run, uses
from release.ci.refusals import gpu_gates, release_target
from release.errors import ReleaseError
from release.manifest import CiSettings, Manifest
from release.records import GPU_STAGING_RECORD as GPU_STAGING
from release.trust.credential_names import ENV_PASSWORD, ENV_TOKEN, ENV_USERNAME
from release.trust.keys import tuf_key_name
from release.trust.pins import operator_signed
from release.trust.sign import signing_key_name
from release.trust.tuf_metadata import ROLES, TRUSTED_ROOT
from release.util.paths import SOURCE_ROOTS as WHEEL_SOURCES
from release.util.pins import pinned_version
from release.wheelset import version_tuple

WHEEL_ARTEFACT = "wheel-"
GPU_RECORDS = "gpu-records"  # the GPU job's evidence and gpu-staging.json, as one tar
EVENT = "github.event_name"
ALWAYS = "${{ !cancelled() }}"  # also after a failed step, so its evidence and report survive
# What each self-hosted runner holds, in its own environment (its `.env` file; docs/ci.md).
RUNNER_KEY = "ACTIVEKV_RUNNER_KEY"  # the GPU runner's attestation key (a PEM file path)
STATE_DIR = "ACTIVEKV_STATE_DIR"  # the release runner's state, kept between runs
TUF_DIR = "ACTIVEKV_TUF_DIR"  # the folder the release runner's web server serves
KEY_DIR = "ACTIVEKV_KEY_DIR"  # set by the key step: the channel's keys, from the secrets
KEYS_FOLDER = "activekv-keys"  # under $RUNNER_TEMP, which the runner empties for every job
INDEX_SECRETS = (ENV_TOKEN, ENV_USERNAME, ENV_PASSWORD)  # the index's credentials
# The release job's deployment environment: the secrets it reads are that environment's, and its
# protection rules (reviewers, the tags and branches it admits) gate every release.
ENVIRONMENT = "release"
# zizmor's findings for the self-hosted jobs, accepted where each declares its runner.
SELF_HOSTED_ACCEPTED = (
    "zizmor: ignore[self-hosted-runner] the GPU gates need the runner's GPU; the job never runs "
    "on a pull request (only on a push or a manual run)"
)
RELEASE_RUNNER_ACCEPTED = (
    "zizmor: ignore[self-hosted-runner] the release runner keeps the TUF folder its web server "
    "serves; the job never runs on a pull request"
)


def cibuildwheel_requirement() -> str:
    """The cibuildwheel the build group pins, as a pip requirement."""
    version = pinned_version("build", "cibuildwheel")
    if version is None:
        raise ReleaseError("pyproject.toml: dependency-groups.build: expected a cibuildwheel pin")
    return f"cibuildwheel=={version}"


def wheel_pythons(manifest: Manifest) -> list[str]:
    """The interpreters that build a wheel: each below the stable ABI, and the abi3 builder."""
    abi3 = version_tuple(manifest.build.stable_abi_from)
    below = [v for v in manifest.build.python if version_tuple(v) < abi3]
    return [*below, manifest.build.stable_abi_from]


def channel_expression(ci: CiSettings) -> str:
    """The channel of this run: a manual run's choice, else the tag's channel."""
    if ci.tag_channel is None:
        return "inputs.channel"
    return f"{EVENT} == 'workflow_dispatch' && inputs.channel || '{ci.tag_channel}'"


def _channel_env(ci: CiSettings) -> dict[str, str]:
    return {"CHANNEL": f"${{{{ {channel_expression(ci)} }}}}"}


def gpu_channels(manifest: Manifest, ci: CiSettings) -> list[str]:
    """The workflow's channels that require a GPU gate: the GPU job runs for these alone."""
    return [channel for channel in ci.channels if gpu_gates(manifest, channel)]


def gpu_condition(manifest: Manifest, ci: CiSettings) -> str:
    """A tag push of a channel that needs the GPU job, or a manual run of one; never a pull
    request (the runner holds a key the channels trust)."""
    needed = gpu_channels(manifest, ci)
    admitted = []
    if ci.tag_channel in needed:
        admitted.append(f"{EVENT} == 'push'")
    dispatch = f"{EVENT} == 'workflow_dispatch'"
    if len(needed) < len(ci.channels):
        dispatch = f"({dispatch} && contains(fromJSON('{json.dumps(needed)}'), inputs.channel))"
    admitted.append(dispatch)
    return f"${{{{ {' || '.join(admitted)} }}}}"


def wheels_job(manifest: Manifest, ci: CiSettings) -> dict[str, Any]:
    pythons = wheel_pythons(manifest)
    roots = " ".join(WHEEL_SOURCES)
    return {
        "name": "wheel for Python ${{ matrix.python }} on ${{ matrix.arch }}",
        "runs-on": ci.build_runner,
        "strategy": {
            "fail-fast": False,
            "matrix": {
                "python": pythons,
                "arch": [manifest.build.arch],
                "include": [{"python": v, "cpython": "cp" + v.replace(".", "")} for v in pythons],
            },
        },
        "steps": [
            checkout(history=True),
            run(
                "SOURCE_DATE_EPOCH: the last commit that changed what goes into a wheel",
                f'echo "SOURCE_DATE_EPOCH=$(git log -1 --format=%ct -- {roots})" >> "$GITHUB_ENV"',
            ),
            # cibuildwheel runs the build in its manylinux container; the host needs only it.
            uses(SETUP_PYTHON, python_version=manifest.build.stable_abi_from),
            run(
                "cibuildwheel, as the build group pins it",
                f'python -m pip install "{cibuildwheel_requirement()}"',
            ),
            run(
                "cibuildwheel with pyproject's [tool.cibuildwheel]",
                "python -m cibuildwheel --output-dir wheelhouse",
                env={
                    "CIBW_BUILD": "${{ matrix.cpython }}-manylinux_${{ matrix.arch }}",
                    "CIBW_ARCHS_LINUX": "${{ matrix.arch }}",
                    "CIBW_ENVIRONMENT_PASS_LINUX": "SOURCE_DATE_EPOCH",
                },
            ),
            uses(
                UPLOAD,
                "the wheel, as an artefact of this run",
                name=f"{WHEEL_ARTEFACT}${{{{ matrix.cpython }}}}-${{{{ matrix.arch }}}}",
                path="wheelhouse/*.whl",
                if_no_files_found="error",
            ),
        ],
    }


def _download_wheels() -> CommentedMap:
    return uses(
        DOWNLOAD,
        "the wheels built above, exactly",
        pattern=f"{WHEEL_ARTEFACT}*",
        merge_multiple=True,
        path="out/wheels",
    )


def _install(groups: list[str]) -> dict[str, Any]:
    flags = " ".join(f"--group {group}" for group in groups)
    return run(
        f"the pipeline's pinned dependency groups ({', '.join(groups)})",
        f"python -m pip install {flags}",
    )


def vllm_installs(manifest: Manifest) -> tuple[VllmInstall, ...]:
    """Each vLLM release the served-path gate judges, with its interpreter and dependency group
    (``[gates.served-path] installs``)."""
    gate = manifest.gates.get("served-path")
    return gate.installs if isinstance(gate, ServedPathSettings) else ()


def vllm_pythons(manifest: Manifest) -> str:
    """ACTIVEKV_VLLM_PYTHON for the served-path gate: the interpreter of each vLLM release,
    which setup-python put on the PATH (build.python lists them)."""
    return ":".join(f"python{install.python}" for install in vllm_installs(manifest))


def _vllm_install(install: VllmInstall) -> dict[str, Any]:
    index = f" --extra-index-url {install.extra_index_url}" if install.extra_index_url else ""
    return run(
        f"vLLM {install.version} into python{install.python}, for the served-path gate",
        f"python{install.python} -m pip install --group {install.group}{index}",
    )


def _pythons_last(versions: list[str], last: str) -> list[str]:
    """`versions` for setup-python, `last` last (it becomes the default python)."""
    return [*(v for v in versions if v != last), last]


def gpu_job(manifest: Manifest, ci: CiSettings) -> CommentedMap:
    job = CommentedMap()
    job["name"] = "GPU gates on the built wheels"
    job["needs"] = "wheels"
    # The self-hosted runner holds the key the channels trust for attestations: it runs for a
    # tag push or a manual run only, never for a pull request (not even a same-repository one,
    # whose code any collaborator may change).
    job["if"] = gpu_condition(manifest, ci)
    job["runs-on"] = ["self-hosted", *ci.gpu_runner_labels]
    job.yaml_add_eol_comment(SELF_HOSTED_ACCEPTED, "runs-on")
    job["env"] = _channel_env(ci)
    job["steps"] = [
        checkout(history=False),
        # Each wheel is judged in an interpreter of its version (the abi3 one in the oldest it
        # serves, or in gpu_python); the last one runs the gates.
        uses(
            SETUP_PYTHON,
            python_version=block(_pythons_last(wheel_pythons(manifest), ci.gpu_python)),
        ),
        _download_wheels(),
        _install(["gpu-runner"]),
        # The runner's own key (`python -m release keygen --runner`) signs the attestations;
        # it never leaves the runner, and its public key is in the channel's gpu attesters.
        run(
            "GPU gates",
            "wheels=()\n"
            'for wheel in out/wheels/*.whl; do wheels+=(--wheel "$wheel"); done\n'
            'python -m release gpu-gates --channel "$CHANNEL" '
            f'--attest-key "${{{RUNNER_KEY}:?set on the runner: its attestation key}}" '
            '"${wheels[@]}"',
        ),
        # One archive, so evidence/ and gpu-staging.json land where they were written.
        run(
            "pack the GPU records",
            f"records=(evidence)\n"
            f"if [ -f out/{GPU_STAGING}.json ]; then records+=({GPU_STAGING}.json); fi\n"
            f'tar -cf {GPU_RECORDS}.tar -C out "${{records[@]}}"',
            condition=ALWAYS,
        ),
        uses(
            UPLOAD,
            "the GPU records, also when a gate failed",
            condition=ALWAYS,
            name=GPU_RECORDS,
            path=f"{GPU_RECORDS}.tar",
            if_no_files_found="error",
        ),
    ]
    return job


def secret_names(channel: str) -> dict[str, str]:
    """The repository secrets that hold an operator-signed channel's keys (each the PEM file
    `keygen --channel` made), to the file name `--key-dir` reads each from."""
    names = {f"ACTIVEKV_{channel.upper().replace('-', '_')}_SIGNING_KEY": signing_key_name(channel)}
    names |= {f"ACTIVEKV_TUF_{role.upper()}_KEY": tuf_key_name(role) for role in ROLES}
    return names


def _runner_folders(tuf_url: str) -> dict[str, Any]:
    return run(
        "the release runner's folders",
        f': "${{{STATE_DIR}:?set on the release runner: the folder its pipeline state (generated '
        'keys, TUF caches) is kept in between runs}"\n'
        f': "${{{TUF_DIR}:?set on the release runner: the folder its web server serves at '
        f'{tuf_url}}}"',
    )


def _key_step(channel: str) -> dict[str, Any]:
    """The channel's keys, written from the secrets into a private folder of this job only."""
    secrets = secret_names(channel)
    pairs = " ".join(f"{secret}={name}" for secret, name in secrets.items())
    return run(
        f"the {channel} channel's keys, from the repository's secrets",
        # Every secret is checked before any file is written.
        f"pairs=({pairs})\n"
        'for pair in "${pairs[@]}"; do\n'
        '  secret="${pair%%=*}"\n'
        '  if [ -z "${!secret}" ]; then\n'
        '    echo "error: the repository secret $secret is not set: it holds ${pair#*=}.pem, as '
        f'\\`python -m release keygen --channel {channel}\\` made it" >&2\n'
        "    exit 1\n"
        "  fi\n"
        "done\n"
        f'keys="$RUNNER_TEMP/{KEYS_FOLDER}"\n'
        'rm -rf "$keys"\n'
        '(umask 077 && mkdir "$keys")\n'
        'for pair in "${pairs[@]}"; do\n'
        '  secret="${pair%%=*}"\n'
        '  (umask 077 && printf \'%s\\n\' "${!secret}" > "$keys/${pair#*=}.pem")\n'
        "done\n"
        f'echo "{KEY_DIR}=$keys" >> "$GITHUB_ENV"',
        condition=f"${{{{ env.CHANNEL == '{channel}' }}}}",
        env={secret: f"${{{{ secrets.{secret} }}}}" for secret in secrets},
    )


def _consumer_verify(manifest: Manifest, index: str, tuf_url: str) -> dict[str, Any]:
    """Verify as a consumer would, from the index and the TUF URL, trusting the root the
    publish wrote and the key that signed the statement; each declared Python installs."""
    pythons = " ".join(f"python{version}" for version in manifest.build.python)
    return run(
        "verify from the index, as a consumer",
        "version=\"$(python -c 'from release.util.pins import project_version; "
        "print(project_version())')\"\n"
        "interpreters=()\n"
        f"for python in {pythons}; do\n"
        '  path="$(command -v "$python")" || { echo "error: no $python on the release runner" '
        ">&2; exit 1; }\n"
        '  interpreters+=(--python "$path")\n'
        "done\n"
        f"python -m release verify --index {shlex.quote(index)} --tuf-url "
        f'{shlex.quote(tuf_url)} --root "${TUF_DIR}/metadata/{TRUSTED_ROOT}" '
        f'--provenance-key "out/provenance/{signing_key_name("$CHANNEL")}.pub.json" '
        f'--tuf-cache "${STATE_DIR}/consumer-tuf-cache" "${{interpreters[@]}}" '
        f'"{manifest.release.name}==$version"',
    )


def release_job(manifest: Manifest, ci: CiSettings) -> CommentedMap:
    release = ci.release
    assert release is not None  # refusals.check: the release runner is self-hosted
    target = release_target(manifest, release)
    cpu_gates = sorted(name for name, gate in manifest.gates.items() if gate.runner == "cpu")
    keyed = [c for c in ci.channels if release.keys == "secrets"
             and operator_signed(manifest, manifest.channel(c))]  # fmt: skip
    trust = f'--channel "$CHANNEL" --state-dir "${STATE_DIR}"'
    if keyed:
        trust += f' ${{{KEY_DIR}:+--key-dir "${KEY_DIR}"}}'
    target_options = "".join(
        f" --{key.replace('_', '-')} {shlex.quote(value)}" for key, value in target.options.items()
    )
    with_gpu = bool(gpu_channels(manifest, ci))
    records: list[Any] = []
    if with_gpu:
        records = [
            # Absent when the GPU job could not run: its gates then have no evidence, and a
            # channel that requires them refuses to publish.
            uses(DOWNLOAD, "the GPU records", continue_on_error=True, name=GPU_RECORDS, path="."),
            run(
                "unpack the GPU records",
                f"mkdir -p out\nif [ -f {GPU_RECORDS}.tar ]; then tar -xf {GPU_RECORDS}.tar -C "
                "out; fi",
            ),
        ]
    steps: list[Any] = [
        checkout(history=True),
        uses(SETUP_PYTHON, python_version=block(list(manifest.build.python))),
        _download_wheels(),
        *records,
        _runner_folders(target.tuf_url),
        *(_key_step(channel) for channel in keyed),
        _install(["build", "release"]),
        *(_vllm_install(i) for i in vllm_installs(manifest) if "served-path" in cpu_gates),
        # cibuildwheel made the wheels: record them as `python -m release build` would have.
        run("record the build", "python -m release record-build"),
        # The evidence, not a gate's exit status, decides what is published.
        *(
            run(
                f"{gate} gate on these wheels",
                f"python -m release {gate} {trust}",
                tolerate=True,
                env={"ACTIVEKV_VLLM_PYTHON": vllm_pythons(manifest)}
                if gate == "served-path"
                else None,
            )
            for gate in cpu_gates
        ),
        run("sign", f"python -m release sign {trust}"),
        run(
            "publish (refuses unless the channel's gates passed on these digests)",
            f'python -m release publish {trust}{target_options} --tuf-dir "${TUF_DIR}"',
            # The index's credentials, from the repository's secrets of the same names.
            env={name: f"${{{{ secrets.{name} }}}}" for name in INDEX_SECRETS},
        ),
        _consumer_verify(manifest, target.index, target.tuf_url),
        run("release report", "python -m release report", condition=ALWAYS),
        uses(
            UPLOAD,
            "the release report",
            condition=ALWAYS,
            name="release-report",
            path=block(["out/report.md", "out/report.html", "out/report-*.png", ""]),
            if_no_files_found="warn",
        ),
    ]
    if keyed:
        steps.append(run("remove the keys", f'rm -rf "$RUNNER_TEMP/{KEYS_FOLDER}"',
                         condition="${{ always() }}"))  # fmt: skip
    job = CommentedMap()
    tag = f"a tag releases on {ci.tag_channel}" if ci.tag_channel else "a manual run's channel"
    job["name"] = f"release ({tag})"
    job["needs"] = ["wheels", "gpu-gates"] if with_gpu else ["wheels"]
    # Also after failed GPU gates (their evidence decides), never for a pull request.
    job["if"] = (
        f"${{{{ !cancelled() && needs.wheels.result == 'success' && {EVENT} != 'pull_request' }}}}"
    )
    job["runs-on"] = ["self-hosted", *release.runner_labels]
    job.yaml_add_eol_comment(RELEASE_RUNNER_ACCEPTED, "runs-on")
    job["environment"] = ENVIRONMENT
    # One release at a time per repository, never cancelled midway.
    job["concurrency"] = {"group": "release-${{ github.repository }}", "cancel-in-progress": False}
    job["env"] = _channel_env(ci)
    job["steps"] = steps
    return job
