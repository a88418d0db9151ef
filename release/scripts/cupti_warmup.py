"""The measured run of the GPU warm-up gate, in its own process, under a CUPTI subscriber.

Standard library only, plus the wheel under test (put on `sys.path` by `--site`; it also
allocates the engine's device KV), so it runs on a GPU machine with none of the pipeline's
dependencies and no framework. It prints nothing but progress to stderr
and writes one JSON report; `release.gates.warmup` judges the report and writes the evidence. A
separate process keeps CUDA and CUPTI state out of the pipeline and turns a native crash into a
clear error there.

Phases, in order (the monitor counts every tracked CUDA call by callback id and phase):
  warmup               monitor started, worker built: arena, streams, cuBLAS, convention probe
  probe-controls       workers whose probe must refuse (both conventions match / neither does)
  warmup-steps         decode steps before seal
  -- seal --
  first-second         decode steps for the first second after seal
  steady               >= steady_steps steps one at a time, then >= steady_steps back to back
  refusals             rule-breaking requests made through the boundary (must be refused there)
  control-<kind>       a violation planted behind the boundary's back, then decode steps
  engine-staging       >= steady_steps steps of the engine's CUDA route (built during warm-up)
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

# Each negative control (a violation planted behind the boundary's back), and the rule of the
# gate (release/gates/warmup.py) its violation must break.
CONTROLS = {
    "device_allocation": "allocations",
    "compute_stream_sync": "compute_stream_syncs",
    "capture": "runtime_stream_captures",
}
CONTROL_STEPS = 16
# Workers whose convention probe must refuse to start, and requests that break a boundary rule:
# the gate judges each by name, so a report that leaves one out is not a pass.
PROBE_CONTROLS = ("both_match", "neither_matches")
BOUNDARY_REQUESTS = ("allocation", "compute_sync", "capture")
# The decode layer of the cuBLAS executor: 8 sequences x 16 slots, hidden 512, ffn 2048.
SHAPE = {"batch": 8, "slots": 16, "hidden": 512, "ffn": 2048}
OUTPUT_TOLERANCE = 1e-3


def _log(message: str) -> None:
    print(f"[warmup-gate] {message}", file=sys.stderr, flush=True)


def _probe_controls(fabric: Any, cublas: list[str]) -> dict[str, dict[str, Any]]:
    """Workers whose convention probe must refuse to start: one outcome each."""
    cases = {
        "both_match": {"executor_mixing": "none", "model_mixing": "none"},
        "neither_matches": {"executor_seed": 2, "model_seed": 1},
    }
    assert tuple(cases) == PROBE_CONTROLS
    results: dict[str, dict[str, Any]] = {}
    for name, overrides in cases.items():
        try:
            fabric.DecodeWorker(cublas, **SHAPE, **overrides)
        except fabric.ConventionProbeError as error:
            results[name] = {"refused": True, "message": str(error)}
        else:
            results[name] = {"refused": False, "message": "the worker started"}
    return results


def _boundary_refusals(fabric: Any, worker: Any) -> dict[str, dict[str, Any]]:
    """Each rule broken through the boundary must raise its error and reach no CUDA call."""
    requests = {
        "allocation": (lambda: worker.request_allocation(1 << 20), fabric.ArenaSealedError),
        "compute_sync": (worker.request_compute_sync, fabric.StreamRuleError),
        "capture": (worker.request_capture, fabric.StreamRuleError),
    }
    assert tuple(requests) == BOUNDARY_REQUESTS
    results: dict[str, dict[str, Any]] = {}
    for name, (request, error_type) in requests.items():
        try:
            request()
        except error_type as error:
            results[name] = {"refused": True, "message": str(error)}
        else:
            results[name] = {"refused": False, "message": "the request was served"}
    return results


# The engine's CUDA route under the gate: bf16, 4 layers of 16 tokens x 8 heads x 128 (32 KiB of
# K and V per block per layer); each step loads the blocks the step before stored and stores as
# many new ones, 64 each way.
STAGING = {"layers": 4, "tokens": 16, "heads": 8, "head_dim": 128, "blocks": 64, "slots": 512}


class EngineStaging:
    """The engine's CUDA route, built during warm-up (pinned pool, streams, events, and the device
    KV, which the wheel allocates itself: no torch) so that the steps after seal allocate
    nothing."""

    def __init__(self) -> None:
        import activekv._engine as engine

        layout = engine.KvBlockLayout(STAGING["layers"], STAGING["tokens"], STAGING["heads"],
                                      STAGING["head_dim"], engine.KvDtype.bf16)  # fmt: skip
        blocks = STAGING["blocks"]
        slot = engine.stored_block_bytes(layout, "exact")
        self.engine = engine.Engine(layout, "exact", STAGING["slots"] * slot, 4, blocks,
                                    2 * blocks, device="cuda")  # fmt: skip
        # Random words in the blocks stored each step; loads land in the other half, so after the
        # run each loaded block must equal the block it was stored from.
        self.kv = engine.DeviceKvCache(layout, 2 * blocks)
        source = random.Random(7)
        for layer in range(STAGING["layers"]):
            self.kv.upload(layer, source.randbytes(self.kv.layer_bytes))
        self.engine.register_kv_caches(self.kv.layers)
        self.stored: list[int] = []
        self.next_hash = 1
        self.status = "ready"
        # Request-shaped loads: the previous step's chain (one extent of slots) read back as its
        # first half, its last quarter, then its third quarter; the first half into device
        # blocks in order (a run the CUDA route copies directly), the rest into shuffled ones
        # (runs it stages and scatters). Entry k loads chain block picks[k] into targets[k].
        half, quarter = blocks // 2, blocks // 4
        self.picks = [*range(half), *range(half + quarter, blocks), *range(half, half + quarter)]
        self.targets = list(range(blocks))
        tail = self.targets[half:]
        random.Random(3).shuffle(tail)
        self.targets[half:] = tail

    def run(self, steps: int) -> dict[str, Any]:
        if self.status != "ready":
            return {"status": self.status, "steps": 0}
        blocks = STAGING["blocks"]
        loaded = 0
        mark = time.perf_counter()
        for _ in range(steps):
            if self.stored:
                self.engine.plan_load([self.stored[i] for i in self.picks], self.targets)
            fresh = list(range(self.next_hash, self.next_hash + blocks))
            self.next_hash += blocks
            self.engine.plan_store(fresh, list(range(blocks, 2 * blocks)))
            self.engine.build_step()
            self.engine.start_load()
            for layer in range(STAGING["layers"]):
                self.engine.wait_for_layer_load(layer)
                self.engine.save_kv_layer(layer)
            self.engine.wait_for_save()
            events = self.engine.events()
            loaded += sum(1 for kind, _ in events if kind == "loaded")
            self.stored = fresh
        seconds = time.perf_counter() - mark
        problems = []
        if loaded != (steps - 1) * blocks:
            problems.append(f"{loaded} blocks loaded; expected {(steps - 1) * blocks}")
        if self.engine.quarantined_regions:
            problems.append(f"{self.engine.quarantined_regions} regions quarantined")
        return {
            "status": "fail: " + "; ".join(problems) if problems else "pass",
            "steps": steps,
            "blocks_loaded": loaded,
            "mean_us_per_step": 1e6 * seconds / steps,
        }

    def verify(self, result: dict[str, Any]) -> dict[str, Any]:
        """After the judged phase: every loaded block holds the bytes it was stored with. A layer
        is [2, 2 * blocks, T, H, D] words: in each of its K and V planes, device block
        targets[k] (loaded) must equal device block blocks + picks[k] (stored)."""
        if result["status"] != "pass":
            return result
        wrong = []
        blocks = STAGING["blocks"]
        for layer in range(STAGING["layers"]):
            words = self.kv.download(layer)
            plane = len(words) // 2
            size = plane // (2 * blocks)  # one block of one plane
            pairs = list(zip(self.targets, self.picks, strict=True))
            at = [(p + t * size, p + (blocks + i) * size) for p in (0, plane) for t, i in pairs]
            if any(words[a : a + size] != words[b : b + size] for a, b in at):
                wrong.append(layer)
        if wrong:
            result["status"] = f"fail: loaded blocks differ from the stored ones in layers {wrong}"
        result["bytes_verified"] = not wrong
        return result


def run(
    site: Path,
    cupti: list[str],
    cublas: list[str],
    warmup_steps: int,
    steady_steps: int,
    report_path: Path,
) -> dict[str, Any]:
    """Runs every phase and writes the report while the worker and the monitor still live."""
    sys.path.insert(0, str(site))
    import activekv._fabric as fabric

    report: dict[str, Any] = {"fabric_module": fabric.__file__, "build_info": fabric.build_info(),
                              "python": platform.python_version()}  # fmt: skip
    phases: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    monitor = fabric.CuptiMonitor(cupti, "warmup")
    report["cupti"] = {
        "library": monitor.library_path,
        "version": monitor.cupti_version,
        "tracked_callbacks": len(monitor.tracked()),
    }
    _log(f"CUPTI {monitor.cupti_version} from {monitor.library_path}")
    worker = fabric.DecodeWorker(cublas, **SHAPE)
    monitor.watch_streams(worker.runtime_streams)
    report["executor"] = worker.executor
    report["convention"] = worker.convention
    report["probe"] = worker.probe
    _log(f"{worker.executor['name']}: convention {worker.convention}")
    phases["warmup"] = {"seconds": time.perf_counter() - started, "steps": worker.steps}

    monitor.set_phase("probe-controls")
    mark = time.perf_counter()
    report["probe_controls"] = _probe_controls(fabric, cublas)
    phases["probe-controls"] = {"seconds": time.perf_counter() - mark, "steps": 0}

    monitor.set_phase("warmup-steps")
    mark = time.perf_counter()
    worker.run_latency(warmup_steps)
    phases["warmup-steps"] = {"seconds": time.perf_counter() - mark, "steps": warmup_steps}
    monitor.set_phase("warmup")  # the engine's pool, streams and device KV belong to warm-up
    staging = EngineStaging()
    report["warmup_seconds"] = time.perf_counter() - started
    worker.seal()

    monitor.set_phase("first-second")
    mark = time.perf_counter()
    first_second_steps = 0
    while time.perf_counter() - mark < 1.0:
        first_second_steps += worker.run_latency(10)["steps"]
    phases["first-second"] = {"seconds": time.perf_counter() - mark, "steps": first_second_steps}

    monitor.set_phase("steady")
    mark = time.perf_counter()
    latency = worker.run_latency(steady_steps)
    pipelined = worker.run_pipelined(steady_steps)
    phases["steady"] = {"seconds": time.perf_counter() - mark, "steps": 2 * steady_steps}
    report["timings"] = {"latency": latency, "pipelined": pipelined}
    report["output_max_error"] = worker.verify_last_output()
    report["output_tolerance"] = OUTPUT_TOLERANCE
    _log(f"steady: median {latency['median_us']:.1f} us per step, "
         f"{pipelined['mean_us']:.1f} us back to back")  # fmt: skip

    _log("refusals through the boundary")
    monitor.set_phase("refusals")
    report["boundary_refusals"] = _boundary_refusals(fabric, worker)
    phases["refusals"] = {"seconds": 0.0, "steps": 0}

    report["planted"] = {}
    for kind in CONTROLS:
        _log(f"negative control: planted {kind}")
        monitor.set_phase(f"control-{kind}")
        mark = time.perf_counter()
        report["planted"][kind] = worker.plant_violation(kind)
        worker.run_latency(CONTROL_STEPS)
        phases[f"control-{kind}"] = {"seconds": time.perf_counter() - mark, "steps": CONTROL_STEPS}

    monitor.set_phase("engine-staging")
    mark = time.perf_counter()
    staged = staging.run(steady_steps)
    phases["engine-staging"] = {"seconds": time.perf_counter() - mark, "steps": steady_steps}
    monitor.set_phase("engine-verify")  # copies the device KV back to compare; not a steady phase
    report["engine_staging"] = staging.verify(staged)
    report["arena"] = worker.arena
    report["refusal_counts"] = worker.refusals  # after the capture control's refused enqueue
    report["phases"] = phases
    report["counts"] = monitor.counts()
    report["total_steps"] = worker.steps
    report_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    _log(f"report written; {worker.steps} decode steps in all")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--site", type=Path, required=True, help="where the wheel is installed")
    parser.add_argument("--cupti", action="append", default=[], help="libcupti candidate")
    parser.add_argument("--cublas", action="append", default=[], help="libcublas candidate")
    parser.add_argument("--warmup-steps", type=int, required=True)
    parser.add_argument("--steady-steps", type=int, required=True)
    parser.add_argument("--report", type=Path, required=True, help="JSON report to write")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a native crash prints where Python was
    run(args.site, args.cupti, args.cublas, args.warmup_steps, args.steady_steps, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
