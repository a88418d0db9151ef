"""`python -m release record-build`: the build record of wheels cibuildwheel made elsewhere."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from release.cli import main
from release.context import Context
from release.errors import GateError, ReleaseError
from release.manifest import load_manifest
from release.util.digests import sha256_file
from release.util.paths import DEFAULT_MANIFEST
from release.wheelset import WheelSet

REPO = Path(__file__).resolve().parent.parent
PLATFORM = "manylinux_2_17_x86_64"


def _wheels(out: Path, *names: str) -> None:
    (out / "wheels").mkdir(parents=True)
    for name in names:
        (out / "wheels" / name).write_bytes(name.encode())


def test_records_each_wheel_with_what_it_serves_and_its_digest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _wheels(out, f"activekv-0.1.0-cp310-cp310-{PLATFORM}.whl",
            f"activekv-0.1.0-cp312-abi3-{PLATFORM}.whl")  # fmt: skip
    assert main(["record-build", "--out", str(out)]) == 0
    record = json.loads((out / "build.json").read_text())
    assert record["toolchain"]["kind"] == "cibuildwheel"
    assert isinstance(record["source_date_epoch"], int)
    by_file = {w["file"]: w for w in record["wheels"]}
    assert by_file[f"activekv-0.1.0-cp310-cp310-{PLATFORM}.whl"]["serves"] == ["3.10"]
    abi3 = by_file[f"activekv-0.1.0-cp312-abi3-{PLATFORM}.whl"]
    assert abi3["serves"] == ["3.12", "3.13"]
    assert abi3["size"] == len(abi3["file"])
    assert len(abi3["sha256"]) == 64


def test_the_sdist_of_the_checkout_is_built_and_recorded_beside_the_wheels(
    recorded: tuple[Path, dict],
) -> None:
    """A release from CI (record-build after cibuildwheel) publishes the sdist, as `run` does: it
    is built from the checkout with the wheels' SOURCE_DATE_EPOCH and named in the record."""
    out, record = recorded
    sdist = out / "sdist" / record["sdist"]["file"]
    assert record["sdist"]["file"] == "activekv-0.1.0.tar.gz"
    assert record["sdist"]["sha256"] == sha256_file(sdist)
    assert record["sdist"]["size"] == sdist.stat().st_size
    with tarfile.open(sdist) as archive:
        assert {m.mtime for m in archive.getmembers()} == {record["source_date_epoch"]}
    assert _read_back(out).sdist is not None


def test_a_wheel_for_an_undeclared_python_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    _wheels(out, f"activekv-0.1.0-cp39-cp39-{PLATFORM}.whl")
    assert main(["record-build", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "activekv-0.1.0-cp39-cp39" in error and "build.python" in error
    assert not (out / "build.json").exists()


@pytest.fixture(scope="module")
def recorded_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One record-build's output (it builds the checkout's sdist, so once per module)."""
    out = tmp_path_factory.mktemp("recorded") / "out"
    _wheels(out, f"activekv-0.1.0-cp312-abi3-{PLATFORM}.whl")
    assert main(["record-build", "--out", str(out)]) == 0
    return out


@pytest.fixture
def recorded(tmp_path: Path, recorded_once: Path) -> tuple[Path, dict]:
    """A copy of that output for one test to change, and its build record."""
    out = tmp_path / "out"
    shutil.copytree(recorded_once, out)
    return out, json.loads((out / "build.json").read_text())


def _read_back(out: Path) -> WheelSet:
    manifest = load_manifest(DEFAULT_MANIFEST)
    return Context(manifest, out.parent, out, out.parent / "s").built_wheels()


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("file", "../../outside.whl", "wheels.0.file"),
        ("file", "/etc/hostname", "wheels.0.file"),
        ("sha256", "not a digest", "wheels.0.sha256"),
        ("python", "banana", "wheels.0.python"),
        ("size", True, "wheels.0.size"),
        ("size", -1, "wheels.0.size"),
        ("seconds", float("nan"), "NaN"),
        ("cached", "yes", "wheels.0.cached"),
    ],
)
def test_a_build_record_entry_of_another_shape_is_refused_naming_its_key(
    recorded: tuple[Path, dict], key: str, value: object, named: str
) -> None:
    out, record = recorded
    record["wheels"][0][key] = value
    (out / "build.json").write_text(json.dumps(record))
    with pytest.raises(ReleaseError, match=named) as raised:
        _read_back(out)
    assert str(out / "build.json") in str(raised.value)


@pytest.mark.parametrize("epoch", [0, 10**20, 1.5, True])
def test_a_source_date_epoch_the_build_cannot_take_is_refused(
    recorded: tuple[Path, dict], epoch: object
) -> None:
    out, record = recorded
    record["source_date_epoch"] = epoch
    (out / "build.json").write_text(json.dumps(record))
    with pytest.raises(ReleaseError, match="source_date_epoch"):
        _read_back(out)


def test_a_wheel_changed_after_its_build_record_is_refused_by_digest(
    recorded: tuple[Path, dict],
) -> None:
    out, record = recorded
    assert [w.sha256 for w in _read_back(out)] == [record["wheels"][0]["sha256"]]
    wheel = out / "wheels" / record["wheels"][0]["file"]
    wheel.write_bytes(wheel.read_bytes().upper())  # the same size, other bytes
    recorded = record["wheels"][0]["sha256"]
    said = (
        rf"expected the wheel of the build record \(sha256 {recorded}\); got sha256 [0-9a-f]{{64}}"
    )
    with pytest.raises(GateError, match=said):
        _read_back(out)
