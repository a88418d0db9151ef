"""Eviction experiment (engine/offload/EVICTION_EXPERIMENT.md): request-shaped traffic through the
Python reference's CPU route with a full pool, once per eviction rule, reporting the runs loads and
stores take and the prefix hit rate. The reference's own rule (SPEC.md §3) is "extent_lru"; the
others are the alternatives it was measured against, defined here as subclasses that replace only
the choice of victims: lru, extent_old:X, and the rules that also evict young-enough extents to
make one free run for the step (issue 19, longer runs): grow:F, sweep:F and window:F.

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


class ExtentGrow(ref.Engine):
    """ "grow:F": extent_lru's eviction (the oldest extent's evictable blocks, by slot), then, while
    the free run it leaves (the longest run of free slots that holds one of the freed slots) is
    shorter than the step's stores, the extent that borders that run on either side, the older of
    the two, if it holds an evictable block and is among the oldest F of the extents that do, its
    evictable blocks by slot; it stops when neither side qualifies.

    Variants: "grow_rest:F" stops once the run holds the step's stores not yet decided;
    "grow_age:F" counts an extent old when its stamp is at most oldest + F * (clock - oldest);
    "grow_seed:F:K" grows from each of the oldest K extents (older first, while they qualify)
    and takes the first run that holds the step's stores, else the longest (the older first)."""

    fraction = 0.1
    rest = False  # the run must hold the step's stores not yet decided only
    by_age = False  # old: stamp <= oldest + F * (clock - oldest), instead of the oldest F by rank
    seeds = 1

    def _allocate_step(self, entries: list[dict[str, Any]]) -> None:
        # The step's stores: its distinct hashes neither committed nor being stored.
        hashes = {entry["hash"] for entry in entries}
        self._step_stores = sum(1 for block_hash in hashes if block_hash not in self._blocks)
        super()._allocate_step(entries)

    def _need(self) -> int:
        if not self.rest:
            return self._step_stores
        decided = sum(1 for block in self._blocks.values() if block["slot"] is None)
        return self._step_stores - decided

    def _old_extents(self) -> tuple[dict[int, list[tuple[int, int]]], list[int], int]:
        """The extents that hold an evictable block -> those blocks as (slot, hash), the extents
        oldest first, and the newest stamp an old extent may have."""
        members: dict[int, list[tuple[int, int]]] = {}
        for block_hash, block in self._blocks.items():
            if block["state"] == "committed" and block["pins"] == 0:
                members.setdefault(block["extent"], []).append((block["slot"], block_hash))
        order = sorted(members, key=self._extent_stamps.__getitem__)
        if not order:
            return members, order, 0
        oldest = self._extent_stamps[order[0]]
        if self.by_age:
            return members, order, oldest + int(self.fraction * (self._clock - oldest))
        return (
            members,
            order,
            self._extent_stamps[order[max(1, int(self.fraction * len(order))) - 1]],
        )

    def _owners(self) -> dict[int, int]:
        return {block["slot"]: h for h, block in self._blocks.items() if block["slot"] is not None}

    def _old_extent_at(self, slot: int, owner: dict[int, int], horizon: int) -> int | None:
        """The extent of the block in `slot` if that block is evictable and the extent old
        (stamp at most `horizon`); None for a free slot, a pool edge or any other block."""
        block = self._blocks[owner[slot]] if slot in owner else None
        if block is None or block["state"] != "committed" or block["pins"]:
            return None
        extent = block["extent"]
        return extent if self._extent_stamps[extent] <= horizon else None

    def _walk_inputs(
        self,
    ) -> tuple[dict[int, list[tuple[int, int]]], int, dict[int, int], set[int], int] | None:
        """What a walk over the slots starts from (sweep, window): the old extents' evictable
        blocks, the horizon, slot -> hash, the free slots and the step's stores; None when no
        block is evictable."""
        members, order, horizon = self._old_extents()
        if not order:
            return None
        return members, horizon, self._owners(), set(self._free), self._need()

    def _victims(self) -> list[int]:
        members, order, horizon = self._old_extents()
        if not order:
            return []
        owner = self._owners()
        need = self._need()
        free = set(self._free)
        best: tuple[int, list[int]] = (0, [])
        for index, seed in enumerate(order[: self.seeds]):
            if index and self._extent_stamps[seed] > horizon:
                break
            length, victims = self._grow(seed, need, members, horizon, owner, free)
            if length > best[0]:
                best = (length, victims)
            if length >= need:
                break
        return best[1]

    def _grow(
        self,
        seed: int,
        need: int,
        members: dict[int, list[tuple[int, int]]],
        horizon: int,
        owner: dict[int, int],
        free: set[int],
    ) -> tuple[int, list[int]]:
        """The blocks evicted growing a free run from extent seed, and the run's length."""
        first = sorted(members[seed])
        victims = [h for _, h in first]
        open_slots = free | {slot for slot, _ in first}

        def run_around(slot: int) -> tuple[int, int]:
            start = end = slot
            while start - 1 in open_slots:
                start -= 1
            while end + 1 in open_slots:
                end += 1
            return start, end + 1

        start, end = max(
            (run_around(slot) for slot, _ in first), key=lambda run: (run[1] - run[0], -run[0])
        )
        taken = {seed}
        while end - start < need:
            sides = []
            for slot in (start - 1, end):
                extent = self._old_extent_at(slot, owner, horizon)
                if extent is not None and extent not in taken:
                    sides.append((self._extent_stamps[extent], extent))
            if not sides:
                break
            _, extent = min(sides)
            taken.add(extent)
            more = sorted(members[extent])
            victims += [h for _, h in more]
            open_slots |= {slot for slot, _ in more}
            start, end = run_around(start)
        return end - start, victims


class ExtentSweep(ExtentGrow):
    """ "sweep:F[:S]": a cursor walks the slots upwards from where the last eviction's run began
    (a run does not wrap: at slot 0 a new one begins). A free slot extends the current run; a slot
    whose block is evictable and whose extent is old (the oldest F, as for grow) evicts that
    extent's evictable blocks, by slot, and extends the run; any other slot ends the run, the next
    beginning after it. The walk stops once the run holds the step's stores or the blocks evicted
    number S times those (S = 1 by default); what it evicted before a run ended stays free."""

    slack = 1.0
    _cursor = 0

    def _victims(self) -> list[int]:
        if (walk := self._walk_inputs()) is None:
            return []
        members, horizon, owner, free, need = walk
        victims: list[int] = []
        gone: set[int] = set()
        run_start, run = self._cursor, 0
        slot = self._cursor
        for _ in range(self._num_slots):
            if slot == 0:
                run_start, run = 0, 0
            extent = self._old_extent_at(slot, owner, horizon)
            if extent in members:  # not evicted by this walk yet
                more = sorted(members.pop(extent))
                victims += [h for _, h in more]
                gone |= {s for s, _ in more}
            if slot in free or slot in gone:
                run += 1
            else:
                run_start, run = (slot + 1) % self._num_slots, 0
            if run >= need or len(victims) >= self.slack * need:
                break
            slot = (slot + 1) % self._num_slots
        self._cursor = run_start
        return victims


class ExtentWindow(ExtentGrow):
    """ "window:F": a cursor (where the last eviction's window began) and, from it upwards, the
    first window of consecutive slots, each free or holding an evictable block of an old extent
    (the oldest F, as for grow), that holds at least one such block and the step's stores: its
    extents' evictable blocks are evicted (extent by extent in window order, each by slot) and
    the cursor moves to its first slot. Shorter windows are passed over, not evicted; a window
    does not wrap (at slot 0 a new one begins). After a whole turn without one, the longest window
    seen, the first among equals. "window_age:F": old as for grow_age."""

    _cursor = 0

    def _victims(self) -> list[int]:
        if (walk := self._walk_inputs()) is None:
            return []
        members, horizon, owner, free, need = walk
        best: tuple[int, int, list[int]] = (0, 0, [])  # length, first slot, extents
        start, extents = self._cursor, []
        slot = self._cursor
        for _ in range(self._num_slots + 1):
            if slot == 0:
                start, extents = 0, []
            extent = self._old_extent_at(slot, owner, horizon)
            if slot in free:
                pass
            elif extent is not None:
                if not extents or extents[-1] != extent:
                    extents.append(extent)
            else:
                start, extents = slot + 1, []
            length = slot + 1 - start
            if extents and length > best[0]:
                best = (length, start, list(extents))
            if extents and length >= need:
                break
            slot = (slot + 1) % self._num_slots
        _, self._cursor, extents = best
        victims = []
        for extent in dict.fromkeys(extents):
            victims += [h for _, h in sorted(members[extent])]
        return victims


# --rules names of the rules that take "name:F[:P]" (P: grow_seed's K, sweep's S).
_FRACTION_RULES: dict[str, tuple[type[ExtentGrow], dict[str, Any]]] = {
    "grow": (ExtentGrow, {}),
    "grow_rest": (ExtentGrow, {"rest": True}),
    "grow_age": (ExtentGrow, {"by_age": True}),
    "grow_seed": (ExtentGrow, {"seeds": 16}),
    "sweep": (ExtentSweep, {}),
    "sweep_age": (ExtentSweep, {"by_age": True}),
    "window": (ExtentWindow, {}),
    "window_age": (ExtentWindow, {"by_age": True}),
}


def engine_class(rule: str) -> type[ref.Engine]:
    """The engine for a --rules entry: "lru", "extent_old:X", "extent_lru" (the reference), or
    one of the rules of _FRACTION_RULES, "name:F" (grow_seed:F:K, sweep:F:S)."""
    name, _, rest = rule.partition(":")
    if name == "extent_lru" and not rest:
        return ref.Engine
    if name == "lru" and not rest:
        return BlockLru
    if name == "extent_old":
        try:
            horizon = float(rest or ExtentOld.fraction)
        except ValueError:
            raise SystemExit(f"--rules: {rule!r}: expected extent_old:X with X a number") from None
        return type(f"ExtentOld{horizon}", (ExtentOld,), {"fraction": horizon})
    if name in _FRACTION_RULES:
        base, attrs = _FRACTION_RULES[name]
        fraction, _, extra = rest.partition(":")
        try:
            attrs = {**attrs, "fraction": float(fraction or base.fraction)}
            if extra and name == "grow_seed":
                attrs["seeds"] = int(extra)
            elif extra and base is ExtentSweep:
                attrs["slack"] = float(extra)
            elif extra:
                raise ValueError(extra)
        except ValueError:
            raise SystemExit(f"--rules: {rule!r}: expected {name}:F with F a number") from None
        return type(f"{base.__name__}_{rule}", (base,), attrs)
    known = ", ".join(f"{name}:F" for name in _FRACTION_RULES)
    raise SystemExit(f"--rules: expected lru, extent_old[:X], extent_lru, {known}; got {rule!r}")


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
    known = "lru, extent_old:X, extent_lru, " + ", ".join(f"{name}:F" for name in _FRACTION_RULES)
    parser.add_argument("--rules", nargs="+", default=rules, help=known)
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
