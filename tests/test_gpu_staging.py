"""`python -m release gpu-staging` on a machine without a GPU: says so and writes no record."""

from __future__ import annotations

from pathlib import Path

import pytest

from release.cli import main
from release.gpu import detect_gpu


@pytest.mark.skipif(detect_gpu() is not None, reason="a GPU is present: the benchmark runs")
def test_without_a_gpu_nothing_is_measured_and_nothing_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = tmp_path / "activekv-0.1.0-cp312-abi3-manylinux_2_17_x86_64.whl"
    wheel.write_bytes(b"not opened without a GPU")
    code = main(["gpu-staging", "--wheel", str(wheel), "--out", str(tmp_path / "out"),
                 "--state-dir", str(tmp_path / "state")])  # fmt: skip
    assert code == 0
    assert "not run: no GPU runner" in capsys.readouterr().out
    assert not (tmp_path / "out" / "gpu-staging.json").exists()
