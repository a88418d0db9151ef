"""What a gate's verdict depends on, as the inputs of its reuse key (docs/reuse.md): a verdict
found before is taken again only when every one of these is the same.

* the judged files: each wheel (name, sha256, the Python it is for and those it serves); for a
  gate not known to read the wheels alone, also the sdist and every file git hands on from the
  checkout;
* the gate's code: its module and every first-party module that imports, at any depth, and whole
  the programs run by path (``release/scripts/``, ``reference/``, ``shims/``);
* the manifest: its gate's table and every other one a gate may read (``[release]`` but its
  channels, ``[build]``, ``[payload]``), never ``[ci]``, ``[sign]`` or ``[publish]``;
* the tools: this interpreter and every distribution installed beside it, each interpreter the
  gate may judge a wheel in (or find vLLM in), asked what it is and holds, the variables that
  change what they do, ``pyproject.toml`` (the pins a gate installs), the runner and its GPU;
* the gate's command-line options and the folders it is given.

The reproducible gate is never reused: it is the build, run twice, whose inputs are the
toolchain of this machine.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from release import catalogue
from release.evidence import runner_identity
from release.gates.contract import GateInputs
from release.util import tool_facts
from release.util.digests import sha256_file
from release.util.interpreters import find_interpreter, interpreter_for
from release.util.paths import PYPROJECT
from release.util.sources import checkout_digest, folder_sources, module_sources

NEVER_REUSED = frozenset({"reproducible"})
# Gates whose verdict reads, of the files, the wheels alone (not the sdist, not the checkout but
# its code); any other gate's key holds the sdist and the whole checkout too.
WHEELS_ONLY = frozenset({"policy", "casters", "parity", "gpu-parity", "warmup", "served-path"})
# Tables of [gates] a gate reads besides its own: the GPU parity gate replays parity's cells.
ALSO_READS = {"gpu-parity": ("parity",)}
# How a gate is run, whichever gate it is.
_RUNNER_MODULES = ("release.gates.registry", "release.gates.contract")


def _manifest(inputs: GateInputs, name: str) -> dict[str, Any]:
    manifest = inputs.manifest
    release = manifest.release.model_dump(mode="json", exclude={"channels", "default_channel"})
    # Each table dumped by its own model (the dict's declared type would dump only `runner`).
    read = [table for table in (name, *ALSO_READS.get(name, ())) if table in manifest.gates]
    tables = {table: manifest.gates[table].model_dump(mode="json") for table in read}
    return {
        "path": str(manifest.path),  # gates name it in their reasons
        "schema_version": manifest.schema_version,
        "release": release,
        "build": manifest.build.model_dump(mode="json"),
        "payload": manifest.payload.model_dump(mode="json"),
        "gates": tables,
    }


def _interpreters(inputs: GateInputs) -> list[dict[str, Any]]:
    """Every interpreter the gate may judge a wheel in: the one chosen for the Pythons each wheel
    serves, and one of the wheel's own version; vLLM's, where it is named (--vllm-python,
    $ACTIVEKV_VLLM_PYTHON; else it is this one)."""
    options = inputs.options
    named = os.environ.get("ACTIVEKV_VLLM_PYTHON", "").split(os.pathsep)
    paths: list[Path | None] = [*options.vllm_pythons, *(Path(p) for p in named if p)]
    for wheel in inputs.wheels:
        paths.append(interpreter_for(wheel.serves, options.interpreters))
        paths.append(find_interpreter(wheel.python))
    return tool_facts.interpreters(paths)


def gate_key_inputs(name: str, inputs: GateInputs) -> dict[str, Any] | None:
    """Everything `name`'s verdict on `inputs` depends on (module docstring); None for a gate
    that is never reused. A GateError (a --python that does not run) passes through, as the gate
    would raise it."""
    if name in NEVER_REUSED or name not in catalogue.GATES:
        return None
    wheels = [{"name": w.name, "sha256": w.sha256, "python": w.python, "serves": list(w.serves)}
              for w in sorted(inputs.wheels, key=lambda w: w.name)]  # fmt: skip
    files: dict[str, Any] = {"wheels": wheels}
    if name not in WHEELS_ONLY:
        sdist = inputs.wheels.sdist
        files["sdist"] = None if sdist is None else {
            "name": sdist.name, "sha256": sdist.sha256, "epoch": sdist.epoch}  # fmt: skip
        files["checkout"] = checkout_digest(inputs.source_dir)
    options = {field: value if not isinstance(value, tuple) else list(value)
               for field, value in dataclasses.asdict(inputs.options).items()}  # fmt: skip
    return {
        "gate": name,
        "files": files,
        "code": {
            **module_sources([catalogue.GATES[name].module, *_RUNNER_MODULES]),
            **folder_sources(),
        },
        "manifest": _manifest(inputs, name),
        "tools": {
            "running": tool_facts.running_interpreter(),
            "interpreters": _interpreters(inputs),
            "environment": tool_facts.environment(),
            "pyproject": sha256_file(PYPROJECT),
        },
        "runner": {**runner_identity(), "gpu": inputs.gpu},
        "options": options,
        "folders": {
            "out": str(inputs.out_dir),
            "source": str(inputs.source_dir),
            "cache": str(inputs.cache_dir),
        },
    }
