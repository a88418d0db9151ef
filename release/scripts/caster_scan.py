"""Lists the nanobind signature of every function and method of native modules, as JSON.

Run by the casters gate (release/gates/casters.py) with the interpreter a wheel serves, as a script:
``python -I -S caster_scan.py --report REPORT --site SITE MODULE...``. ``-S`` keeps the
interpreter's own site-packages off the path, so a regular ``activekv`` package installed there
cannot stand in for the wheel's namespace package. It imports each module from SITE (the installed
wheel) and, once every module is scanned, writes REPORT (atomically; never stdout, which an
imported module may write to)::

    {"flags": {"isolated": 1, "no_site": 1},
     "modules": [{"name": ..., "file": module.__file__,
                  "entries": [{"name": qualified name, "signatures": [...]}, ...]}, ...]}

Standard library only.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any


def _signatures(obj: object) -> list[str] | None:
    overloads = getattr(obj, "__nb_signature__", None)
    if not isinstance(overloads, tuple):
        return None
    return [str(overload[0]) for overload in overloads]


def scan(module: Any) -> list[dict[str, Any]]:
    """Each bound callable of ``module``: functions, methods, properties, nested classes."""
    found: list[dict[str, Any]] = []
    seen: set[int] = set()

    def visit(name: str, obj: object) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, property):
            for accessor in (obj.fget, obj.fset):
                if accessor is not None:
                    visit(name, accessor)
            return
        signatures = _signatures(obj)
        if signatures is not None:
            found.append({"name": name, "signatures": signatures})
        if isinstance(obj, type) and obj.__module__ == module.__name__:
            for attribute, member in vars(obj).items():
                visit(f"{name}.{attribute}", member)

    for attribute, obj in vars(module).items():
        visit(f"{module.__name__}.{attribute}", obj)
    return found


def scan_module(name: str) -> dict[str, Any]:
    """One module's record: where it was imported from, and its bound callables."""
    module = importlib.import_module(name)
    return {"name": name, "file": getattr(module, "__file__", None), "entries": scan(module)}


def write_report(report: Path, result: dict[str, Any]) -> None:
    """Writes `result` to `report` whole or not at all (a partial file, then a rename)."""
    partial = report.with_name(report.name + ".partial")
    partial.write_text(json.dumps(result), encoding="utf-8")
    os.replace(partial, report)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--site", type=Path, required=True)
    parser.add_argument("modules", nargs="*")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.site))
    modules = [scan_module(name) for name in args.modules]
    flags = {"isolated": sys.flags.isolated, "no_site": sys.flags.no_site}
    write_report(args.report, {"flags": flags, "modules": modules})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
