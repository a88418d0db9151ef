"""Bad command-line input gets a clear error naming the argument, and exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from release.cli import main
from release.util.paths import DEFAULT_MANIFEST

REPO = Path(__file__).resolve().parent.parent


def test_unknown_channel_names_the_known_ones(tmp_path, capsys):
    code = main(
        [
            "sign",
            "--channel",
            "nightly",
            "--out",
            str(tmp_path / "o"),
            "--state-dir",
            str(tmp_path / "s"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "release.channels" in err and "nightly" in err and "dev" in err


def test_missing_manifest_names_the_path(tmp_path, capsys):
    missing = tmp_path / "nope.toml"
    assert main(["check-manifest", "--manifest", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err


def test_undeclared_python_version_names_the_argument(tmp_path, capsys):
    code = main(
        [
            "build",
            "--python",
            "3.9",
            "--out",
            str(tmp_path / "o"),
            "--state-dir",
            str(tmp_path / "s"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--python" in err and "3.9" in err and "3.10" in err


def test_gates_without_wheels_say_how_to_build(tmp_path, capsys):
    assert main(["policy", "--out", str(tmp_path / "o"), "--state-dir", str(tmp_path / "s")]) == 2
    assert "python -m release build" in capsys.readouterr().err


def test_publish_without_evidence_is_refused_before_any_index_starts(tmp_path, capsys):
    wheels = tmp_path / "o" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / "activekv-0.1.0-py3-none-any.whl").write_bytes(b"not really a wheel")
    assert main(["publish", "--out", str(tmp_path / "o"), "--state-dir", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "refuses to publish" in err and "payload: no attestation in" in err
    assert not (tmp_path / "s" / "index").exists()


def test_unknown_step_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["deploy"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'deploy'" in capsys.readouterr().err


def test_default_manifest_is_valid(capsys):
    assert main(["check-manifest"]) == 0
    assert Path("manifests/activekv.toml").name in capsys.readouterr().out


def test_an_error_with_bracketed_words_is_printed_as_it_is(tmp_path, capsys):
    """rich would read "[gates.x]" as markup and drop it; errors are printed as text."""
    text = DEFAULT_MANIFEST.read_text(encoding="utf-8").replace(
        'requires = ["policy", "payload", "casters"]', 'requires = ["policy", "payload", "x"]'
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    assert main(["check-manifest", "--manifest", str(bad)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert 'expected a gate declared in [gates.*], "casters"' in err
    assert 'got "x"' in err and "[bold red]" not in err


def test_a_state_dir_that_leads_out_of_the_checkout_is_refused(tmp_path, capsys, monkeypatch):
    """A manifest's state_dir that is a symlink out of the checkout: refused, nothing written."""
    import release.cli as cli

    checkout = tmp_path / "checkout"
    (checkout / "manifests").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (checkout / ".activekv").symlink_to(outside)
    monkeypatch.setattr(cli, "REPO_ROOT", checkout)
    assert main(["check-manifest"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "publish.state_dir: expected a folder inside the checkout" in err
    assert str(outside) in err and not any(outside.iterdir())


@pytest.mark.parametrize("where", ["out", "out/state"])
def test_a_state_dir_in_the_outputs_is_refused_before_any_key_is_made(tmp_path, capsys, where):
    """Keys made in the outputs would be handed on with them."""
    out = tmp_path / "out"
    state = tmp_path / where
    assert main(["sign", "--out", str(out), "--state-dir", str(state)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--state-dir: expected a folder apart from the outputs ({out})" in err
    assert not out.exists()


def test_a_state_dir_around_the_outputs_is_refused(tmp_path, capsys):
    assert main(["sign", "--out", str(tmp_path / "s" / "out"), "--state-dir",
                 str(tmp_path / "s")]) == 2  # fmt: skip
    assert "--state-dir: expected a folder apart from the outputs" in capsys.readouterr().err


def test_a_state_dir_git_would_copy_is_refused(tmp_path, capsys):
    """Inside the checkout, only a folder git ignores: snapshots copy what it does not."""
    state = REPO / "docs" / "not-ignored-state"
    assert main(["sign", "--out", str(tmp_path / "out"), "--state-dir", str(state)]) == 2
    assert "--state-dir: expected a folder git ignores" in capsys.readouterr().err
    assert not state.exists()


def test_an_ignored_state_dir_that_does_not_exist_yet_is_taken(tmp_path, monkeypatch):
    """A fresh clone has no .activekv/ yet: git ignores it all the same (a folder pattern)."""
    import subprocess

    import release.cli as cli

    checkout = tmp_path / "clone"
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    (checkout / ".gitignore").write_text("/.activekv/\n")
    monkeypatch.setattr(cli, "REPO_ROOT", checkout)
    state = checkout / ".activekv"
    assert cli._checked_state_dir(state, tmp_path / "out", "--state-dir") == state
    assert not state.exists()


def test_a_manifest_state_dir_git_would_copy_is_refused_naming_the_key(tmp_path, capsys):
    manifest = tmp_path / "m.toml"
    text = DEFAULT_MANIFEST.read_text()
    assert 'state_dir = ".activekv"' in text
    manifest.write_text(text.replace('state_dir = ".activekv"', 'state_dir = "state-here"'))
    assert main(["sign", "--manifest", str(manifest), "--out", str(tmp_path / "out")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{manifest}: publish.state_dir: expected a folder git ignores" in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["policy", "notes.txt"], "wheel argument notes.txt: expected a wheel file name"),
        (["policy", "."], "wheel argument .: expected a wheel file; got a folder"),
        (["sign", "--channel", ""], 'release.channels: expected a channel "dev" or "stable"'),
        (["publish", "--index", "https://x.example/simple/", "--tuf-dir", ""],
         "publish.tuf_dir (--tuf-dir): expected a folder path"),
        (["reproduce", "--python", "2.7"], "--python: expected versions declared in"),
    ],
)  # fmt: skip
def test_a_bad_argument_is_named_and_nothing_is_made(tmp_path, capsys, monkeypatch, args, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("not a wheel")
    out = tmp_path / "out"
    assert main([*args, "--out", str(out), "--state-dir", str(tmp_path / "s")]) == 2
    assert said in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_an_output_folder_that_is_a_file_is_named_not_raised(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("a file where the report's folder would be")
    assert main(["report", "--out", str(taken)]) == 2
    assert f"error: {taken}: " in capsys.readouterr().err
    assert taken.read_text() == "a file where the report's folder would be"


@pytest.mark.integration  # the embedded index's server process
def test_a_failed_verify_leaves_no_earlier_verify_record(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "verify.json").write_text('{"from": "an earlier verify that passed"}')
    assert main(["verify", "--out", str(out), "--state-dir", str(tmp_path / "s")]) == 2
    assert "error:" in capsys.readouterr().err
    assert not (out / "verify.json").exists()


@pytest.mark.parametrize("blocks", ["-1", "0", "x", str((1 << 20) + 1)])
def test_a_block_count_that_is_not_positive_is_named_not_raised(capsys, blocks):
    with pytest.raises(SystemExit) as stopped:
        main(["bench", "--blocks", blocks])
    assert stopped.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"argument --blocks: expected a whole number from 1 to 1048576; got '{blocks}'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("version", ["1.0.0.post", "1.0.0-rc1", "banana", "01.0", ""])
def test_check_manifest_refuses_a_version_that_is_not_a_release_version(
    tmp_path, capsys, monkeypatch, version
):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(f'[project]\nname = "activekv"\nversion = "{version}"\n')
    monkeypatch.setattr("release.util.pins.PYPROJECT", pyproject)
    assert main(["check-manifest"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{pyproject}: project.version: expected a PEP 440 version in normal form" in err
    assert repr(version) in err


def test_each_gate_option_is_declared_once_and_reaches_the_gate() -> None:
    """A gate's command-line options come from GateOptions' fields alone
    (release/gates/options.py): the parser takes each on the commands it names, and the parsed
    line fills the field of its name."""
    import dataclasses

    from release import cli_options
    from release.gates import options

    declared = {f.name: f.metadata["flag"] for f in dataclasses.fields(options.GateOptions)}
    for name, flag in declared.items():
        for command in flag.commands:
            parsed = cli_options.parser().parse_args([command, flag.flag, "3"])
            value = getattr(options.given(vars(parsed)), name)
            assert value in (("3",), (Path("3"),), 3, Path("3")), (command, name, value)
    parsed = cli_options.parser().parse_args(["parity"])
    assert options.given(vars(parsed)) == options.GateOptions()  # the defaults, untouched
    with pytest.raises(SystemExit):  # an option its command does not take
        cli_options.parser().parse_args(["reproduce", "--cell", "x"])
