"""`python -m release record-build`: the build record of wheels cibuildwheel made elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from release.cli import main

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
    assert main(["record-build", "--out", str(out), "--state-dir", str(tmp_path / "s")]) == 0
    record = json.loads((out / "build.json").read_text())
    assert record["toolchain"]["kind"] == "cibuildwheel"
    assert isinstance(record["source_date_epoch"], int)
    by_file = {w["file"]: w for w in record["wheels"]}
    assert by_file[f"activekv-0.1.0-cp310-cp310-{PLATFORM}.whl"]["serves"] == ["3.10"]
    abi3 = by_file[f"activekv-0.1.0-cp312-abi3-{PLATFORM}.whl"]
    assert abi3["serves"] == ["3.12", "3.13"]
    assert abi3["size"] == len(abi3["file"])
    assert len(abi3["sha256"]) == 64


def test_a_wheel_for_an_undeclared_python_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    _wheels(out, f"activekv-0.1.0-cp39-cp39-{PLATFORM}.whl")
    assert main(["record-build", "--out", str(out), "--state-dir", str(tmp_path / "s")]) == 2
    error = capsys.readouterr().err
    assert "activekv-0.1.0-cp39-cp39" in error and "build.python" in error
    assert not (out / "build.json").exists()
