"""Eviction experiment (engine/offload/EVICTION_EXPERIMENT.md): request-shaped traffic through the
Python reference's CPU route with a full pool, once per eviction rule, reporting the runs loads and
stores take and the prefix hit rate. The reference's own rule (SPEC.md §3) is "extent_lru"; the
others are the alternatives it was measured against, defined here as subclasses that replace only
the choice of victims.

    python -m reference.eviction_experiment [--slots 4096] [--steps 1000] [--seeds 1 2] [--rules ..]

Not a gate and not shipped; deterministic for a seed. The geometry is tiny (one layer, one token,
one head, eight elements) since only the bookkeeping matters here. Traffic, after a warm-up of
short chains with scattered refreshes that fills and fragments the pool: steps of 1-3 requests,
each a chain of 16-64 block hashes; three in four share a prefix of an earlier request (half of
those one of the last eight, half one further back at an exponentially distributed distance of
mean REUSE requests), and the step loads the prefix's leading blocks
that lookup finds while it stores the rest of the chain (a prefix block that was evicted is stored
again, as vLLM recomputes it).
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from reference import engine as ref

LAYOUT = SimpleNamespace(num_layers=1, block_size=1, num_kv_heads=1, head_dim=8, dtype="fp16")
REGION_BLOCKS = 256
DEVICE_BLOCKS = 2 * REGION_BLOCKS + 2
RECENT = 8  # "one of the latest requests": still cached, loaded back
REUSE = 150  # mean distance, in requests, of the others (the pool holds ~120 requests' blocks)


class BlockLru(ref.Engine):
    """ "lru": the least recently used evictable block alone, one per store that finds no slot."""

    def _victims(self) -> list[int]:
        candidates = self._evictable()
        return [min(candidates)[1]] if candidates else []

    def _evictable(self) -> list[tuple[int, int]]:
        return [
            (block["last_use"], victim)
            for victim, block in self._blocks.items()
            if block["state"] == "committed" and block["pins"] == 0
        ]


class ExtentOld(BlockLru):
    """ "extent_old:X": the LRU block and, with it, every other evictable block of its extent whose
    stamp is at most oldest + X * (clock - oldest), those by slot."""

    fraction = 0.25

    def _victims(self) -> list[int]:
        candidates = self._evictable()
        if not candidates:
            return []
        oldest, victim = min(candidates)
        extent = self._blocks[victim]["extent"]
        horizon = oldest + int(self.fraction * (self._clock - oldest))
        companions = sorted(
            (self._blocks[other]["slot"], other)
            for stamp, other in candidates
            if other != victim and self._blocks[other]["extent"] == extent and stamp <= horizon
        )
        return [victim] + [other for _, other in companions]


def engine_class(rule: str) -> type[ref.Engine]:
    """The engine for a --rules entry: "lru", "extent_old:X" or "extent_lru" (the reference)."""
    name, _, fraction = rule.partition(":")
    if name == "extent_lru" and not fraction:
        return ref.Engine
    if name == "lru" and not fraction:
        return BlockLru
    if name == "extent_old":
        try:
            horizon = float(fraction or ExtentOld.fraction)
        except ValueError:
            raise SystemExit(f"--rules: {rule!r}: expected extent_old:X with X a number") from None
        return type(f"ExtentOld{horizon}", (ExtentOld,), {"fraction": horizon})
    raise SystemExit(f"--rules: expected lru, extent_old[:X] or extent_lru; got {rule!r}")


@dataclass
class Totals:
    steps: int = 0
    load_blocks: int = 0
    load_runs: int = 0
    store_blocks: int = 0
    store_runs: int = 0
    store_steps: int = 0
    split_steps: int = 0
    requested: int = 0  # prefix blocks the lookups asked about
    loaded: int = 0  # of those, blocks lookup found and the step loaded
    evictions: int = 0
    free_slots: int = 0  # summed over steps, after each step


def _step(engine: ref.Engine, loads: list[int], stores: list[int]) -> list[tuple[str, int]]:
    """One engine step of one layer; its events."""
    engine.plan_load(loads, list(range(len(loads))))
    engine.plan_store(stores, list(range(REGION_BLOCKS, REGION_BLOCKS + len(stores))))
    engine.build_step()
    engine.start_load()
    engine.wait_for_layer_load(0)
    engine.save_kv_layer(0)
    engine.wait_for_save()
    return engine.events()


def run(rule: str, slots: int, steps: int, seed: int, warmup_steps: int) -> Totals:
    rng = random.Random(seed)
    slot_bytes = ref.stored_block_bytes(LAYOUT, "exact")
    engine = engine_class(rule)(
        LAYOUT, "exact", slots * slot_bytes, 4, REGION_BLOCKS, DEVICE_BLOCKS
    )
    kv = np.zeros((2, DEVICE_BLOCKS, 1, 1, 8), np.uint16)
    engine.register_kv_caches([kv])
    chains: list[list[int]] = []
    totals = Totals()
    burn_in = warmup_steps + steps // 5  # the pool settles before anything is counted
    for step_index in range(warmup_steps + steps):
        loads: list[int] = []
        stores: list[int] = []
        requested = 0
        if step_index < warmup_steps:
            # Short chains in steps of many requests, and a few refreshes anywhere: the LRU order
            # stops following the slots, so later evictions free scattered slots.
            for _ in range(rng.randint(8, 32)):
                fresh = [rng.getrandbits(64) for _ in range(rng.randint(1, 3))]
                chains.append(fresh)
                stores += fresh
            for _ in range(rng.randint(0, 8)):
                chain = rng.choice(chains[:-1] or chains)
                block = chain[rng.randrange(len(chain))]
                if engine.lookup([block]) and block not in loads:
                    loads.append(block)
        else:
            for _ in range(rng.randint(1, 3)):
                shared: list[int] = []
                if rng.random() < 0.75:
                    # Half of the time one of the latest requests, else one further back, how
                    # far drawn so that some are still cached and some evicted already.
                    if rng.random() < 0.5:
                        back = rng.randrange(RECENT)
                    else:
                        back = int(rng.expovariate(1 / REUSE))
                    base = chains[-1 - min(back, len(chains) - 1)]
                    shared = base[: rng.randint(1, min(len(base), 56))]
                length = rng.randint(16, 64)
                fresh = [rng.getrandbits(64) for _ in range(max(length - len(shared), 8))]
                chain = shared + fresh
                hits = engine.lookup(chain)
                room_loads = REGION_BLOCKS - len(loads)
                room_stores = REGION_BLOCKS - len(stores)
                if hits > room_loads or len(chain) - hits > room_stores:
                    break
                requested += len(shared)
                chains.append(chain)
                loads += chain[:hits]
                stores += chain[hits:]
        before = engine.extent_stats
        events = _step(engine, loads, stores)
        after = engine.extent_stats
        if step_index < burn_in:
            continue
        totals.steps += 1
        totals.load_blocks += after["last_load_blocks"]
        totals.load_runs += after["last_load_runs"]
        totals.store_blocks += after["last_store_blocks"]
        totals.store_runs += after["last_store_runs"]
        totals.store_steps += after["store_steps"] - before["store_steps"]
        totals.split_steps += after["split_steps"] - before["split_steps"]
        totals.requested += requested
        totals.loaded += sum(1 for kind, _ in events if kind == "hit")
        totals.evictions += sum(1 for kind, _ in events if kind == "evict")
        totals.free_slots += after["free_slots"]
    return totals


def _row(name: str, totals: Totals, slots: int) -> dict[str, Any]:
    return {
        "rule": name,
        "load blocks/run": totals.load_blocks / max(totals.load_runs, 1),
        "store blocks/run": totals.store_blocks / max(totals.store_runs, 1),
        "split steps": totals.split_steps / max(totals.store_steps, 1),
        "hit rate": totals.loaded / max(totals.requested, 1),
        "evictions/step": totals.evictions / max(totals.steps, 1),
        "occupancy": 1 - totals.free_slots / max(totals.steps, 1) / slots,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=250)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    rules = ["lru", "extent_old:0.1", "extent_old:0.25", "extent_old:0.5", "extent_lru"]
    parser.add_argument("--rules", nargs="+", default=rules, help="lru, extent_old:X, extent_lru")
    args = parser.parse_args(argv)
    for rule in args.rules:
        engine_class(rule)  # a bad rule is refused before anything runs
    rows = []
    for rule in args.rules:
        summed = Totals()
        for seed in args.seeds:
            totals = run(rule, args.slots, args.steps, seed, args.warmup)
            for key, value in vars(totals).items():
                setattr(summed, key, getattr(summed, key) + value)
        rows.append(_row(rule, summed, args.slots))
        print(rows[-1], flush=True)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        fractions = ("split steps", "hit rate", "occupancy")
        cells = [row["rule"]]
        cells += [f"{row[key]:.3f}" if key in fractions else f"{row[key]:.1f}" for key in keys[1:]]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
