"""`python -m release bench`'s library refuses a block or step count it cannot measure with one
line naming it (ReleaseError, which the CLI prints as one line), before it installs a wheel or
builds an engine: 0 timed no step (the median of nothing), -1 asked for a negative pool, and a
count in the billions ran for hours."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from release.bench.bookkeeping import MAX_BLOCKS, MAX_STEPS, measure, run_bench
from release.errors import ReleaseError
from release.scripts.parity_replay import reference_implementation

NOT_COUNTS = [0, -1, -(1 << 63), MAX_BLOCKS + 1, 1 << 40, True, False, 2.0, "8", None]


@pytest.mark.parametrize("blocks", NOT_COUNTS, ids=repr)
def test_run_bench_refuses_a_block_count_before_installing(tmp_path: Path, blocks: object) -> None:
    # No wheel at that path: were the count not checked first, the install would fail instead.
    with pytest.raises(ReleaseError) as raised:
        run_bench(tmp_path / "missing.whl", tmp_path, blocks=blocks)  # type: ignore[arg-type]
    message = str(raised.value)
    assert message == f"--blocks: expected a whole number from 1 to {MAX_BLOCKS}; got {blocks!r}"
    assert "\n" not in message
    assert not (tmp_path / "bench").exists()  # nothing installed


@pytest.mark.parametrize("steps", [0, -1, MAX_STEPS + 1, True, 1.0], ids=repr)
def test_run_bench_refuses_a_step_count(tmp_path: Path, steps: object) -> None:
    with pytest.raises(ReleaseError, match=r"^steps: expected a whole number from 1 to \d+; got "):
        run_bench(tmp_path / "missing.whl", tmp_path, steps=steps)  # type: ignore[arg-type]


@pytest.mark.parametrize(("blocks", "steps"), [(0, 3), (-1, 3), (4, 0), (4, -2)])
def test_measure_refuses_counts_on_the_reference(blocks: int, steps: int) -> None:
    """The reference implementation needs no wheel: measure() itself refuses, naming the count."""
    with pytest.raises(ReleaseError, match=r"^(--blocks|steps): expected a whole number"):
        measure(reference_implementation(), blocks, steps, seed=1)


def test_measure_takes_the_smallest_counts_and_index_integers() -> None:
    result = measure(reference_implementation(), np.int64(1), 1, seed=1)  # type: ignore[arg-type]
    assert result.steps == 1 and result.microseconds_per_layer_step > 0
