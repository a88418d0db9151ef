"""The replay of the generated workflow (release/ci/replay*.py), part by part: expressions as
GitHub evaluates them, the runner's environment files, the needs order and the matrix, the
stand-ins (each printed when used), the secrets file (refused when others may read it, a bad
line named by number without its value, every value masked in what is printed and logged),
and the refusals (an unknown action, a condition the replay cannot evaluate, a channel the
workflow does not offer). Jobs run for real in a small git repository: git, bash and copies,
no pip."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from release.ci import replay_plan
from release.ci.actions import CHECKOUT, DOWNLOAD, UPLOAD
from release.ci.replay import WorkflowReplay
from release.ci.replay_context import RefusedError, Replay
from release.ci.replay_envfiles import EnvFileError, parse_assignments, read_path_entries
from release.ci.replay_expressions import (
    ExpressionError,
    Status,
    condition,
    evaluate,
    interpolate,
)
from release.ci.replay_secrets import Masker, SecretsError, read_secrets

CONTEXTS: dict[str, Any] = {
    "github": {"event_name": "workflow_dispatch", "ref": "refs/heads/main"},
    "inputs": {"channel": "dev"},
    "matrix": {"python": "3.10", "cpython": "cp310", "arch": "x86_64"},
    "needs": {"wheels": {"result": "success"}},
    "secrets": {"TOKEN": "s3cret-value"},
    "env": {"CHANNEL": "dev"},
}


# --- expressions ---


def test_literals_operators_and_contexts_evaluate_as_github_does() -> None:
    assert evaluate("'it''s'", CONTEXTS) == "it's"
    assert evaluate("matrix.cpython", CONTEXTS) == "cp310"
    assert evaluate("inputs.channel == 'DEV'", CONTEXTS) is True  # strings: case-insensitive
    assert evaluate("1 == '1'", CONTEXTS) is True  # other types: as numbers
    assert evaluate("null == 0", CONTEXTS) is True
    assert evaluate("'' || 'fallback'", CONTEXTS) == "fallback"  # || gives an operand
    assert evaluate("'a' && 'b'", CONTEXTS) == "b"
    assert evaluate("!(github.event_name != 'pull_request')", CONTEXTS) is False
    assert evaluate('contains(fromJSON(\'["dev", "stable"]\'), inputs.channel)', CONTEXTS)
    assert evaluate("contains('release-dev', 'DEV')", CONTEXTS) is True
    assert evaluate("secrets.UNSET", CONTEXTS) is None  # an unset secret is null ('' in text)
    assert (
        interpolate("wheel-${{ matrix.cpython }}-${{ secrets.UNSET }}.", CONTEXTS)
        == "wheel-cp310-."
    )
    assert interpolate("${{ 1 == 1 }}", CONTEXTS) == "true"


@pytest.mark.parametrize(
    ("expression", "named"),
    [
        ("hashFiles('x')", "function hashFiles()"),
        ("matrix.python[0]", "'[0]'"),
        ("vars.X", "context 'vars'"),
        ("needs.build.result", "needs.build is not set"),
        ("matrix.python >= '3.10'", "got \">= '3.10'\""),
    ],
)
def test_a_form_the_replay_does_not_evaluate_is_refused_naming_it(
    expression: str, named: str
) -> None:
    with pytest.raises(ExpressionError) as raised:
        evaluate(expression, CONTEXTS)
    assert named in str(raised.value)


def test_status_functions_and_the_implied_success() -> None:
    failed = Status(failed=True)
    assert condition("${{ !cancelled() }}", CONTEXTS, failed) is True
    assert condition("${{ always() }}", CONTEXTS, failed) is True
    assert condition("failure()", CONTEXTS, failed) is True
    assert condition("${{ env.CHANNEL == 'dev' }}", CONTEXTS) is True
    # Without a status function, success() && is implied: false once a step failed.
    assert condition("${{ env.CHANNEL == 'dev' }}", CONTEXTS, failed) is False
    assert condition("${{ !cancelled() }}", CONTEXTS, Status(cancelled=True)) is False


def test_the_generated_conditions_evaluate_for_a_manual_run_and_a_pull_request(
    committed: dict[str, Any], stable_workflow: dict[str, Any]
) -> None:
    release_if = committed["jobs"]["release"]["if"]
    pull = {**CONTEXTS, "github": {"event_name": "pull_request"}}
    assert condition(release_if, CONTEXTS, Status()) is True
    assert condition(release_if, pull, Status()) is False
    assert (
        condition(
            release_if,
            {**CONTEXTS, "needs": {"wheels": {"result": "failure"}}},
            Status(failed=True),
        )
        is False
    )
    gpu_if = stable_workflow["jobs"]["gpu-gates"]["if"]
    assert condition(gpu_if, {**CONTEXTS, "inputs": {"channel": "stable"}}) is True
    assert condition(gpu_if, CONTEXTS) is False  # dev requires no GPU gate
    assert condition(gpu_if, {**pull, "inputs": {"channel": "stable"}}) is False


# --- environment files ---


def test_environment_files_are_read_as_the_runner_reads_them(tmp_path: Path) -> None:
    text = "A=1\nB=x=y\nPEM<<EOF\nline one\nline two\nEOF\n\nA=2\n"
    assert parse_assignments(text, "env") == {"A": "2", "B": "x=y", "PEM": "line one\nline two"}
    path = tmp_path / "path"
    path.write_text("/first\n/second\n")
    assert read_path_entries(path) == ["/second", "/first"]  # each prepended in turn


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("A=1\nnot an assignment hunter2\n", "env:2: expected NAME=value or NAME<<DELIMITER"),
        ("A=1\n9X=hunter2\n", "env:2: expected a variable name"),
        ("K<<EOF\nhunter2\n", "env:1: expected the delimiter that ends K's value"),
    ],
)
def test_a_bad_line_is_named_by_number_never_by_value(text: str, said: str) -> None:
    with pytest.raises(EnvFileError) as raised:
        parse_assignments(text, "env")
    assert said in str(raised.value) and "hunter2" not in str(raised.value)


# --- needs order, matrix, keys, channel ---


def test_jobs_run_in_needs_order(
    dev_workflow: dict[str, Any], stable_workflow: dict[str, Any]
) -> None:
    assert replay_plan.job_order(dev_workflow["jobs"], "w") == ["wheels", "release"]
    jobs = stable_workflow["jobs"]
    assert replay_plan.job_order(jobs, "w") == ["wheels", "gpu-gates", "release"]
    reordered = {
        "release": jobs["release"],
        "gpu-gates": jobs["gpu-gates"],
        "wheels": jobs["wheels"],
    }
    assert replay_plan.job_order(reordered, "w") == ["wheels", "gpu-gates", "release"]
    with pytest.raises(RefusedError, match="the needs form a cycle"):
        replay_plan.job_order({"a": {"needs": "b"}, "b": {"needs": ["a"]}}, "w")
    with pytest.raises(RefusedError, match=r"jobs.a.needs: 'c' is not a job"):
        replay_plan.job_order({"a": {"needs": "c"}}, "w")


def test_the_matrix_expands_as_actions_expands_it(committed: dict[str, Any]) -> None:
    combos = replay_plan.expand_matrix(committed["jobs"]["wheels"]["strategy"])
    assert combos == [
        {"python": "3.10", "arch": "x86_64", "cpython": "cp310"},
        {"python": "3.11", "arch": "x86_64", "cpython": "cp311"},
        {"python": "3.12", "arch": "x86_64", "cpython": "cp312"},
    ]
    matrix = {
        "os": ["a", "b"],
        "v": [1, 2],
        "exclude": [{"os": "b", "v": 2}],
        "include": [{"os": "a", "extra": "x"}, {"os": "c", "v": 9}, {"v": 1, "os": "z"}],
    }
    assert replay_plan.expand_matrix({"matrix": matrix}) == [
        {"os": "a", "v": 1, "extra": "x"},
        {"os": "a", "v": 2, "extra": "x"},
        {"os": "b", "v": 1},
        {"os": "c", "v": 9},  # fits no combination: one of its own
        {"v": 1, "os": "z"},  # would change an original value: one of its own
    ]
    assert replay_plan.expand_matrix(None) == [{}]


def test_a_key_the_replay_does_not_run_is_refused(committed: dict[str, Any]) -> None:
    replay_plan.check_keys(committed, "w")
    for planted, said in [
        ({"container": "alpine"}, "jobs.wheels: container: not a key the replay runs"),
        ({"steps": [{"run": "x", "shell": "sh"}]}, "jobs.wheels.steps[0]: shell: not a key"),
        ({"steps": [{"name": "nothing"}]}, "jobs.wheels.steps[0]: expected run or uses"),
    ]:
        workflow = {**committed, "jobs": {"wheels": {**committed["jobs"]["wheels"], **planted}}}
        with pytest.raises(RefusedError) as raised:
            replay_plan.check_keys(workflow, "w")
        assert said in str(raised.value)
    with pytest.raises(RefusedError, match="w: defaults: not a key"):
        replay_plan.check_keys({**committed, "defaults": {}}, "w")


def test_a_channel_the_workflow_does_not_offer_is_refused_saying_how(
    dev_workflow: dict[str, Any], stable_workflow: dict[str, Any]
) -> None:
    assert replay_plan.dispatch_inputs(dev_workflow, None, "w") == {"channel": "dev"}
    with pytest.raises(RefusedError) as raised:
        replay_plan.dispatch_inputs(dev_workflow, "stable", "w")
    said = str(raised.value)
    assert "--channel stable: expected one of the workflow's choices ['dev']" in said
    assert "ci.channels" in said and "--commit" in said
    assert replay_plan.dispatch_inputs(stable_workflow, "stable", "w") == {"channel": "stable"}


# --- secrets ---


def _secrets_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "secrets"
    path.write_text(text)
    path.chmod(mode)
    return path


PEM = "-----BEGIN PRIVATE KEY-----\nMIIBVgIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"


def test_the_secrets_file_holds_lines_and_blocks(tmp_path: Path) -> None:
    path = _secrets_file(tmp_path, f"# the index\nUSER=bot\nPASS=pa=ss\nKEY<<PEM\n{PEM}\nPEM\n")
    assert read_secrets(path) == {"USER": "bot", "PASS": "pa=ss", "KEY": PEM}


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_secrets_file_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = _secrets_file(tmp_path, "PASS=hunter2\n", mode)
    with pytest.raises(SecretsError) as raised:
        read_secrets(path)
    said = str(raised.value)
    assert f"has mode {mode:04o}" in said and "chmod 600" in said and "hunter2" not in said


def test_a_bad_secrets_line_is_named_by_number_without_its_value(tmp_path: Path) -> None:
    path = _secrets_file(tmp_path, "USER=bot\n\nhunter2-the-password\n")
    with pytest.raises(SecretsError) as raised:
        read_secrets(path)
    assert f"--secrets {path}:3: expected NAME=value" in str(raised.value)
    assert "hunter2" not in str(raised.value)


def test_the_mask_covers_each_value_and_each_line_of_a_block() -> None:
    mask = Masker(["hunter2-pass", PEM, "ab"])
    assert mask("login hunter2-pass now") == "login *** now"
    assert mask("key: MIIBVgIBADANBgkqhkiG9w0BAQEFAASC") == "key: ***"
    assert mask("ab stays: too short to mask") == "ab stays: too short to mask"


# --- jobs, run for real in a small repository ---


def _repository(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    repo.mkdir(parents=True)
    (repo / "data.txt").write_text("payload\n")
    (repo / "sub").mkdir()
    (repo / "sub" / "a.whl").write_text("a\n")
    (repo / "sub" / "b.whl").write_text("b\n")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    for command in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "one"]):
        subprocess.run(["git", "-C", str(repo), *command], check=True, env=env)
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return repo, head


def _replay(
    tmp_path: Path,
    jobs: dict[str, Any],
    secrets: dict[str, str] | None = None,
    only_job: str | None = None,
    from_run: Path | None = None,
    **options: Any,
) -> tuple[WorkflowReplay, int]:
    repo, head = _repository(tmp_path)
    workflow = {"name": "t", "on": {"workflow_dispatch": {}}, "jobs": jobs}
    replay = Replay(
        repo,
        head,
        tmp_path / "work",
        tmp_path / "runner",
        "workflow_dispatch",
        {"channel": "dev"},
        **options,
    )
    runner = WorkflowReplay(replay, workflow, "t.yml", secrets or {}, None, only_job, from_run)
    try:
        return runner, runner.run()
    finally:
        runner.out.close()


CHECKOUT_STEP = {"uses": CHECKOUT.ref, "with": {"persist-credentials": False}}


def test_steps_share_env_outputs_and_path_and_failures_are_honoured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = [
        CHECKOUT_STEP,
        {
            "run": 'echo "FROM_ENV=set by step 1" >> "$GITHUB_ENV"\nmkdir -p tools\n'
            'printf "#!/bin/sh\\necho tool ran\\n" > tools/tool && chmod +x tools/tool\n'
            'echo "$PWD/tools" >> "$GITHUB_PATH"\necho "answer=42" >> "$GITHUB_OUTPUT"',
            "id": "first",
        },
        {
            "name": "sees them",
            "env": {"ANSWER": "${{ steps.first.outputs.answer }}"},
            "run": 'test "$FROM_ENV" = "set by step 1"\ntest "$ANSWER" = 42\ntool\ncat data.txt',
        },
        {"name": "fails, tolerated", "continue-on-error": True, "run": "exit 3"},
        {"name": "fails", "run": "false\necho never"},
        {"name": "skipped after the failure", "run": "echo no"},
        {"name": "runs anyway", "if": "${{ !cancelled() }}", "run": "echo still here"},
    ]
    runner, status = _replay(tmp_path, {"one": {"runs-on": "ubuntu-24.04", "steps": steps}})
    assert status == 1
    (job,) = runner.results
    assert job.result == "failure"
    assert [(s.outcome, s.conclusion) for s in job.steps] == [
        ("success", "success"),
        ("success", "success"),
        ("success", "success"),
        ("failure", "success"),
        ("failure", "failure"),
        ("skipped", "skipped"),
        ("success", "success"),
    ]
    out = capsys.readouterr().out
    assert "tool ran" in out and "payload" in out and "still here" in out
    assert "never" not in out and "| no\n" not in out
    assert "stand-in for actions/checkout (v7.0.1): a clone of the replayed repository" in out
    summary = (tmp_path / "work" / "summary.md").read_text()
    assert "| | fails, tolerated | failure (continue-on-error) |" in summary


def test_artifacts_go_from_one_job_to_the_next_and_each_stand_in_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upload = {
        "uses": UPLOAD.ref,
        "with": {
            "name": "wheel-${{ matrix.n }}",
            "path": "sub/${{ matrix.n }}.whl",
            "if-no-files-found": "error",
        },
    }
    jobs = {
        "build": {
            "runs-on": "ubuntu-24.04",
            "strategy": {"matrix": {"n": ["a", "b"]}},
            "steps": [CHECKOUT_STEP, upload],
        },
        "take": {
            "needs": "build",
            "runs-on": "ubuntu-24.04",
            "steps": [
                {
                    "uses": DOWNLOAD.ref,
                    "with": {"pattern": "wheel-*", "merge-multiple": True, "path": "out/wheels"},
                },
                {"uses": DOWNLOAD.ref, "with": {"name": "wheel-a", "path": "one"}},
                {"run": "ls out/wheels one"},
            ],
        },
    }
    _, status = _replay(tmp_path, jobs)
    assert status == 0, capsys.readouterr().out
    work = tmp_path / "work"
    assert sorted(p.name for p in (work / "artifacts").iterdir()) == ["wheel-a", "wheel-b"]
    taken = work / "jobs" / "take" / "workspace"
    assert sorted(p.name for p in (taken / "out" / "wheels").iterdir()) == ["a.whl", "b.whl"]
    assert (taken / "one" / "a.whl").read_text() == "a\n"
    out = capsys.readouterr().out
    assert "stand-in for actions/upload-artifact (v7.0.0): a copy into the run's artifacts" in out
    assert "artifact wheel-a: 1 file(s) from " in out
    assert "2 artifact(s) (wheel-a, wheel-b) from" in out


def test_an_upload_without_files_fails_where_the_workflow_says_error(tmp_path: Path) -> None:
    upload = {
        "uses": UPLOAD.ref,
        "with": {"name": "x", "path": "nothing/*.whl", "if-no-files-found": "error"},
    }
    runner, status = _replay(tmp_path, {"one": {"runs-on": "u", "steps": [CHECKOUT_STEP, upload]}})
    assert status == 1 and runner.results[0].steps[1].outcome == "failure"


def test_secrets_are_masked_in_every_line_printed_and_logged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secrets = {"PASS": "hunter2-the-password", "KEY": PEM}
    step = {
        "name": "leaks ${{ secrets.PASS }}",
        "env": {"P": "${{ secrets.PASS }}", "K": "${{ secrets.KEY }}"},
        "run": 'echo "password $P"\necho "$K"\necho "$P" >&2',
    }
    _, status = _replay(tmp_path, {"one": {"runs-on": "u", "steps": [step]}}, secrets)
    assert status == 0
    printed = capsys.readouterr().out
    logged = "".join(
        p.read_text()
        for p in (tmp_path / "work").rglob("*")
        if p.is_file() and p.suffix in (".log", ".md")
    )
    for text in (printed, logged):
        assert "hunter2" not in text and "MIIBVgIBADANBgkqhkiG9w0BAQEFAASC" not in text
        assert "password ***" in text and "leaks ***" in text


def test_an_unknown_action_is_refused_naming_it(tmp_path: Path) -> None:
    for uses, said in [
        (
            "actions/cache@0123456789abcdef0123456789abcdef01234567",
            "jobs.one.steps[0] (Run actions/cache@0123456789abcdef0123456789abcdef01234567): uses "
            "actions/cache@0123456789abcdef0123456789abcdef01234567: no local stand-in",
        ),
        ("actions/checkout@v4", f"uses actions/checkout@v4: expected {CHECKOUT.ref} (v7.0.1)"),
    ]:
        with pytest.raises(RefusedError) as raised:
            _replay(
                tmp_path / uses.split("@")[1], {"one": {"runs-on": "u", "steps": [{"uses": uses}]}}
            )
        assert said in str(raised.value)
    step = {"uses": UPLOAD.ref, "with": {"name": "x", "path": "y", "compression-level": 9}}
    with pytest.raises(RefusedError, match="with: compression-level: the stand-in of actions/"):
        _replay(tmp_path / "input", {"one": {"runs-on": "u", "steps": [step]}})


def test_a_condition_the_replay_cannot_evaluate_stops_it_naming_job_and_step(
    tmp_path: Path,
) -> None:
    steps = [{"name": "maybe", "if": "${{ hashFiles('*.lock') != '' }}", "run": "echo x"}]
    with pytest.raises(RefusedError) as raised:
        _replay(tmp_path, {"one": {"runs-on": "u", "steps": steps}})
    said = str(raised.value)
    assert said.startswith("jobs.one.steps[0] (maybe): if: ") and "hashFiles()" in said
    with pytest.raises(RefusedError, match=r"jobs.two: if: .*function toJSON\(\)"):
        _replay(tmp_path / "job", {"two": {"runs-on": "u", "if": "toJSON(github)", "steps": []}})


def test_the_gpu_job_is_not_run_without_a_gpu_and_takes_given_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = {
        "gpu-gates": {"runs-on": ["self-hosted", "linux", "gpu"], "steps": [{"run": "exit 1"}]},
        "after": {
            "needs": ["gpu-gates"],
            "if": "${{ !cancelled() }}",
            "runs-on": "u",
            "steps": [{"run": 'echo "gpu said ${{ needs.gpu-gates.result }}"'}],
        },
    }
    runner, status = _replay(tmp_path / "without", jobs)
    assert status == 0
    assert [(r.job_id, r.result) for r in runner.results] == [
        ("gpu-gates", "skipped"),
        ("after", "success"),
    ]
    out = capsys.readouterr().out
    assert "gpu-gates: skipped (not run: no GPU on this machine" in out
    assert "gpu said skipped" in out
    records = tmp_path / "records"
    records.mkdir()
    (records / "gpu-records.tar").write_bytes(b"tar")
    runner, status = _replay(tmp_path / "with", jobs, gpu_records=records)
    assert status == 0 and runner.results[0].result == "success"
    assert (tmp_path / "with" / "work" / "artifacts" / "gpu-records" / "gpu-records.tar").exists()
    assert "gpu said success" in capsys.readouterr().out
    with pytest.raises(RefusedError, match=r"expected gpu-records\.tar"):
        _replay(tmp_path / "empty", jobs, gpu_records=tmp_path / "with")


def test_a_readable_secrets_file_stops_the_command_line(tmp_path: Path) -> None:
    from release.ci.replay import main

    path = _secrets_file(tmp_path, "PASS=hunter2\n", 0o644)
    assert main(["--secrets", str(path), "--work", str(tmp_path / "w")]) == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_ci_replay_on_the_release_command_line_is_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m release ci --replay ...` hands the options after it to the replay: its refusal
    of a readable secrets file, under the release command's name; and --check with it is named."""
    from release.cli import main

    path = _secrets_file(tmp_path, "PASS=hunter2\n", 0o644)
    assert main(["ci", "--replay", "--secrets", str(path), "--work", str(tmp_path / "w")]) == 2
    error = capsys.readouterr().err
    assert str(path) in error and "hunter2" not in error
    assert main(["ci", "--check", "--replay", "--job", "wheels"]) == 2
    assert "ci: --check and --replay: expected one of them; got both" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["ci", "--replay", "--help"])
    assert "usage: python -m release ci --replay" in capsys.readouterr().out


def test_one_job_runs_from_the_artifacts_of_an_earlier_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upload = {"uses": UPLOAD.ref, "with": {"name": "w", "path": "sub/a.whl"}}
    jobs = {
        "build": {"runs-on": "u", "steps": [CHECKOUT_STEP, upload]},
        "take": {
            "needs": "build",
            "runs-on": "u",
            "steps": [{"uses": DOWNLOAD.ref, "with": {"name": "w"}}, {"run": "cat a.whl"}],
        },
        "other": {"runs-on": "u", "steps": [{"run": "echo other ran"}]},
    }
    _, status = _replay(tmp_path / "first", jobs)
    assert status == 0
    capsys.readouterr()
    runner, status = _replay(
        tmp_path / "second", jobs, only_job="take", from_run=tmp_path / "first" / "work"
    )
    assert status == 0
    assert [(r.job_id, r.result) for r in runner.results] == [
        ("build", "success"),
        ("take", "success"),
    ]
    out = capsys.readouterr().out
    assert "== job build: not replayed (--job take); its artifacts are those of" in out
    assert "| a" in out and "other ran" not in out
    with pytest.raises(RefusedError, match="give its folder with --from-run DIR"):
        _replay(tmp_path / "third", jobs, only_job="take")


def test_the_index_and_the_tuf_server_are_where_ci_release_names_them() -> None:
    from release.ci.replay_context import StandInError
    from release.ci.replay_services import IndexPlace, index_place

    place = index_place("http://127.0.0.1:3141/activekv/release/+simple/", "http://127.0.0.1:8141/")
    assert place == IndexPlace(3141, "activekv", "release", 8141)
    with pytest.raises(
        StandInError, match=r"ci\.release\.index: expected an http URL of 127\.0\.0\.1"
    ):
        index_place("https://index.example/activekv/release/+simple/", "http://127.0.0.1:8141/")
    with pytest.raises(StandInError, match=r"expected devpi's /<user>/<index>/\+simple/"):
        index_place("http://127.0.0.1:3141/simple/", "http://127.0.0.1:8141/")


def test_a_job_gets_a_fresh_runners_environment_not_this_shells() -> None:
    from release.ci.replay_context import RUNNER_PATH, runner_base_env

    shell = {
        "HOME": "/root",
        "PATH": "/venv/bin:/usr/bin",
        "VIRTUAL_ENV": "/venv",
        "ACTIVEKV_STATE_DIR": "/mine",
        "PYTHONPATH": "/src",
        "PIP_FIND_LINKS": "/w",
    }
    assert runner_base_env(shell) == {"HOME": "/root", "PIP_FIND_LINKS": "/w", "PATH": RUNNER_PATH}


def test_a_self_hosted_job_gets_its_runners_own_variables_and_a_hosted_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU runner's key and library paths come from its .env (here: the replay's shell);
    a hosted runner has no such file, so a hosted job never sees them."""
    from release.ci.replay import RUNNER_VARIABLES

    for name in RUNNER_VARIABLES:
        monkeypatch.setenv(name, f"/runner/{name}")
    monkeypatch.setenv("ACTIVEKV_STATE_DIR", "/the-operators-own")
    printed = {  # a self-hosted runner without the gpu label: this machine has no GPU
        "runs-on": ["self-hosted", "big"],
        "steps": [{"run": f"env | grep '^ACTIVEKV_' > {tmp_path}/seen-$GITHUB_JOB || true"}],
    }
    hosted = {**printed, "runs-on": "ubuntu-24.04"}
    _, status = _replay(tmp_path, {"own": printed, "hosted": hosted})
    assert status == 0
    seen = {
        job: dict(line.split("=", 1) for line in (tmp_path / f"seen-{job}").read_text().split())
        for job in ("own", "hosted")
    }
    for name in RUNNER_VARIABLES:
        assert seen["own"][name] == f"/runner/{name}"
        assert name not in seen["hosted"]
    assert "ACTIVEKV_STATE_DIR" not in seen["own"]  # only the release runner has one
