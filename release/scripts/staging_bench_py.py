"""The CUDA route's staging throughput through the Python API, as vLLM's connector drives it.

Standard library only, plus the wheel (put on `sys.path` by `--site`, or importable): the device
KV is the wheel's own `DeviceKvCache`, so no framework is needed. Whole engine steps through
`activekv._engine.Engine(..., device="cuda")` (plans, `build_step`, the per-layer hooks,
`wait_for_save`, the events read back by `event_arrays()`), per block size (K and V of one
layer: 16 KiB to 1 MiB), each loads alone, stores alone and both at once, in two scenarios
(the same as tests/gpu/staging_bench.cpp's):

  random    blocks loaded in random order from all over the full pool, new blocks stored;
  requests  chains of 16-64 blocks, each new request sharing a prefix of a recent earlier
            request's chain, which it loads back (as far as still committed) while the step
            stores its own blocks; loads alone read earlier chains back whole; measured first,
            after request-shaped steps have turned the freshly filled pool over twice;
  pressure  serving-shaped under eviction pressure: requests of 8-160 blocks (cut to the step's
            room), each sharing a prefix (a hit ratio of 0.2-0.5) of an earlier request drawn by
            recency (age geometric, mean 32 requests), the rest of each prompt stored, the step's
            blocks in all: steps heavy with stores, each evicting about as many blocks, the pool
            turning over every few steps; after such steps turned it over twice.

Each row's steps of both at once are also judged against their mix-adjusted ceiling (with
--ceiling): the longest of load bytes / H2D, store bytes / D2H and all bytes / both ways, from
the C++ run's ceilings (`both_ways_of_mix_ceiling`, the median over steps of that time over the
step's).

Exact and int8 run on two engines side by side, their steps taking turns (measure_together), so
that a slow spell of the machine falls on both and int8's ratio to exact holds; each figure is
the median of REPEATS steps.

Device blocks are shuffled per step (a fragmented free-block queue) unless --device-runs.
`--paths` adds rows with a forced transfer path (ACTIVEKV_CUDA_TRANSFER_PATH, read when an engine
is made). `--ceiling` takes the C++ bench's record (gpu-staging.json) of the same machine for the
fractions of the ceiling. Progress on stderr; one JSON object to --out (and stdout).

`phases_ms` gives, per block size, scenario and mode (int8 too), the median milliseconds of each
part of a step (PHASES: the plans, build_step, start_load, the 32 waits and saves summed,
wait_for_save, events), loads alone and stores alone: where a step's time goes; and under
`split` the same steps and those of both at once by SPLIT (plans, build_step, eviction,
allocation, issue, wait, commit, events). Eviction, allocation and commit are the engine's own
clock where `extent_stats` gives it (last_eviction_ns, last_allocation_ns, last_commit_ns);
else allocation (eviction in it) is save_kv_layer(0)'s time over the median of the other
layers' saves (allocate_stores runs there), and eviction and commit are null.

`--wheel` names the wheel installed at --site: the record carries its name and sha256, and the
run stops first if a native module of the site is not that wheel's (its RECORD's digest).

    python -m release.scripts.staging_bench_py --site SITE --wheel WHEEL --out staging-py.json \
        [--ceiling gpu-staging.json] [--paths kernels,runs]
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import random
import statistics
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KIB = 1024
GIB = 1 << 30
LAYERS = 32
HEADS = 8
HEAD_DIM = 128  # fp16: 2 KiB of K (and of V) per token
BLOCK_SIZES = (16 * KIB, 64 * KIB, 128 * KIB, 256 * KIB, 1024 * KIB)
PATH_VARIABLE = "ACTIVEKV_CUDA_TRANSFER_PATH"
PATHS = ("kernels", "block-copies", "runs", "runs-staged", "runs-batched")
# Events of a transfer that did not happen: a step that has one measured nothing.
LOST = ("quarantine", "load_error", "drop", "fatal")
WAYS = ("load", "store", "both_ways")
# Steps of each kind per figure (its median): int8 against exact within 1.8 +- 0.05 moved by
# whole seconds of a noisy machine at 5 (an H100, wheel 3ffb0206: 64 KiB request loads 1.63x
# beside 1.92x in an earlier run of the same code).
REPEATS = 15


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# The parts of a step, timed apart (`phases_ms` of the record): where a step's time goes.
PHASES = ("plan", "build_step", "start_load", "wait_for_layer_load", "save_kv_layer",
          "wait_for_save", "events")  # fmt: skip
# The same steps split as the C++ bench splits them (its kPhases).
SPLIT = ("plans", "build_step", "eviction", "allocation", "issue", "wait", "commit", "events")
SCENARIOS = ("requests", "pressure", "random")  # measured in this order


def mix_ceiling_seconds(load_bytes: float, store_bytes: float, ceiling: dict[str, float]) -> float:
    """The copy ceiling of a step moving these bytes (GB/s ceilings by way): the longest of its
    loads over H2D, its stores over D2H and all of it over both ways at once."""
    return max(load_bytes / (ceiling["load"] * 1e9), store_bytes / (ceiling["store"] * 1e9),
               (load_bytes + store_bytes) / (ceiling["both_ways"] * 1e9))  # fmt: skip


def split_phases(phases: dict[str, float], save_0: float, saves: list[float],
                 engine_ns: dict[str, int] | None) -> dict[str, float | None]:  # fmt: skip
    """SPLIT of one step (seconds) from its PHASES, its save_kv_layer(0) and other saves, and
    the engine's own clock (nanoseconds of allocation, eviction, commit) where it has one."""
    if engine_ns is not None:
        allocation = engine_ns["allocation"] * 1e-9
        eviction: float | None = engine_ns["eviction"] * 1e-9
        commit: float | None = engine_ns["commit"] * 1e-9
    else:
        allocation = max(0.0, save_0 - statistics.median(saves)) if saves else 0.0
        eviction = commit = None
    issue = phases["start_load"] + phases["save_kv_layer"] - allocation
    wait = phases["wait_for_layer_load"] + phases["wait_for_save"] - (commit or 0.0)
    return {
        "plans": phases["plan"], "build_step": phases["build_step"],
        "eviction": eviction,
        "allocation": allocation - (eviction or 0.0) if eviction is not None else allocation,
        "issue": issue, "wait": wait, "commit": commit, "events": phases["events"],
    }  # fmt: skip


@dataclass
class Step:
    seconds: float
    loaded: int
    stored: int
    load_runs: int
    store_runs: int
    phases: dict[str, float] = field(default_factory=dict)  # seconds per part of PHASES
    split: dict[str, float | None] = field(default_factory=dict)  # seconds per part of SPLIT


@dataclass
class Rig:
    """One engine with its device KV; loads land in the first `blocks` device blocks, stores are
    read from the others."""

    engine: Any
    kv: Any
    blocks: int
    block_bytes: int  # stored bytes of one block, all layers
    block_tokens: int
    device_runs: bool
    kind_names: tuple[str, ...]  # the engine module's EVENT_KINDS, by event_arrays()' kinds
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    next_hash: int = 1
    stored: list[int] = field(default_factory=list)
    position: dict[int, int] = field(default_factory=dict)
    requests: list[list[int]] = field(default_factory=list)
    settled: int = 0
    # The scenario begin() started and its steps so far, by way (load, store, both).
    scenario: str = "random"
    samples: dict[str, list[Step]] = field(default_factory=dict)
    # Median milliseconds per part of PHASES of the last figures()'s loads alone and stores alone.
    phases_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    # Median milliseconds per part of SPLIT of its loads alone, stores alone and both (None: not
    # measured).
    split_ms: dict[str, dict[str, float | None]] = field(default_factory=dict)
    # The C++ run's ceilings (GB/s by way: load, store, both_ways), for the mix-adjusted ceiling.
    ceiling: dict[str, float] = field(default_factory=dict)

    def run(self, loads: list[int], stores: list[int]) -> Step:
        load_devices = list(range(self.blocks))
        store_devices = list(range(self.blocks, 2 * self.blocks))
        if not self.device_runs:
            self.rng.shuffle(load_devices)
            self.rng.shuffle(store_devices)
        engine = self.engine
        phases = dict.fromkeys(PHASES, 0.0)
        clock = time.perf_counter
        start = clock()
        if loads:
            engine.plan_load(loads, load_devices[: len(loads)])
        if stores:
            engine.plan_store(stores, store_devices[: len(stores)])
        mark = clock()
        phases["plan"] = mark - start
        engine.build_step()
        phases["build_step"], mark = clock() - mark, clock()
        engine.start_load()
        phases["start_load"], mark = clock() - mark, clock()
        saves: list[float] = []
        for layer in range(LAYERS):
            engine.wait_for_layer_load(layer)
            now = clock()
            phases["wait_for_layer_load"] += now - mark
            engine.save_kv_layer(layer)
            mark = clock()
            saves.append(mark - now)
        phases["save_kv_layer"] = sum(saves)
        engine.wait_for_save()
        phases["wait_for_save"], mark = clock() - mark, clock()
        kinds, values = engine.event_arrays()
        end = clock()
        phases["events"] = end - mark
        seconds = end - start
        stats = engine.extent_stats
        clocked = ("last_allocation_ns", "last_eviction_ns", "last_commit_ns")
        engine_ns = (
            {key[5:-3]: int(stats[key]) for key in clocked} if all(k in stats for k in clocked)
            else None
        )  # fmt: skip
        names = [self.kind_names[k] for k in kinds.tolist()]
        for kind, value in zip(names, values.tolist(), strict=True):
            if kind in LOST:
                raise RuntimeError(
                    f"a step lost a transfer ({kind} {value}): nothing it measured counts"
                )
            if kind == "commit":
                self.position[value] = len(self.stored)
                self.stored.append(value)
            elif kind == "evict":
                at = self.position.pop(value)
                last = self.stored.pop()
                if last != value:
                    self.stored[at] = last
                    self.position[last] = at
        self.settled = len(self.requests)
        return Step(
            seconds,
            stats["last_load_blocks"],
            stats["last_store_blocks"],
            stats["last_load_runs"],
            stats["last_store_runs"],
            phases,
            split_phases(phases, saves[0], saves[1:], engine_ns),
        )

    def fresh(self, count: int) -> list[int]:
        hashes = list(range(self.next_hash, self.next_hash + count))
        self.next_hash += count
        return hashes

    def random_step(self, load: bool, store: bool) -> Step:
        loads = self.rng.sample(self.stored, self.blocks) if load else []
        return self.run(loads, self.fresh(self.blocks) if store else [])

    def request_step(self, load: bool, store: bool) -> Step:
        loads: list[int] = []
        stores: list[int] = []
        attempts = 0
        while (load and len(loads) < self.blocks) or (store and len(stores) < self.blocks):
            attempts += 1
            if attempts > 64 * self.blocks:
                break
            chain = self.rng.randint(16, 64)
            hashes: list[int] = []
            if load and len(loads) < self.blocks and self.settled > 0:
                recent = min(self.settled, self.engine.num_slots // 64 + 1)
                parent = self.requests[self.rng.randint(self.settled - recent, self.settled - 1)]
                shared = self.rng.randint(chain // 4, 3 * chain // 4) if store else chain
                hashes = parent[: min(shared, len(parent))]
                hashes = hashes[: self.engine.lookup(hashes)][: self.blocks - len(loads)]
                loads += hashes
            if store and len(stores) < self.blocks:
                own = self.fresh(min(chain - min(chain, len(hashes)), self.blocks - len(stores)))
                stores += own
                hashes = hashes + own
            if store and hashes:
                self.requests.append(hashes)
        self.engine.event_arrays()  # the lookups'
        return self.run(loads, stores)

    def pressure_step(self, load: bool, store: bool) -> Step:
        """Serving-shaped under eviction pressure (the module's `pressure`): requests of 8-160
        blocks cut to the step's room, a hit ratio of 0.2-0.5 of each prompt shared with an
        earlier request drawn by recency and loaded as far as committed, the rest stored, until
        the step holds `blocks` in all (loads alone, stores alone: that side only)."""
        loads: list[int] = []
        stores: list[int] = []

        def room() -> int:
            return self.blocks - (len(loads) if load else 0) - (len(stores) if store else 0)

        attempts = 0
        while room() > 0 and attempts < 64 * self.blocks:
            attempts += 1
            prompt = min(self.rng.randint(8, 160), room())
            shared = int(self.rng.uniform(0.2, 0.5) * prompt + 0.5)
            hashes: list[int] = []
            if self.settled > 0:
                age = min(int(self.rng.expovariate(1 / 32)), self.settled - 1)
                parent = self.requests[self.settled - 1 - age]
                hashes = parent[: min(shared, len(parent))]
                hashes = hashes[: self.engine.lookup(hashes)]
                if load:
                    hashes = hashes[: room()]
                    loads += hashes
            if store:
                own = self.fresh(min(prompt - min(prompt, len(hashes)), room()))
                stores += own
                if hashes or own:
                    self.requests.append(hashes + own)
        self.engine.event_arrays()  # the lookups'
        return self.run(loads, stores)

    def step(self, load: bool, store: bool) -> Step:
        """One step of begin()'s scenario."""
        if self.scenario == "requests":
            return self.request_step(load, store)
        if self.scenario == "pressure":
            return self.pressure_step(load, store)
        return self.random_step(load, store)

    def begin(self, scenario: bool | str) -> None:
        """Starts a measurement of one scenario (SCENARIOS; True: requests, False: random);
        request-shaped and pressure steps first turn the pool over twice (the fragmented pool
        the measured steps allocate in)."""
        if isinstance(scenario, bool):
            scenario = "requests" if scenario else "random"
        if scenario not in SCENARIOS:
            raise ValueError(f"scenario: expected one of {list(SCENARIOS)}; got {scenario!r}")
        self.scenario = scenario
        self.samples = {"load": [], "store": [], "both": []}
        if scenario != "random":
            turned = 0
            while turned < 2 * self.engine.num_slots:
                turned += self.step(True, True).stored

    def sample(self) -> None:
        """One load step, one store step and one step of both, of begin()'s scenario."""
        self.samples["load"].append(self.step(True, False))
        self.samples["store"].append(self.step(False, True))
        self.samples["both"].append(self.step(True, True))

    def figures(self) -> dict[str, float]:
        """The medians of the samples since begin(); phases_ms too."""
        loads, stores, both = self.samples["load"], self.samples["store"], self.samples["both"]
        median = statistics.median
        self.phases_ms = {
            way: {p: round(median(s.phases[p] for s in steps) * 1e3, 3) for p in PHASES}
            for way, steps in (("load", loads), ("store", stores))
        }
        self.split_ms = {
            way: {p: _median_ms([s.split.get(p) for s in steps]) for p in SPLIT}
            for way, steps in (("load", loads), ("store", stores), ("both", both))
        }
        loaded, load_runs = sum(s.loaded for s in both), sum(s.load_runs for s in both)
        stored, store_runs = sum(s.stored for s in both), sum(s.store_runs for s in both)
        return {
            "load_gbps": median(s.loaded * self.block_bytes / s.seconds / 1e9 for s in loads),
            "store_gbps": median(s.stored * self.block_bytes / s.seconds / 1e9 for s in stores),
            "both_ways_gbps": median(
                (s.loaded + s.stored) * self.block_bytes / s.seconds / 1e9 for s in both
            ),
            "load_tokens_per_s": median(s.loaded * self.block_tokens / s.seconds for s in loads),
            "store_tokens_per_s": median(s.stored * self.block_tokens / s.seconds for s in stores),
            "load_blocks_per_run": loaded / load_runs if load_runs else 0.0,
            "store_blocks_per_run": stored / store_runs if store_runs else 0.0,
            "both_ways_load_share": loaded / (loaded + stored) if loaded + stored else 0.0,
            **self.mix_figures(both),
        }

    def mix_figures(self, both: list[Step]) -> dict[str, float]:
        """The steps of both against their mix-adjusted ceilings (medians over the steps): the
        ceiling's GB/s and the ceiling's time over the step's; nothing without a ceiling."""
        if not self.ceiling or not both:
            return {}
        gbps, of = [], []
        for s in both:
            load_bytes, store_bytes = s.loaded * self.block_bytes, s.stored * self.block_bytes
            floor = mix_ceiling_seconds(load_bytes, store_bytes, self.ceiling)
            gbps.append((load_bytes + store_bytes) / floor / 1e9)
            of.append(floor / s.seconds)
        return {"both_ways_mix_ceiling_gbps": statistics.median(gbps),
                "both_ways_of_mix_ceiling": statistics.median(of)}  # fmt: skip


def _median_ms(values: list[float | None]) -> float | None:
    """The median of the measured values, in ms (None when none was measured)."""
    measured = [v for v in values if v is not None]
    return round(statistics.median(measured) * 1e3, 3) if measured else None


def measure_together(
    rigs: dict[str, Rig], repeats: int, requests: bool | str,
    failed: Callable[[str, Exception], None],
) -> dict[str, dict[str, float]]:  # fmt: skip
    """One scenario on each rig, their steps interleaved (one rig's load, store and both, then
    the next rig's, `repeats` times), so that what slows the machine for a while slows them all
    alike and their ratios hold: int8 against exact is measured this way. `requests`: a scenario
    of SCENARIOS (True: requests, False: random). A rig that raises is reported to `failed` by
    its name and left out of the rest and of the result."""
    live = dict(rigs)

    def each(call: Callable[[Rig], None]) -> None:
        for name, rig in list(live.items()):
            try:
                call(rig)
            except Exception as error:
                failed(name, error)
                del live[name]

    each(lambda rig: rig.begin(requests))
    for _ in range(repeats):
        each(Rig.sample)
    return {name: rig.figures() for name, rig in live.items()}


def make_rig(
    engine_module: Any, block: int, mode: str, pool: int, moved: int, path: str | None,
    device_runs: bool,
) -> Rig:  # fmt: skip
    tokens = block // (2 * HEADS * HEAD_DIM * 2)
    blocks = moved // (block * LAYERS)
    dtype = engine_module.KvDtype.fp16
    layout = engine_module.KvBlockLayout(LAYERS, tokens, HEADS, HEAD_DIM, dtype)
    previous = os.environ.get(PATH_VARIABLE)
    if path is not None:
        os.environ[PATH_VARIABLE] = path
    try:
        engine = engine_module.Engine(layout, mode, pool, 4, blocks, 2 * blocks, device="cuda")
    finally:
        if path is not None:
            if previous is None:
                del os.environ[PATH_VARIABLE]
            else:
                os.environ[PATH_VARIABLE] = previous
    kv = engine_module.DeviceKvCache(layout, 2 * blocks)
    engine.register_kv_caches(kv.layers)
    slot = engine.slot_bytes
    rig = Rig(engine, kv, blocks, slot, LAYERS * tokens, device_runs, engine_module.EVENT_KINDS)
    # A full pool, so that loads come from all over it: one step more than it holds whole steps
    # (eviction frees whole extents, so the count of stored blocks may never reach num_slots).
    for _ in range(-(-engine.num_slots // blocks)):
        rig.random_step(False, True)
    return rig


def installed_wheel(wheel: Path, site: Path) -> dict[str, str]:
    """The wheel's name and sha256, once each native module it lists is in `site` with the
    digest its RECORD gives; a ValueError naming the first module that is missing or differs."""
    with zipfile.ZipFile(wheel) as archive:
        records = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise ValueError(f"{wheel}: expected one .dist-info/RECORD; found {len(records)}")
        entries = list(csv.reader(io.StringIO(archive.read(records[0]).decode("utf-8"))))
    modules = [(row[0], row[1]) for row in entries if len(row) >= 2 and row[0].endswith(".so")]
    if not modules:
        raise ValueError(f"{wheel}: expected native modules in its RECORD; found none")
    for name, digest in modules:
        installed = site / name
        if not installed.is_file():
            raise ValueError(f"{installed}: expected {wheel.name}'s {name}; it is not there")
        data = installed.read_bytes()
        got = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
        if got.rstrip("=") != digest.rstrip("="):
            raise ValueError(f"{installed}: expected {wheel.name}'s {name} ({digest}); got {got}")
    return {"wheel": wheel.name, "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, help="where the wheel is installed (pip --target)")
    parser.add_argument("--wheel", type=Path, help="the wheel installed at --site")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ceiling", type=Path, help="the C++ bench's gpu-staging.json")
    parser.add_argument("--pool-gib", type=int, default=4)
    parser.add_argument("--moved-gib", type=int, default=1, help="per step, each way")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--block-kib", default=",".join(str(b // KIB) for b in BLOCK_SIZES))
    parser.add_argument("--paths", default="", help=f"forced paths, of {','.join(PATHS)}")
    parser.add_argument("--device-runs", action="store_true", help="device blocks in order")
    args = parser.parse_args(argv)
    artefact: dict[str, str] = {}
    if args.wheel is not None:
        if args.site is None:
            parser.error("--wheel: expected --site too (where the wheel is installed)")
        try:
            artefact = installed_wheel(args.wheel, args.site)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            parser.error(f"--wheel: {error}")
    if args.site is not None:
        sys.path.insert(0, str(args.site))
    import activekv._engine as engine_module

    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        parser.error(f"--paths: unknown {unknown}; expected some of {list(PATHS)}")
    ceiling: dict[str, float] = {}
    if args.ceiling is not None:
        record = json.loads(args.ceiling.read_text())
        ceiling = {"load": record["ceiling_gbps"]["h2d"], "store": record["ceiling_gbps"]["d2h"],
                   "both_ways": record["both_ways_ceiling_gbps"]}  # fmt: skip
    pool, moved = args.pool_gib * GIB, args.moved_gib * GIB
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    ratios: list[dict[str, Any]] = []

    def add(block: int, scenario: str, path: str, figures: dict[str, float]) -> None:
        row: dict[str, Any] = {"block_bytes": block, "scenario": scenario, "path": path}
        row.update({k: round(v, 3 if "share" in k else 2) for k, v in figures.items()})
        for way in WAYS:
            if ceiling:
                row[f"{way}_of_ceiling"] = round(figures[f"{way}_gbps"] / ceiling[way], 3)
        rows.append(row)
        gbps = " ".join(f"{way} {figures[f'{way}_gbps']:6.2f}" for way in WAYS)
        per_run = f"{figures['load_blocks_per_run']:.1f} / {figures['store_blocks_per_run']:.1f}"
        mix = ""
        if "both_ways_of_mix_ceiling" in figures:
            row["both_ways_of_mix_ceiling"] = round(figures["both_ways_of_mix_ceiling"], 3)
            mix = (f" ({figures['both_ways_of_mix_ceiling']:.3f} of its mix ceiling "
                   f"{figures['both_ways_mix_ceiling_gbps']:.2f})")  # fmt: skip
        elapsed = time.perf_counter() - started
        _log(f"{block // KIB:6d} KiB  {scenario:8s} {path:12s} {gbps}{mix} GB/s  "
             f"loads {100 * figures['both_ways_load_share']:.0f}%  blocks/run {per_run}  "
             f"t={elapsed:.0f}s")  # fmt: skip

    errors: list[dict[str, Any]] = []
    phases: list[dict[str, Any]] = []

    def write() -> None:
        result = {
            "api": "python (activekv._engine.Engine, device='cuda', DeviceKvCache)",
            **artefact,
            "engine_module": engine_module.__file__,
            "build_info": engine_module.build_info(),
            "pool_bytes": pool, "moved_bytes": moved, "layers": LAYERS, "repeats": args.repeats,
            "device_blocks": "in order" if args.device_runs else "shuffled",
            "ceiling_gbps": ceiling or None,
            "rows": rows, "int8_vs_exact_by_scenario": ratios, "phases_ms": phases,
            "errors": errors,
            "seconds": round(time.perf_counter() - started, 1),
        }  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    def failed(block: int, what: str, error: Exception) -> None:
        errors.append(
            {"block_bytes": block, "what": what, "error": f"{type(error).__name__}: {error}"}
        )
        _log(f"{block // KIB:6d} KiB  {what}: failed: {type(error).__name__}: {error}")

    def measure(
        block: int, modes: tuple[str, ...], path: str | None
    ) -> dict[str, dict[str, dict[str, float]]]:
        """Every scenario (random last: its loads would scramble the pool) on one new
        engine per mode, measured together (measure_together); a mode whose engine fails is
        recorded and left out, the others go on. The engines are released on return."""
        rigs: dict[str, Rig] = {}
        for mode in modes:
            try:
                rigs[mode] = make_rig(engine_module, block, mode, pool, moved, path,
                                      args.device_runs)  # fmt: skip
            except Exception as error:  # one rig's failure is recorded; the others still run
                failed(block, path or mode, error)
        for rig in rigs.values():
            rig.ceiling = ceiling
        figures: dict[str, dict[str, dict[str, float]]] = {mode: {} for mode in rigs}  # by scenario
        for scenario in SCENARIOS:
            measured = measure_together(
                rigs, args.repeats, scenario,
                lambda mode, error: failed(block, path or mode, error),
            )  # fmt: skip
            for mode in set(rigs) - set(measured):
                del rigs[mode], figures[mode]
            for mode, row in measured.items():
                figures[mode][scenario] = row
                phases.append({"block_bytes": block, "scenario": scenario, "mode": mode,
                               "path": path or "auto", **rigs[mode].phases_ms,
                               "split": rigs[mode].split_ms})  # fmt: skip
        return figures

    for block in (int(b) * KIB for b in args.block_kib.split(",")):
        measured = measure(block, ("exact", "int8"), None)
        for scenario, row in measured.get("exact", {}).items():
            add(block, scenario, "auto", row)
        for scenario in ("random", "requests", "pressure"):
            exact = measured.get("exact", {}).get(scenario)
            int8 = measured.get("int8", {}).get(scenario)
            if not (exact and int8 and exact["load_tokens_per_s"] and exact["store_tokens_per_s"]):
                continue
            load = int8["load_tokens_per_s"] / exact["load_tokens_per_s"]
            store = int8["store_tokens_per_s"] / exact["store_tokens_per_s"]
            ratios.append({"block_bytes": block, "scenario": scenario,
                           "int8_over_exact_load": round(load, 3),
                           "int8_over_exact_store": round(store, 3)})  # fmt: skip
            _log(f"{block // KIB:6d} KiB  {scenario:8s} int8 / exact tokens/s: load {load:.2f}x  "
                 f"store {store:.2f}x")  # fmt: skip
        for path in paths:
            for scenario, row in measure(block, ("exact",), path).get("exact", {}).items():
                add(block, scenario, path, row)
        write()  # what is measured so far survives a timeout
    write()
    print(args.out.read_text())
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
