"""The README's staging table comes from the GPU records it names; the CUDA route's targets are
judged on them; the Python bench's record is tied to the wheel it imported."""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from fixtures_wheels import build_files_wheel

from release.report.markdown import table_lines
from release.report.staging_evidence import StagingRecords, judge, load, main, staging_table
from release.scripts.staging_bench_py import Rig, installed_wheel, measure_together

REPO = Path(__file__).resolve().parent.parent
EVIDENCE = REPO / "tests" / "gpu" / "evidence"
README = (REPO / "README.md").read_text(encoding="utf-8")


def _named_run() -> str:
    """The 12-hex digest prefix of the run the README's CUDA route section cites."""
    found = re.search(r"Records: `tests/gpu/evidence/\*-([0-9a-f]{12})\.\*`", README)
    assert found, "README.md: expected the CUDA route's records as tests/gpu/evidence/*-<12 hex>.*"
    return found.group(1)


def _records() -> tuple[dict, dict]:
    run = _named_run()
    return (
        json.loads((EVIDENCE / f"gpu-staging-{run}.json").read_text()),
        json.loads((EVIDENCE / f"staging-py-{run}.json").read_text()),
    )


def test_the_readme_table_is_the_records_it_names():
    cpp, python = _records()
    assert cpp["wheel_sha256"].startswith(_named_run())
    lines = table_lines(staging_table(StagingRecords(cpp, python)))
    assert "\n".join(lines) in README


def test_the_readme_says_met_and_not_met_as_the_records_do():
    verdicts = judge(StagingRecords(*_records()))
    unmet = [v for v in verdicts if not v.met]
    # The README's bullets against the targets: each unmet one is called so in bold.
    assert README.count("**Not met") == len(unmet)


def test_targets_are_met_on_good_records_and_a_planted_miss_is_named():
    cpp, python = _records()
    good_cpp, good_py = copy.deepcopy(cpp), copy.deepcopy(python)
    for ratio in (*good_cpp["int8_vs_exact_by_scenario"], *good_py["int8_vs_exact_by_scenario"]):
        ratio["int8_over_exact_load"] = ratio["int8_over_exact_store"] = 1.9
    assert all(v.met for v in judge(StagingRecords(good_cpp, good_py)))

    planted = copy.deepcopy(good_py)
    row = next(r for r in planted["rows"]
               if r["path"] == "auto" and r["scenario"] == "requests"
               and r["block_bytes"] == 256 * 1024)  # fmt: skip
    row["both_ways_gbps"] = 84.9
    (missed,) = [v for v in judge(StagingRecords(good_cpp, planted)) if not v.met]
    assert missed.target.floor == 85.0
    assert missed.misses == ("256 KiB Python both_ways 84.90",)


def test_a_random_row_under_a_floor_does_not_count():
    cpp, python = _records()
    for ratio in (*cpp["int8_vs_exact_by_scenario"], *python["int8_vs_exact_by_scenario"]):
        ratio["int8_over_exact_load"] = ratio["int8_over_exact_store"] = 1.9
    for row in python["rows"]:
        if row["scenario"] == "random":
            row["both_ways_gbps"] = 1.0
    assert all(v.met for v in judge(StagingRecords(cpp, python)))


def test_a_missing_request_row_is_a_miss():
    cpp, python = _records()
    dropped = ("requests", 64 * 1024)
    python["rows"] = [r for r in python["rows"] if (r["scenario"], r["block_bytes"]) != dropped]
    verdicts = judge(StagingRecords(cpp, python))
    assert any("64 KiB" in m and "no row" in m for v in verdicts for m in v.misses)


def test_the_command_prints_the_table_and_fails_on_an_unmet_target(capsys):
    run = _named_run()
    status = main([str(EVIDENCE / f"gpu-staging-{run}.json"),
                   str(EVIDENCE / f"staging-py-{run}.json")])  # fmt: skip
    printed = capsys.readouterr().out
    assert "| block | traffic |" in printed
    verdicts = judge(StagingRecords(*_records()))
    assert status == (0 if all(v.met for v in verdicts) else 1)
    assert ("NOT MET" in printed) == (status == 1)


def test_a_record_of_another_shape_is_named(tmp_path):
    cpp = tmp_path / "gpu-staging.json"
    py = tmp_path / "staging-py.json"
    cpp.write_text(json.dumps({"rows": []}))
    py.write_text("{")
    with pytest.raises(ValueError, match=r"staging-py.json: expected a JSON staging record"):
        load(cpp, py)
    py.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match=r"gpu-staging.json: scenarios: missing \(expected"):
        load(cpp, py)
    cpp.write_text(json.dumps({"scenarios": [{"path": "auto", "block_bytes": "16 KiB"}],
                               "int8_vs_exact_by_scenario": []}))  # fmt: skip
    with pytest.raises(ValueError, match=r"gpu-staging.json: scenarios\[0\]\.block_bytes: "
                       r"expected a number; got \"16 KiB\""):  # fmt: skip
        load(cpp, py)


def _wheel_and_site(tmp_path: Path, module: bytes) -> tuple[Path, Path]:
    wheel = build_files_wheel(tmp_path / "dist", {"activekv/_engine.abi3.so": b"\x7fELF engine"},
                              name="activekv", version="0.1.0")  # fmt: skip
    site = tmp_path / "site" / "activekv"
    site.mkdir(parents=True)
    (site / "_engine.abi3.so").write_bytes(module)
    return wheel, site.parent


def test_the_python_bench_records_the_wheel_its_site_was_installed_from(tmp_path):
    wheel, site = _wheel_and_site(tmp_path, b"\x7fELF engine")
    found = installed_wheel(wheel, site)
    assert found["wheel"] == wheel.name
    assert re.fullmatch(r"[0-9a-f]{64}", found["wheel_sha256"])


def test_a_site_holding_another_build_is_refused_naming_the_module(tmp_path):
    wheel, site = _wheel_and_site(tmp_path, b"\x7fELF another build")
    with pytest.raises(ValueError, match=r"_engine.abi3.so: expected activekv-0.1.0-.*'s"):
        installed_wheel(wheel, site)
    (site / "activekv" / "_engine.abi3.so").unlink()
    with pytest.raises(ValueError, match="it is not there"):
        installed_wheel(wheel, site)


KINDS = ("lookup", "commit", "evict")  # the fake engine's EVENT_KINDS


class _FakeEngine:
    """The Python API's step hooks over a pool of `num_slots`, evicting the oldest when full; each
    layer's load takes 1 ms, so the phases must put the time there."""

    num_slots = 64

    def __init__(self) -> None:
        self.committed: list[int] = []
        self.planned: tuple[list[int], list[int]] = ([], [])
        self.pending: list[tuple[str, int]] = []
        self.last = (0, 0)  # blocks the last step loaded and stored

    def lookup(self, hashes: list[int]) -> int:
        count = 0
        while count < len(hashes) and hashes[count] in self.committed:
            count += 1
        return count

    def plan_load(self, hashes: list[int], devices: list[int]) -> None:
        self.planned = (list(hashes), self.planned[1])

    def plan_store(self, hashes: list[int], devices: list[int]) -> None:
        self.planned = (self.planned[0], list(hashes))

    def build_step(self) -> None:
        pass

    def start_load(self) -> None:
        pass

    def wait_for_layer_load(self, layer: int) -> list[int]:
        if self.planned[0]:
            time.sleep(0.001)
        return []

    def save_kv_layer(self, layer: int) -> None:
        pass

    def wait_for_save(self) -> None:
        loads, stores = self.planned
        self.planned, self.last = ([], []), (len(loads), len(stores))
        for value in stores:
            if len(self.committed) == self.num_slots:
                self.pending.append(("evict", self.committed.pop(0)))
            self.committed.append(value)
            self.pending.append(("commit", value))

    def event_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        events, self.pending = self.pending, []
        kinds = np.array([KINDS.index(kind) for kind, _ in events], np.uint8)
        return kinds, np.array([value for _, value in events], np.uint64)

    @property
    def extent_stats(self) -> dict[str, int]:
        loads, stores = self.last
        return {"last_load_blocks": loads, "last_store_blocks": stores,
                "last_load_runs": min(loads, 1), "last_store_runs": min(stores, 1)}  # fmt: skip


@pytest.mark.parametrize("requests", [True, False])
def test_the_python_bench_times_each_part_of_a_step(requests: bool) -> None:
    from release.scripts.staging_bench_py import PHASES

    rig = _full_rig(_FakeEngine())
    figures = measure_together({"one": rig}, 2, requests, _raise)["one"]
    assert figures["load_gbps"] > 0 and figures["store_gbps"] > 0
    assert set(rig.phases_ms) == {"load", "store"}
    for way, parts in rig.phases_ms.items():
        assert tuple(parts) == PHASES, way
        assert all(value >= 0 for value in parts.values()), parts
    # 32 layers of 1 ms each: the loads' time is in their waits, and nowhere else.
    assert rig.phases_ms["load"]["wait_for_layer_load"] >= 30
    assert max(v for k, v in rig.phases_ms["load"].items() if k != "wait_for_layer_load") < 30
    assert rig.phases_ms["store"]["wait_for_layer_load"] < 30


class _LoggedEngine(_FakeEngine):
    """A fake engine that logs its name at each build_step into a shared list; `fail_at` build
    steps in, it raises."""

    def __init__(self, name: str, log: list[str], fail_at: int = -1) -> None:
        super().__init__()
        self.name, self.log, self.fail_at = name, log, fail_at

    def wait_for_layer_load(self, layer: int) -> list[int]:
        return []  # no sleeping: these tests judge the order of steps, not their time

    def build_step(self) -> None:
        if len(self.log) == self.fail_at:
            raise RuntimeError(f"{self.name} broke")
        self.log.append(self.name)


def _raise(_name: str, error: Exception) -> None:
    raise error


def _full_rig(engine: _FakeEngine) -> Rig:
    rig = Rig(engine, None, blocks=8, block_bytes=1 << 20, block_tokens=16, device_runs=False,
              kind_names=KINDS)  # fmt: skip
    for _ in range(engine.num_slots // 8):
        rig.random_step(False, True)  # a full pool, as make_rig leaves it
    return rig


@pytest.mark.parametrize("requests", [True, False])
def test_rigs_measured_together_take_turns(requests: bool) -> None:
    # int8 against exact holds only if a slow spell of the machine falls on both alike.
    log: list[str] = []
    rigs = {name: _full_rig(_LoggedEngine(name, log)) for name in ("exact", "int8")}
    failures: list[str] = []
    figures = measure_together(rigs, 3, requests, lambda name, error: failures.append(name))
    assert set(figures) == {"exact", "int8"} and not failures
    measured = log[-3 * 3 * 2 :]  # 3 repeats of a load, a store and a step of both, per rig
    assert measured == (["exact"] * 3 + ["int8"] * 3) * 3
    assert all(row["load_gbps"] > 0 for row in figures.values())


def test_a_rig_that_fails_is_reported_and_the_others_go_on() -> None:
    log: list[str] = []
    rigs = {"exact": _full_rig(_LoggedEngine("exact", log))}
    rigs["int8"] = _full_rig(_LoggedEngine("int8", log))
    rigs["int8"].engine.fail_at = len(log) + 4  # in its second sample
    failures: list[tuple[str, str]] = []
    figures = measure_together(rigs, 3, False, lambda name, e: failures.append((name, str(e))))
    assert failures == [("int8", "int8 broke")]
    assert set(figures) == {"exact"} and figures["exact"]["store_gbps"] > 0
    assert set(rigs) == {"exact", "int8"}  # the caller's rigs are the caller's to drop
