"""The parity gate: replay each manifest cell's trace through the Python reference and through the
engine of every built wheel, each in an interpreter of that wheel's Python version; every returned
byte and every event must be identical.

One driver runs both implementations through the same API (engine/offload/SPEC.md §7), so what
differs is only the implementation. The replay runs in a child process per wheel
(release/scripts/parity_replay.py: standard library, numpy, the reference and the wheel): the
interpreter is one named with `--python` that reports a version the wheel serves, else this one,
else one found on PATH or under pyenv; a wheel without one is "not run: no Python 3.10 on this
runner", and the gate then never passes. numpy comes from that interpreter when it imports one;
else the gpu-runner group's pin (pyproject.toml) is installed once into a private site cached
per Python and numpy version (`release.util.private_site.numpy_for`, pip with a clean
environment and PIP_CONFIG_FILE=/dev/null): from the package index, or with `--no-index
--find-links $ACTIVEKV_WHEELHOUSE` (a folder of wheels) on a runner without network.

This process writes the traces (out/parity/traces/<cell>.jsonl), then per wheel runs
`python -m release.scripts.parity_replay --site S --device D --report R --trace T ...` with
PYTHONPATH = the checkout (and the numpy site) and reads R: the child's Python and numpy
versions and, per cell, its first difference or null. One evidence record names every wheel's
digest, with each wheel's figures under `figures.wheels`; the verdict is "fail" if any wheel
differs, else "not-run" if some wheel had no interpreter, else "pass". A difference is reported
at its first position: operation index, layer and byte offset, the first differing event, or the
first differing count of the allocator (`extent_stats`) after a step.
With device "cuda" (the gpu-parity gate) the engines run their CUDA route on this machine's GPU,
on the cells and the GPU cells.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from release import gpu
from release.catalogue import ParityCell
from release.errors import GateError
from release.evidence import Evidence, runner_identity, write_evidence
from release.gates.contract import GateInputs, Judges, Runner
from release.gates.per_wheel import PerWheel
from release.gates.trace import generate
from release.manifest import Manifest
from release.util.paths import PYPROJECT, REPO_ROOT
from release.util.pins import pinned_version
from release.util.private_site import install_private, numpy_for
from release.util.progress import Tally, console, step, tally
from release.wheelset import Wheel, WheelSet

# Counts one cell on the progress bar of the gate in hand (run_parity_gate sets it).
_cell_replayed: ContextVar[Callable[[], None]] = ContextVar("cell_replayed", default=lambda: None)


@contextmanager
def _counting_on(bar: Tally) -> Iterator[None]:
    """Each cell a child reports replayed meanwhile is counted on `bar` (its total: the cells
    of every wheel)."""
    token = _cell_replayed.set(bar.advance)
    try:
        yield
    finally:
        _cell_replayed.reset(token)


def _chosen_cells(manifest: Manifest, cells: Sequence[str], device: str) -> list[ParityCell]:
    gate = manifest.gates.get("parity")
    if gate is None or not gate.cells:
        raise GateError(f"{manifest.path}: gates.parity.cells: expected parity cells")
    declared = list(gate.cells) + (list(gate.gpu_cells or ()) if device == "cuda" else [])
    unknown = sorted(set(cells) - {c.name for c in declared})
    if unknown:
        raise GateError(f"--cell: expected cells of {manifest.path} gates.parity; got {unknown}")
    return [c for c in declared if not cells or c.name in cells]


def _numpy_version() -> str:
    """The numpy a child interpreter without one gets: the pin of pyproject's gpu-runner group."""
    version = pinned_version("gpu-runner", "numpy")
    if version is None:
        raise GateError(f"{PYPROJECT}: dependency-groups.gpu-runner: expected numpy==X.Y.Z "
                        "(the parity replay's numpy)")  # fmt: skip
    return version


def _replay_wheel(
    wheel: Wheel, traces: list[Path], workdir: Path, *, device: str, python: Path,
    cache_dir: Path, plant: Sequence[str],
) -> dict[str, Any]:  # fmt: skip
    """One wheel's replay in a child of `python`; its report (the child's JSON). The progress
    bar counts each cell as the child reports it replayed."""
    site = install_private(python, wheel.path, workdir / "site")
    paths = [str(REPO_ROOT)]  # the reference and the replay script
    numpy = numpy_for(python, cache_dir, _numpy_version())
    if numpy is not None:
        paths.append(str(numpy))
    report = workdir / "report.json"
    command = [str(python), "-m", "release.scripts.parity_replay", "--site", str(site),
               "--device", device, "--report", str(report),
               *(f"--plant={fault}" for fault in plant),
               *(f"--trace={trace}" for trace in traces)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    errors = workdir / "stderr.txt"
    with errors.open("w") as stderr:
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
        returncode = _relay(child, {trace.stem for trace in traces})
    if returncode != 0 or not report.exists():
        tail = "\n".join(errors.read_text(errors="replace").strip().splitlines()[-8:])
        raise GateError(f"parity replay of {wheel.name} with {python} failed "
                        f"(exit {returncode}):\n{tail}")  # fmt: skip
    return json.loads(report.read_text())


def _relay(child: subprocess.Popen[str], cells: set[str]) -> int:
    """Prints the child's lines as they come, counting each cell it reports replayed
    ("  <cell>: bit-identical" or "  <cell>: differs: ...") on the bar; its exit status."""
    assert child.stdout is not None  # Popen(stdout=PIPE)
    with child.stdout:
        for line in child.stdout:
            console.out(line.rstrip("\n"), highlight=False)
            name, said, _ = line.strip().partition(": ")
            if said and name in cells:
                _cell_replayed.get()()
    return child.wait()


def _count(cells: list[dict[str, Any]], modes: dict[str, str], *, exact: bool) -> str:
    group = [c for c in cells if (modes[c["cell"]] == "exact") == exact]
    same = sum(c["difference"] is None for c in group)
    return f"{same} of {len(group)} bit-identical"


def _judge_wheel(
    wheel: Wheel, python: Path, traces: list[Path], judged: PerWheel, *, modes: dict[str, str],
    device: str, cache_dir: Path, plant: Sequence[str],
) -> dict[str, Any]:  # fmt: skip
    """Replays every trace on `wheel` in `python`; its figures (its problems go to `judged`)."""
    with tempfile.TemporaryDirectory(prefix="activekv-parity-") as work:
        try:
            report = _replay_wheel(wheel, traces, Path(work), device=device, python=python,
                                   cache_dir=cache_dir, plant=plant)  # fmt: skip
        except GateError as error:
            judged.found(wheel, [str(error)])
            return {"status": f"fail: {error}"}
    for cell in report["cells"]:
        cell["mode"] = modes[cell["cell"]]
        cell["verdict"] = "bit-identical" if cell["difference"] is None else "differs"
    judged.found(wheel, [f"{c['cell']}: {c['difference']}" for c in report["cells"]
                         if c["difference"]])  # fmt: skip
    return {
        "status": "pass" if all(c["difference"] is None for c in report["cells"]) else "fail",
        "interpreter": str(python), "python": report["python"], "numpy": report["numpy"],
        "cells": report["cells"],
        "exact": _count(report["cells"], modes, exact=True),
        "compressed": _count(report["cells"], modes, exact=False),
    }  # fmt: skip


def run_parity_gate(
    manifest: Manifest,
    wheels: WheelSet,
    out_dir: Path,
    *,
    cells: Sequence[str] = (),
    device: str = "cpu",
    interpreters: Sequence[Path] = (),
    cache_dir: Path | None = None,
    plant: Sequence[str] = (),
) -> Evidence:
    """Replays the manifest's cells against the engine of every wheel, each in an interpreter
    of its version; writes one evidence record naming every wheel's digest (gate "parity", or
    "gpu-parity" on the CUDA route, which names the GPU and the driver). `plant` names
    reference faults (reference/engine.py, compression.py) for the negative controls only."""
    chosen = _chosen_cells(manifest, cells, device)
    if not len(wheels):
        raise GateError("parity: expected at least one wheel to judge")
    traces_dir = out_dir / "parity" / "traces"
    traces_dir.mkdir(parents=True, exist_ok=True)
    traces = []
    for cell in chosen:
        traces.append(traces_dir / f"{cell.name}.jsonl")
        generate(cell).write(traces[-1])
    modes = {cell.name: cell.mode for cell in chosen}
    cache = cache_dir or out_dir / "parity" / "cache"
    judged = PerWheel(interpreters)
    per_wheel = judged.figures
    with tally(len(chosen) * len(wheels), "parity: cells") as bar, _counting_on(bar):
        for index, wheel in enumerate(wheels, 1):
            bar.describe(wheel.name)
            if (python := judged.interpreter(wheel)) is None:
                continue
            console.print(f"parity: engine of {wheel.name} ({device} route) with {python}")
            with step(f"parity: replaying {len(chosen)} cells on {wheel.name}",
                      count=(index, len(wheels))):  # fmt: skip
                per_wheel[wheel.name] = _judge_wheel(
                    wheel, python, traces, judged, modes=modes, device=device, cache_dir=cache,
                    plant=plant,
                )  # fmt: skip
    if device == "cuda":
        runner = gpu.gpu_identity()
    else:
        runner = runner_identity()
    summary = {key: "; ".join(f"{name}: {figures[key]}" for name, figures in per_wheel.items()
                              if key in figures)
               for key in ("exact", "compressed")}  # fmt: skip
    verdict, reason = judged.verdict, judged.reason
    declared = len(_chosen_cells(manifest, (), device))
    if verdict == "pass" and len(chosen) < declared:
        # Some cells passing is not the gate passing: publishing must never take it as that.
        verdict = "not-run"
        reason = (f"judged {len(chosen)} of the {declared} cells (--cell); every wheel passed "
                  "them, but the gate's verdict needs all of them")  # fmt: skip
    evidence = Evidence(
        gate="gpu-parity" if device == "cuda" else "parity", runner=runner, verdict=verdict,
        artefacts=wheels.digests, figures={"wheels": per_wheel, **summary},
        reason=reason, tools={"interpreters": ", ".join(
            f"{name}: Python {f.get('python', '-')}" for name, f in per_wheel.items())},
    )  # fmt: skip
    write_evidence(out_dir, evidence)
    return evidence


class ParityGate:
    name = "parity"
    runner: Runner = "cpu"
    judges = Judges.EVERY_WHEEL_IN_ITS_INTERPRETER
    shared_file = None
    device = "cpu"

    def run(self, inputs: GateInputs) -> Evidence:
        options = inputs.options
        return run_parity_gate(
            inputs.manifest, inputs.wheels, inputs.out_dir, cells=options.cells,
            device=self.device, interpreters=options.interpreters, cache_dir=inputs.cache_dir,
        )  # fmt: skip


GATE = ParityGate()
